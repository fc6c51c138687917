"""The blocked-read wakeup timer: a read that blocks after wait_readable returns gets EINTR.

Each scenario runs in a child process of its own (signal handlers, a POSIX timer and the
pyfuse3.trio facade are process state), killed with its whole process group if it overruns.
Reads are made by C through ctypes: Python's os.read retries EINTR itself. `PyDLL` keeps the GIL
during the call, as pyfuse3's read of /dev/fuse does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from blobmount.fs import wakeup

SRC = Path(wakeup.__file__).resolve().parents[2]

PRELUDE = """
import ctypes, errno, json, os, signal, sys, threading, time
signal.alarm(10)  # a backstop: the default SIGALRM action ends the process
from blobmount.fs import wakeup

def _lib(cls):
    lib = cls(None, use_errno=True)
    lib.read.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.read.restype = ctypes.c_ssize_t
    return lib

HOLDS_GIL = _lib(ctypes.PyDLL)   # like pyfuse3's fuse_session_receive_buf
FREES_GIL = _lib(ctypes.CDLL)    # lets another thread run while blocked

def c_read(fd, lib=HOLDS_GIL):
    buf = ctypes.create_string_buffer(1)
    ctypes.set_errno(0)
    start = time.monotonic()
    n = lib.read(fd, buf, 1)
    err = ctypes.get_errno() if n < 0 else 0
    return {"n": n, "errno": err, "elapsed": time.monotonic() - start}

def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def report(**result):
    print(json.dumps(result), flush=True)
"""


def _env() -> dict[str, str]:
    return dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    )


def run_scenario(body: str, timeout: float = 8.0) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,  # its own process group: a forked grandchild is killed too
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"scenario hung for {timeout} s\nstdout: {out}\nstderr: {err}")
    assert proc.returncode == 0, f"status {proc.returncode}\nstdout: {out}\nstderr: {err}"
    return json.loads(out.strip().splitlines()[-1])


def test_armed_timer_interrupts_a_blocked_read():
    result = run_scenario("""
        r, w = os.pipe()
        wakeup.enable_blocked_read_wakeup(period_s=0.005)
        wakeup._arm()
        read = c_read(r)
        report(read=read, wakeups=wakeup.wakeups())
    """)
    assert result["read"]["n"] == -1
    assert result["read"]["errno"] == 4  # EINTR
    assert result["read"]["elapsed"] < 1.0
    assert result["wakeups"] >= 1


def test_exit_with_the_timer_armed_keeps_the_exit_status():
    script = PRELUDE + textwrap.dedent("""
        wakeup.enable_blocked_read_wakeup(period_s=0.001)
        wakeup._arm()
        busy(0.01)
        sys.exit(3)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=8
    )
    assert proc.returncode == 3, proc.stderr  # not -SIGNAL


@pytest.mark.parametrize("one_shot", [False, True], ids=["repeating", "one-shot-misses"])
def test_read_that_starts_after_the_first_signal(one_shot):
    """Held up past the first signal before reading (preemption, GC): the repeating timer still
    frees the read. The one-shot variant shows the bug this guards against: its only signal hit
    the busy loop, and the read waited for the data a writer process sends after 0.5 s."""
    result = run_scenario(f"""
        r, w = os.pipe()
        writer = os.fork()
        if writer == 0:
            time.sleep(0.5)
            os.write(w, b"x")
            os._exit(0)
        period = 0.005
        wakeup.enable_blocked_read_wakeup(period_s=period)
        if {one_shot}:
            wakeup._state.arm_spec = wakeup._spec(period, 0)
        wakeup._arm()
        busy(2.5 * period)
        before = wakeup.wakeups()
        read = c_read(r)
        os.kill(writer, signal.SIGKILL)
        os.waitpid(writer, 0)
        report(before=before, read=read)
    """)
    assert result["before"] >= 1  # the first signal fired before the read began
    if one_shot:
        assert result["read"]["n"] == 1
        assert result["read"]["elapsed"] > 0.3
    else:
        assert result["read"]["n"] == -1
        assert result["read"]["errno"] == 4
        assert result["read"]["elapsed"] < 0.3


def test_timer_stops_by_itself_after_repeat_for_s():
    result = run_scenario("""
        wakeup.enable_blocked_read_wakeup(period_s=0.002, repeat_for_s=0.04)
        wakeup._arm()
        time.sleep(0.2)
        first = wakeup.wakeups()
        time.sleep(0.2)
        report(first=first, later=wakeup.wakeups(), armed=wakeup.armed())
    """)
    assert result["first"] == result["later"]
    assert 20 <= result["later"] <= 21  # repeat_for_s / period_s, and maybe one in flight
    assert result["armed"] is False


def test_disarmed_timer_leaves_the_read_alone():
    result = run_scenario("""
        r, w = os.pipe()
        wakeup.enable_blocked_read_wakeup(period_s=0.005)
        wakeup._arm()
        wakeup.disarm()
        writer = threading.Timer(0.3, os.write, (w, b"x"))
        writer.start()
        read = c_read(r, FREES_GIL)
        writer.join()
        report(read=read, wakeups=wakeup.wakeups(), armed=wakeup.armed())
    """)
    assert result["read"]["n"] == 1
    assert result["read"]["elapsed"] > 0.25
    assert result["wakeups"] == 0
    assert result["armed"] is False


def test_facade_replaces_only_wait_readable():
    result = run_scenario("""
        import pyfuse3, trio, trio.testing
        wakeup.enable_blocked_read_wakeup(period_s=0.005)
        facade = pyfuse3.trio
        checks = {
            "wait_readable_replaced": facade.lowlevel.wait_readable
            is not trio.lowlevel.wait_readable,
            "lock": facade.Lock is trio.Lock,
            "closed": facade.ClosedResourceError is trio.ClosedResourceError,
            "current_task": facade.lowlevel.current_task is trio.lowlevel.current_task,
        }
        seen = {}

        async def main():
            r, w = os.pipe()
            wakeup._arm()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(facade.lowlevel.wait_readable, r)
                await trio.testing.wait_all_tasks_blocked()
                seen["armed_while_waiting"] = wakeup.armed()  # entering the wait disarms
                os.write(w, b"x")
            seen["armed_after_wait"] = wakeup.armed()
            await trio.sleep(0.03)
            seen["wakeups_not_disarmed"] = wakeup.wakeups()
            wakeup.disarm()

        trio.run(main)
        report(checks=checks, seen=seen, enabled=wakeup.is_enabled())
    """)
    assert all(result["checks"].values()), result["checks"]
    assert result["seen"]["armed_while_waiting"] is False
    assert result["seen"]["armed_after_wait"] is True
    assert result["seen"]["wakeups_not_disarmed"] >= 1
    assert result["enabled"] is True


def test_enable_is_idempotent_and_per_process():
    result = run_scenario("""
        import pyfuse3
        wakeup.enable_blocked_read_wakeup()
        state, facade = wakeup._state, pyfuse3.trio
        wakeup.enable_blocked_read_wakeup()
        again = {"same_state": wakeup._state is state, "same_facade": pyfuse3.trio is facade}

        out_r, out_w = os.pipe()
        child = os.fork()
        if child == 0:
            signal.alarm(5)  # alarms are not inherited
            before = {"enabled": wakeup.is_enabled(), "armed": wakeup.armed()}
            wakeup.enable_blocked_read_wakeup(period_s=0.005)
            r, w = os.pipe()
            wakeup._arm()
            read = c_read(r)
            data = {"before": before, "enabled": wakeup.is_enabled(), "read": read,
                    "same_facade": pyfuse3.trio is facade}
            os.write(out_w, json.dumps(data).encode())
            os._exit(0)
        os.close(out_w)
        deadline = time.monotonic() + 5
        while os.waitpid(child, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                break
            time.sleep(0.01)
        child_result = json.loads(os.read(out_r, 65536) or b"null")
        report(again=again, child=child_result, parent_enabled=wakeup.is_enabled())
    """)
    assert result["again"] == {"same_state": True, "same_facade": True}
    child = result["child"]
    assert child is not None, "the forked child did not report"
    assert child["before"] == {"enabled": False, "armed": False}
    assert child["enabled"] is True
    assert child["same_facade"] is True
    assert child["read"]["n"] == -1
    assert child["read"]["errno"] == 4
    assert result["parent_enabled"] is True


def test_bad_arguments_and_threads_are_refused_before_anything_changes():
    # run here: both refusals come before any timer, handler or facade is installed
    with pytest.raises(ValueError, match="period_s"):
        wakeup.enable_blocked_read_wakeup(period_s=0)
    with pytest.raises(ValueError, match="period_s"):
        wakeup.enable_blocked_read_wakeup(period_s=0.01, repeat_for_s=0.001)
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            wakeup.enable_blocked_read_wakeup()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert isinstance(errors[0], RuntimeError)
    assert "main thread" in str(errors[0])
    assert not wakeup.is_enabled()
    assert signal.getsignal(wakeup.SIGNAL) is not wakeup._on_signal
