"""Download mode: copy a container or prefix to local disk (issue 6)."""
