"""The benchmark harness's process-tree meter (benchmarks/scenarios/process_tree.py): the CPU
and the context switches of a process and everything under it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from scenarios.process_tree import TreeMeter, context_switches

#: a process whose second thread waits 50 times and stays alive (a thread's counts leave /proc
#: with it), then says so
WAITING_THREAD = """
import threading, time
done = threading.Event()
def waits():
    for _ in range(50):
        time.sleep(0.001)
    done.set()
    threading.Event().wait()
threading.Thread(target=waits, daemon=True).start()
done.wait()
print("ready", flush=True)
time.sleep(60)
"""

#: a process with a child that waits every 2 ms for as long as it lives
WAITING_CHILD = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.002)"])
time.sleep(60)
"""


def _main_thread_waits(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def test_context_switches_count_every_thread_and_none_for_a_gone_process():
    child = subprocess.Popen([sys.executable, "-c", WAITING_THREAD], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"ready"
        counts = context_switches(child.pid)
        assert counts is not None
        assert counts[0] >= 50 + _main_thread_waits(child.pid)  # the other thread's waits too
    finally:
        child.kill()
        child.wait()
    assert context_switches(child.pid) is None


def test_tree_meter_counts_the_switches_of_the_processes_under_the_root():
    root = subprocess.Popen([sys.executable, "-c", WAITING_CHILD], start_new_session=True)
    try:
        time.sleep(0.5)  # the child has started
        meter = TreeMeter(root.pid)
        meter.start()
        time.sleep(0.3)
        usage = meter.stop()
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
    assert usage.processes == 2
    assert usage.voluntary_switches >= 30  # about 150 waits of 2 ms in 0.3 s
