"""Reading a mount of a synthetic:// source and checking every byte against the dataset."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from blobmount.storage.synthetic import SyntheticDataset, expected_bytes


def read_whole(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def wrong_files(root: Path, dataset: SyntheticDataset, names: list[str], readers: int) -> list[str]:
    """The files among `names` (read whole under `root` by `readers` threads at once, as a data
    loader reads them) whose bytes are not the dataset's."""
    with ThreadPoolExecutor(readers) as pool:
        contents = list(pool.map(lambda name: read_whole(root / name), names))
    return [
        name
        for name, got in zip(names, contents, strict=True)
        if got != expected_bytes(dataset, name, 0, _size(dataset, name))
    ]


def _size(dataset: SyntheticDataset, name: str) -> int:
    index = dataset.index_of(name)
    assert index is not None, f"{name} is not in the dataset"
    return dataset.size(index)
