"""Where this process's cgroup keeps a controller's files, for the limits the daemon sizes
itself by (memory_limit, cpu_limit).

`/proc/self/cgroup` names the process's group in each hierarchy: under cgroup v2 one line
"0::/path" for the unified tree, under v1 a line per hierarchy ("4:memory:/path"), mounted at
`/sys/fs/cgroup/<controller>`. A limit may be set on the group itself or above it; the group's
folder and the root's are both given (a container usually sees its own group as the root).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class CgroupFolder:
    path: Path
    #: cgroup v2 (the unified tree) rather than a v1 hierarchy
    v2: bool


def controller_folders(
    controller: str,
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    root: Path = Path("/sys/fs/cgroup"),
) -> list[CgroupFolder]:
    """The folders that may hold `controller`'s limits for this process; [] if unknown."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    found: list[CgroupFolder] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        rel = path.lstrip("/")
        if controllers == "":  # v2: "0::/path"
            found += [CgroupFolder(root / rel, True), CgroupFolder(root, True)]
        elif controller in controllers.split(","):  # v1: "4:memory:/path"
            tree = root / controller
            found += [CgroupFolder(tree / rel, False), CgroupFolder(tree, False)]
    return found
