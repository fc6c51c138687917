"""`blobmount warm`: fill a live mount's cache with a subtree by reading it through the mount.

- `targets`: which files (PATHs checked to lie inside the mount, walked in a stable order);
- `budget`: what a file will take in the cache, and whether warming it would start pruning;
- `monitor`: the daemon's live stats, and the pause while its disk writes catch up;
- `reading`: the reads through the mount, and the listing that runs ahead of them;
- `warmer`: the threads together: take the next file, check it fits, hand it to a reader;
- `report`: the progress bar or log lines, and the summary;
- `runner`: a warm-up on a live mount, or on a URI mounted for the occasion (the command line
  is `blobmount.cli.warm`).

See docs/WARM.md.
"""
