"""Filesystem semantics (plain async Python) and the thin pyfuse3 adapter."""
