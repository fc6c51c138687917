"""The package's version, in a module of its own so that any layer can name it without
importing the package root (which loads the Python API)."""

__version__ = "0.2.0"
