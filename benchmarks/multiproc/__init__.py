"""Tools of the issue #25 spike: one pyfuse3 mount served by several processes (route 1) and a
FUSE process handing reads to worker processes through shared memory (route 2), measured on a
bare in-memory filesystem. See README.md here and docs/developer-notes/multicore.md."""
