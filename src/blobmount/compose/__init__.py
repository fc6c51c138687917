"""The composition layer: the one place that turns `Settings` (and a `SourceSpec`) into parts.

- `configs`: pure functions from `Settings` to the frozen config of each part of a mount;
- `storage`: the Azure client's config, and the storage stack (the client on its asyncio
  bridge, then retries, then request counting);
- `mount`: a mount's parts (caches, blocks, filesystem, hints) opened and wired together;
- `download`: the downloader's config, and a download run over the same storage stack.

Everything below this package takes its own config and never sees `Settings`. The functions
here depend only on what they are given, so another process can build the same parts from the
same settings. The daemon and the front ends (CLI, Python API) sit above.
"""
