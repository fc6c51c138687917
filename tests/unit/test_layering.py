"""The dependency direction of docs/DEVELOPMENT.md, enforced by walking the imports of src/.

`LAYERS` is the one table: the package's modules and subpackages ("units"), lowest layer
first. A unit may import units of lower layers only, never one of its own layer or above, so
the units of a layer are independent of each other. Every module of src must belong to a unit
of the table: a new top-level module fails here until it is given a place.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "blobmount"

LAYERS: tuple[tuple[str, ...], ...] = (
    # leaves: know nothing of blobmount
    ("errors", "units", "_version", "logs", "unixsock", "runstate", "readiness", "cgroups"),
    # what the daemon may use: memory, and CPUs (WORKER_PROCESSES=auto), read from the cgroup
    ("memory_limit", "cpu_limit"),
    # a mapped file of zeros, and claim files: the state and the work a mount's processes share
    ("shared_file", "claims"),
    ("mounttable",),
    # small helpers over the leaves
    ("source", "progress", "mountpoint", "fusectl"),
    ("datastores",),  # the datastores file, read by storage/azure_auth, the CLI and the API
    ("storage",),  # the StorageClient interface, its implementations and wrappers
    ("cachedir", "namespace", "snapshots"),  # snapshots: a dataset recorded, and served
    ("blocks", "download_mode", "multiproc"),  # multiproc: tables a mount's processes share
    ("wholefile",),
    ("fs", "hints", "process_figures"),  # process_figures: one process's requests and CPU
    ("snapshot",),  # the typed stats snapshot of a live mount
    ("stats", "process_stats"),  # process_stats: a multi-process mount's figures, summed
    # Settings: only the composition layer and what stands above it may see it
    ("settings",),
    ("compose", "metrics", "launch", "fuse_processes"),
    ("daemon", "warm", "api"),
    ("daemon_processes",),  # a mount served by several processes, built on daemon's parts
    ("cli",),
    # entry points and what ships for trying blobmount: nothing imports them
    ("__main__", "__init__", "testing"),
)
LAYER_OF = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}

# third-party modules confined to the modules that adapt them
CONFINED = {
    "pyfuse3": {
        *("fs/fuse_ops.py", "daemon.py", "fuse_processes.py", "daemon_processes.py"),
        "fs/wakeup.py",  # wakes a blocked read of the device: it hooks pyfuse3's wait
    },
    "azure": {
        *("storage/azure.py", "storage/azure_auth.py", "storage/rest_auth.py"),
        "storage/azure_put.py",  # the one write: a snapshot, through the SDK's blob client
        "testing/azurite.py",
    },
    # the storage client's HTTP: the SDK uses aiohttp underneath, blobmount itself does not
    "aiohttp": set(),
    "httptools": {"storage/http1.py"},
    "asyncio": {
        *("storage/_aio_bridge.py", "storage/azure.py", "storage/azure_auth.py"),
        "storage/rest_auth.py",
    },
}

#: what an import inside a function must say on its line or the line above (see LAZY_MARK)
LAZY_MARK = "lazy:"


def _unit(rel: str) -> str:
    return rel.split("/")[0].removesuffix(".py")


def _units_named(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The units of blobmount that one import statement loads."""
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    elif node.level or not node.module:
        return set()  # relative imports are not used in src
    elif node.module == "blobmount":
        # `from blobmount import x`: a submodule if there is one, else the package root
        return {
            alias.name
            if (SRC / alias.name).is_dir() or (SRC / f"{alias.name}.py").exists()
            else "__init__"
            for alias in node.names
        }
    else:
        modules = [node.module]
    return {m.split(".")[1] for m in modules if m.startswith("blobmount.")}


def _third_party(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names}
    return {node.module} if node.module and not node.level else set()


def _sources() -> list[tuple[str, ast.Module, list[str]]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        out.append(
            (path.relative_to(SRC).as_posix(), ast.parse(text, str(path)), text.splitlines())
        )
    return out


SOURCES = _sources()


def _source_id(value: object) -> str:
    """A test's id is its file's path: the same in every pytest-xdist worker (an AST's repr
    holds its address, which differs)."""
    return value if isinstance(value, str) else ""


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_every_module_of_src_has_a_layer():
    missing = sorted({_unit(rel) for rel, _, _ in SOURCES} - set(LAYER_OF))
    assert not missing, f"give these a place in LAYERS: {missing}"
    stale = sorted(set(LAYER_OF) - {_unit(rel) for rel, _, _ in SOURCES})
    assert not stale, f"LAYERS names units that no longer exist: {stale}"


@pytest.mark.parametrize(("rel", "tree"), [(r, t) for r, t, _ in SOURCES], ids=_source_id)
def test_imports_point_down_the_layers(rel, tree):
    own = _unit(rel)
    for node in _imports(tree):
        for unit in _units_named(node) - {own}:
            assert unit in LAYER_OF, f"{rel}:{node.lineno} imports unknown unit {unit}"
            assert LAYER_OF[unit] < LAYER_OF[own], (
                f"{rel}:{node.lineno} imports blobmount.{unit}, which is not below {own} "
                f"(layer {LAYER_OF[unit]} against {LAYER_OF[own]})"
            )


@pytest.mark.parametrize(("rel", "tree"), [(r, t) for r, t, _ in SOURCES], ids=_source_id)
def test_third_party_adapters_stay_confined(rel, tree):
    names = set().union(*(_third_party(n) for n in _imports(tree)))
    for module, places in CONFINED.items():
        if any(n == module or n.startswith(module + ".") for n in names):
            allowed = any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in places)
            assert allowed, f"{rel} imports {module}; only {sorted(places)} may"


def _function_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            found += [n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found


def _says_why(lines: list[str], lineno: int) -> bool:
    """True if the import at `lineno` (1-based), or a comment right above it or above the run of
    imports it belongs to, carries the lazy: mark."""
    index = lineno - 1
    if LAZY_MARK in lines[index]:
        return True
    index -= 1
    while index >= 0:
        stripped = lines[index].strip()
        if LAZY_MARK in stripped and stripped.startswith("#"):
            return True
        if not stripped.startswith(("#", "from ", "import ")) and stripped != "":
            return False
        index -= 1
    return False


@pytest.mark.parametrize(("rel", "tree", "lines"), SOURCES, ids=_source_id)
def test_imports_inside_functions_say_why(rel, tree, lines):
    unexplained = [
        f"{rel}:{node.lineno}"
        for node in _function_imports(tree)
        if not _says_why(lines, node.lineno)
    ]
    assert not unexplained, (
        f"imports inside functions need a '# {LAZY_MARK} <reason>' comment (a real cycle or a "
        f"heavy import deferred), or belong at the top of the module: {unexplained}"
    )


CODE_MAP = SRC.parents[1] / "docs" / "DEVELOPMENT.md"


def _mapped_modules() -> list[str]:
    """The modules named in the first column of DEVELOPMENT.md's code map tables, in order."""
    text = CODE_MAP.read_text()
    section = text[text.index("## Map of the code") : text.index("## Tests")]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.split("`")[1] for row in rows]


def _needs_a_line(rel: str, tree: ast.Module) -> bool:
    # a subpackage's __init__ that only documents the package is covered by its modules
    if rel.endswith("/__init__.py"):
        return any(isinstance(n, ast.FunctionDef | ast.ClassDef) for n in tree.body)
    return True


def test_the_code_map_lists_every_module_in_layer_order():
    mapped = _mapped_modules()
    modules = {rel for rel, tree, _ in SOURCES if _needs_a_line(rel, tree)}
    assert not modules - set(mapped), (
        f"add to DEVELOPMENT.md's map: {sorted(modules - set(mapped))}"
    )
    assert not set(mapped) - {rel for rel, _, _ in SOURCES}, "the map names missing modules"
    depths = [LAYER_OF[_unit(rel)] for rel in mapped]
    out_of_order = [
        rel for rel, d, before in zip(mapped[1:], depths[1:], depths, strict=False) if d < before
    ]
    assert not out_of_order, f"listed after a higher layer: {out_of_order}"


def test_the_layer_check_catches_an_upward_import(tmp_path):
    # the check itself can fail: storage importing the daemon is refused
    tree = ast.parse("from blobmount.daemon import serve\n")
    with pytest.raises(AssertionError, match="not below storage"):
        test_imports_point_down_the_layers("storage/memory.py", tree)
    sibling = ast.parse("from blobmount.namespace.names import segment_problem\n")
    with pytest.raises(AssertionError, match="not below cachedir"):
        test_imports_point_down_the_layers("cachedir/layout.py", sibling)
    source = "def f():\n    import json\n"
    with pytest.raises(AssertionError, match="lazy:"):
        test_imports_inside_functions_say_why("x.py", ast.parse(source), source.splitlines())


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
