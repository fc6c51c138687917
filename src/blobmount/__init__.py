"""blobmount: a read-only FUSE mount of Azure Blob Storage for training jobs.

Importing the package must stay cheap and must not import pyfuse3 or the Azure SDK, so the
Python API and the CLI's argument parsing work on machines without FUSE.
"""

__version__ = "0.1.0"
