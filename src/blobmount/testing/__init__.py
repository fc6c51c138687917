"""Trying blobmount locally, with no Azure account: what ships for users.

- `python -m blobmount.testing.demo` (`make demo`): a generated sample dataset in a private
  Azurite, mounted with `blobmount mount`, listed, verified byte for byte, then unmounted.
- `blobmount.testing.azurite`: `AzuriteServer` starts the Azurite blob emulator on a free
  loopback port and fills it (`python -m blobmount.testing.azurite` runs one in the foreground
  and prints its connection string), to mount your own data the same way.
- `blobmount.testing.pattern`: the deterministic bytes the demo uploads and checks.

Nothing here is imported by the mount itself. The project's own test and benchmark harness
(fault proxy, database seeding of big datasets, mount helpers) lives in tests/helpers/.
"""
