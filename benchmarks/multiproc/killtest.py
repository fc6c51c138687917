"""What a SIGKILL of one process of a 2-process multifs mount does to the reads in flight.

    python benchmarks/multiproc/killtest.py child  [--clone] [--delay-ms 20]
    python benchmarks/multiproc/killtest.py parent [--clone] [--pdeathsig] [--delay-ms 20]

multifs runs with 2 processes and every read() awaits --delay-ms first (a stand-in for a
fetch), so both processes hold requests when one is killed. Four reader processes read random
files of the lower half in a loop and report each file (or error) on a pipe. After 2 s one
mount process is SIGKILLed; 5 s later the test reports which readers still make progress, what
the stuck ones wait in (/proc/PID/wchan and stack), whether fresh reads of never-read files
succeed (with a timeout), and whether SIGINT or SIGKILL frees a stuck reader. `--clone`: the
child serves through its own FUSE_DEV_IOC_CLONE fd; `--pdeathsig`: the child dies with the
parent. Readers and the mount are always stopped and unmounted at the end (a reader stuck in D
state is freed by the unmount's abort).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from multiproc.mounting import Mount, is_mounted  # noqa: E402

#: a reader process: argv = root, seed, files; one line per file read ("ok"/"err")
READER = r"""
import os, random, sys, time
root, seed, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(seed)
while True:
    i = rnd.randrange(files)
    try:
        fd = os.open(f"{root}/f{i:05d}", os.O_RDONLY)
        try:
            n = len(os.read(fd, 25001))
        finally:
            os.close(fd)
        print(f"ok {i} {n}", flush=True)
    except OSError as e:
        print(f"err {i} {e.errno} {e.strerror}", flush=True)
        time.sleep(0.01)
"""
SETTLE_S = 2.0
WATCH_S = 5.0
STUCK_S = 3.0


def state(pid: int) -> str:
    """A process's state letter, wait channel and top of its kernel stack, or "gone"."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        letter = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
    try:
        lines = Path(f"/proc/{pid}/stack").read_text().splitlines()[:4]
        stack = [line.split()[-1] for line in lines if line]
    except OSError:
        stack = []
    return f"state={letter} wchan={wchan} stack={stack}"


def fresh_read(mnt: Path, name: str, timeout_s: float = 3.0) -> str:
    """Read `name` in a new process; what happened, or how it hung."""
    code = f"import os;fd=os.open({str(mnt / name)!r},os.O_RDONLY);print(len(os.read(fd,25001)))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            return f"HUNG > {timeout_s}s, not freed by SIGKILL within 3 s (pid {proc.pid})"
        return f"HUNG > {timeout_s}s (SIGKILL freed it)"
    last = err.strip().splitlines()[-1:]
    return f"rc={proc.returncode} out={out.strip()} err={last}"


@dataclass
class Progress:
    """What one reader has reported so far."""

    last_ok: float
    oks: int = 0
    errors: int = 0
    last_error: str = ""


def start_reader(
    mount: Mount, seed: int, files: int, progress: dict[int, Progress]
) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", READER, str(mount.mnt), str(seed), str(files)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # a reader killed mid-read prints a traceback
        text=True,
    )
    record = progress[proc.pid] = Progress(time.monotonic())

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("ok"):
                record.last_ok = time.monotonic()
                record.oks += 1
            else:
                record.errors += 1
                record.last_error = line.strip()

    threading.Thread(target=pump, daemon=True).start()
    return proc


def watch(
    args: argparse.Namespace,
    mount: Mount,
    readers: list[subprocess.Popen[str]],
    progress: dict[int, Progress],
) -> None:
    pids = mount.pids()
    parent, child = pids[0], pids[1]
    print(f"mount processes: parent {parent}, child {child}")
    time.sleep(SETTLE_S)
    before = {pid: (p.oks, p.errors) for pid, p in progress.items()}
    print("before the kill (files, errors):", before, mount.count_rows())
    victim = child if args.victim == "child" else parent
    killed_at = time.monotonic()
    os_kill(victim)
    print(f"SIGKILLed the {args.victim}, pid {victim}")
    at_kill = {pid: p.oks for pid, p in progress.items()}
    time.sleep(WATCH_S)
    print("mount processes 5 s later:", {pid: state(pid) for pid in pids})
    print("mounted:", is_mounted(mount.mnt))
    for reader in readers:
        p = progress[reader.pid]
        print(
            f"reader {reader.pid}: {p.oks - at_kill[reader.pid]} files since the kill, "
            f"{p.errors} errors (last: {p.last_error!r}), last file "
            f"{p.last_ok - killed_at:+.2f} s after the kill; {state(reader.pid)}"
        )
    for k in range(3):
        name = f"f{args.files // 2 + 100 + k:05d}"
        print(f"fresh read of {name} (never read before): {fresh_read(mount.mnt, name)}")
    stuck = [r for r in readers if time.monotonic() - progress[r.pid].last_ok > STUCK_S]
    print(f"stuck readers: {[r.pid for r in stuck]}")
    if stuck:
        stuck[0].send_signal(signal.SIGINT)  # a non-fatal signal: FUSE_INTERRUPT to the mount
        time.sleep(1.0)
        print(f"after SIGINT to {stuck[0].pid}: {state(stuck[0].pid)}")
        for reader in stuck:
            reader.kill()
        time.sleep(1.0)
        print("after SIGKILL to the stuck readers:", {r.pid: state(r.pid) for r in stuck})
    if args.victim == "parent":
        print("the child now:", {pid: state(pid) for pid in pids[1:]})
        print("mount entry still there:", is_mounted(mount.mnt))


def os_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("victim", choices=("child", "parent"))
    parser.add_argument("--pdeathsig", action="store_true")
    parser.add_argument("--clone", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args(argv)
    extra = ("--read-delay-ms", str(args.delay_ms))
    extra += ("--pdeathsig",) * args.pdeathsig + ("--clone",) * args.clone
    readers: list[subprocess.Popen[str]] = []
    progress: dict[int, Progress] = {}
    with Mount(f"kill-{args.victim}", 2, args.files, extra) as mount:
        try:
            # readers use the lower half of the files; fresh reads the (never cached) upper half
            readers = [start_reader(mount, k, args.files // 2, progress) for k in range(4)]
            watch(args, mount, readers, progress)
        finally:
            for reader in readers:
                reader.kill()
            mount.stop()  # before waiting: a reader stuck in the mount is freed by the abort
            for reader in readers:
                try:
                    reader.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    print(f"reader {reader.pid} still alive: {state(reader.pid)}")
    print("after stop: mounted:", is_mounted(mount.mnt))
    return 0


if __name__ == "__main__":
    sys.exit(main())
