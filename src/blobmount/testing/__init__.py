"""Test and demo support that ships with the package (like trio.testing): deterministic data,
an Azurite launcher. Nothing here is imported by the mount itself."""
