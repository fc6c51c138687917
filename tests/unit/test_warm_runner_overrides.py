"""`warm_uri` hands its settings overrides to the temporary mount it starts (no FUSE: the mount
is replaced by a recorder)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from blobmount.warm import runner


def test_warm_uri_passes_its_overrides_to_the_mount(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mounted: list[tuple[str, dict[str, Any]]] = []

    @contextlib.contextmanager
    def fake_mount(uri: str, **settings: Any) -> Iterator[Path]:
        mounted.append((uri, settings))
        yield tmp_path

    warmed = object()
    warmed_at: list[str] = []

    def fake_warm_mount(root: str, *args: Any, **kwargs: Any) -> object:
        warmed_at.append(root)
        return warmed

    monkeypatch.setattr(runner, "mount", fake_mount)
    monkeypatch.setattr(runner, "warm_mount", fake_warm_mount)
    uri = "https://account.blob.core.windows.net/container/prefix"
    overrides = {"snapshot": "/snaps/a.bmsnap", "log_level": "DEBUG", "anonymous": None}

    got = runner.warm_uri(uri, [], runner.Signals(), jobs=1, progress=False, overrides=overrides)

    assert got is warmed
    assert mounted == [(uri, overrides)]
    assert warmed_at == [str(tmp_path)]
