"""A fake /proc/self/mountinfo and a fake sysfs folder of per-device knobs, for the unit tests of
the kernel settings the daemon writes (read-ahead under bdi/, background requests under fusectl)."""

from __future__ import annotations

from pathlib import Path


def fake_kernel_files(
    tmp_path: Path, mountinfo: str, folder: str, knobs: dict[str, dict[str, str]]
) -> tuple[str, Path]:
    """Write `mountinfo` and, under tmp_path/`folder`, one directory per device with its knob
    files ({device: {file name: content}}). Returns (mountinfo path, the folder)."""
    info = tmp_path / "mountinfo"
    info.write_text(mountinfo)
    root = tmp_path / folder
    for device, files in knobs.items():
        (root / device).mkdir(parents=True)
        for name, content in files.items():
            (root / device / name).write_text(content)
    return str(info), root
