"""Directory tree over blob names: inodes, lazy listings, attributes."""
