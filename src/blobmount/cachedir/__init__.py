"""The on-disk cache directory, shared by the block disk tier and whole-file mode: space rules
(`space`), the hashed layout with atomic fills and cross-process locks (`layout`), and the
background LRU pruner (`pruner`)."""
