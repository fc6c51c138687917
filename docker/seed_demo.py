"""Fill the compose demo's Azurite container with a few blobs (a one-shot job).

Runs inside the blobmount image, which already has the Azure SDK. Waits for Azurite to accept
connections, since `depends_on` only waits for its container to start.
"""

from __future__ import annotations

import os
import sys
import time

from azure.core.exceptions import ResourceExistsError, ServiceRequestError
from azure.storage.blob import BlobServiceClient

CONTAINER = os.environ.get("DEMO_CONTAINER", "demo")
BLOBS = {
    "hello.txt": b"hello from Azure Blob Storage, through blobmount\n",
    "train/shard-000.bin": bytes(range(256)) * 4096,
    "train/shard-001.bin": bytes(reversed(range(256))) * 4096,
}


def main() -> int:
    service = BlobServiceClient.from_connection_string(
        os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            service.create_container(CONTAINER)
            break
        except ResourceExistsError:
            break
        except ServiceRequestError:
            if time.monotonic() > deadline:
                print("seed: Azurite did not answer within 60 s", file=sys.stderr)
                return 1
            time.sleep(1)
    for name, data in BLOBS.items():
        service.get_blob_client(CONTAINER, name).upload_blob(data, overwrite=True)
    print(f"seed: {len(BLOBS)} blobs in container {CONTAINER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
