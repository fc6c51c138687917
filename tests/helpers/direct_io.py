"""Whether a folder's file system takes O_DIRECT (tmpfs before Linux 6.6 and some others do not)."""

from __future__ import annotations

import os
from pathlib import Path


def direct_io_supported(folder: Path) -> bool:
    probe = folder / ".o_direct_probe"
    probe.write_bytes(b"")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()
