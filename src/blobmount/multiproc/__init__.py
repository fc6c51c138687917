"""One mount served by several processes on the same FUSE connection.

The kernel hands each request to whichever process reads it first, so inode numbers, file
handles, open versions and statistics must mean the same thing in every process. The state
that makes that so lives in files of a per-mount folder (on /dev/shm), created by the main
process before it forks and inherited by every worker (docs/developer-notes/multicore.md).
"""
