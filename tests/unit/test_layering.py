"""The dependency direction of docs/DEVELOPMENT.md, enforced by walking the imports of src/."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "blobmount"

# package -> packages it must never import (lower layers never reach up)
FORBIDDEN = {
    "storage": (
        *("blocks", "wholefile", "namespace", "fs", "daemon", "cli", "cachedir", "download_mode"),
        *("compose", "launch", "api", "warm"),
    ),
    "cachedir": (
        *("blocks", "wholefile", "namespace", "fs", "daemon", "cli", "download_mode"),
        *("compose", "launch", "api", "warm"),
    ),
    "blocks": (
        *("namespace", "fs", "daemon", "cli", "download_mode", "wholefile"),
        *("compose", "launch", "api", "warm"),
    ),
    "namespace": ("blocks", "fs", "daemon", "cli", "download_mode", "compose", "launch", "api"),
    "fs": ("daemon", "cli", "download_mode", "compose", "launch", "api", "warm"),
    "download_mode": ("fs", "blocks", "cli", "daemon", "compose", "launch", "api", "warm"),
    "wholefile": ("fs", "daemon", "cli", "compose", "launch", "api", "warm"),
    "hints": ("fs", "daemon", "cli", "compose", "launch", "api", "warm"),
    # warm reads through a live mount (or one it starts via launch): never the stack itself
    "warm": ("daemon", "cli", "api", "compose", "fs", "blocks", "wholefile", "download_mode"),
    # the composition layer builds the parts; the process (daemon) and front ends sit above it
    "compose": ("daemon", "cli", "api", "launch", "warm"),
    # starting a daemon process needs none of the stack
    "launch": (
        *("storage", "blocks", "wholefile", "namespace", "fs", "daemon", "cli", "cachedir"),
        *("compose", "download_mode", "api", "warm"),
    ),
    # the datastores file is read by the CLI, the API and storage/azure_auth: it stays low
    "datastores": (
        *("storage", "blocks", "wholefile", "namespace", "fs", "daemon", "cli"),
        *("cachedir", "download_mode", "api", "compose", "launch"),
    ),
    # the Python API spawns the daemon as a process and downloads through compose: it never
    # imports the FUSE stack or another front end
    "api": ("storage", "blocks", "wholefile", "namespace", "fs", "daemon", "cli", "cachedir"),
    "daemon": ("cli", "api"),
}
LEAVES = ("errors", "units", "source")  # import nothing from blobmount but each other

# third-party modules confined to the modules that adapt them
CONFINED = {
    "pyfuse3": {"fs/fuse_ops.py", "daemon.py"},
    "azure": {
        *("storage/azure.py", "storage/azure_auth.py", "storage/rest_auth.py"),
        *("testing/azurite.py", "download_mode"),
    },
    "aiohttp": {"storage/azure.py"},
    "asyncio": {
        *("storage/_aio_bridge.py", "storage/azure.py", "storage/azure_auth.py"),
        "storage/rest_auth.py",
    },
}


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        yield rel, names


def _allowed(rel: str, places: set[str]) -> bool:
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in places)


@pytest.mark.parametrize(("rel", "names"), list(_modules()), ids=lambda v: str(v)[:40])
def test_imports_follow_the_layers(rel, names):
    top = rel.split("/")[0].removesuffix(".py")
    internal = {n.split(".")[1] for n in names if n.startswith("blobmount.") and "." in n}
    for banned in FORBIDDEN.get(top, ()):
        assert banned not in internal, f"{rel} imports blobmount.{banned} (a higher layer)"
    if top in LEAVES:
        assert internal <= set(LEAVES), f"{rel} is a leaf module but imports {internal}"
    for module, places in CONFINED.items():
        if any(n == module or n.startswith(module + ".") for n in names):
            assert _allowed(rel, places), f"{rel} imports {module}; only {places} may"


def test_importing_the_package_and_cli_parser_does_not_need_fuse_or_azure():
    code = (
        "import sys, blobmount, blobmount.settings, blobmount.source, blobmount.cli\n"
        "import blobmount.api, blobmount.datastores\n"
        "assert callable(blobmount.mount) and callable(blobmount.download)\n"
        "blobmount.cli._parser()\n"
        "bad = [m for m in ('pyfuse3', 'azure', 'aiohttp') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_the_package_alone_loads_nothing_heavy():
    # `import blobmount` in a notebook must not pay for pydantic, trio or the API module
    code = (
        "import sys, blobmount\n"
        "bad = [m for m in ('pyfuse3', 'azure', 'aiohttp', 'trio', 'pydantic', 'blobmount.api')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
