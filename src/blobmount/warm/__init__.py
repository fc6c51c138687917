"""`blobmount warm`: fill a live mount's cache with a subtree by reading it through the mount.

- `targets`: which files (PATHs checked to lie inside the mount, walked in a stable order);
- `budget`: what a file will take in the cache, and whether warming it would start pruning;
- `warmer`: the reading threads, throttled on the daemon's live stats;
- `report`: the progress bar or log lines, and the summary;
- `command`: the command line, on a mount point or on a URI mounted for the occasion.

See docs/WARM.md.
"""
