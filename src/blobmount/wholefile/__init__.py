"""Whole-file open mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false)."""
