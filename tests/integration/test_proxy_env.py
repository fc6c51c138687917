"""HTTP(S)_PROXY and NO_PROXY as README.md describes them: the storage requests of `blobmount
download` (the same client as a mount's) go through the proxy the variables name, and not when
NO_PROXY lists the endpoint's host. A forward proxy on 127.0.0.1 counts what passes it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.forward_proxy import ForwardProxy

pytestmark = pytest.mark.azurite

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def _download(uri: str, dest: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "blobmount", "download", uri, dest, "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def env(azurite, tmp_path) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k.upper() not in PROXY_VARS and not k.startswith(("DATASET_", "AZURE_STORAGE"))
    }
    base["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
    base["XDG_STATE_HOME"] = str(tmp_path / "state")
    return base


@pytest.mark.parametrize("name", ["HTTP_PROXY", "http_proxy"])
def test_requests_go_through_the_proxy_named(azurite, container, env, tmp_path, name):
    azurite.upload_many(container, [("a.txt", b"a" * 10), ("b/c.txt", b"c" * 20)])
    with ForwardProxy() as proxy:
        done = _download(
            f"{azurite.account_url}/{container}", str(tmp_path / "d"), {**env, name: proxy.url}
        )
        assert done.returncode == 0, done.stderr
        seen = proxy.requests
    assert (tmp_path / "d" / "b/c.txt").read_bytes() == b"c" * 20
    # the listing and both GETs, each in absolute form to Azurite
    prefix = f"GET {azurite.account_url}/{container}"
    assert sum(1 for line in seen if line.startswith(prefix) and "comp=list" in line) >= 1
    assert sum(1 for line in seen if line.startswith((f"{prefix}/a.txt", f"{prefix}/b/c.txt"))) == 2


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1", "*"])
def test_no_proxy_lists_hosts_reached_directly(azurite, container, env, tmp_path, no_proxy):
    azurite.upload_many(container, [("a.txt", b"a" * 10)])
    with ForwardProxy() as proxy:
        done = _download(
            f"{azurite.account_url}/{container}",
            str(tmp_path / "d"),
            {**env, "HTTP_PROXY": proxy.url, "NO_PROXY": no_proxy},
        )
        assert done.returncode == 0, done.stderr
        assert proxy.requests == []
    assert (tmp_path / "d" / "a.txt").read_bytes() == b"a" * 10


def test_https_proxy_is_not_used_for_an_http_endpoint(azurite, container, env, tmp_path):
    # each scheme has its own variable: Azurite's http:// endpoint ignores HTTPS_PROXY
    azurite.upload_many(container, [("a.txt", b"a")])
    with ForwardProxy() as proxy:
        done = _download(
            f"{azurite.account_url}/{container}",
            str(tmp_path / "d"),
            {**env, "HTTPS_PROXY": proxy.url},
        )
        assert done.returncode == 0, done.stderr
        assert proxy.requests == []
