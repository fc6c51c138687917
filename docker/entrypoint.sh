#!/bin/sh
# blobmount sidecar entrypoint: create the mount point, then become the daemon (exec), so the
# container's stop signal (SIGTERM) reaches blobmount itself, which lets reads in flight finish
# and unmounts; the unmount propagates to every container sharing the volume.
#
#   BLOBMOUNT_SOURCE_URI  what to mount. blobmount reads it from the environment, so a SAS in it
#                         never shows on a command line.
#   MOUNTPOINT            where to mount (default /mnt/share/data): a folder inside the shared,
#                         propagated volume (/mnt/share), not the volume's root.
#   arguments             passed on to `blobmount mount` (e.g. --uid 1000 --gid 1000).
# Settings and credentials are the usual variables (DATASET_MOUNT_*, AZURE_STORAGE_*).
set -eu

MOUNTPOINT="${MOUNTPOINT:-/mnt/share/data}"
if [ -z "${BLOBMOUNT_SOURCE_URI:-}" ]; then
    echo "blobmount-entrypoint: BLOBMOUNT_SOURCE_URI is not set: nothing to mount" >&2
    exit 2  # usage or configuration, as blobmount itself says it (README, exit statuses)
fi
# A mount point left behind by a killed sidecar answers ENOTCONN and mkdir fails on it;
# blobmount detects that mount and replaces it, so carry on and let it say what is wrong.
mkdir -p "$MOUNTPOINT" 2>/dev/null || echo "blobmount-entrypoint: cannot create $MOUNTPOINT" >&2
exec blobmount mount --foreground "$@" "$MOUNTPOINT"
