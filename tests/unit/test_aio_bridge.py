"""AsyncioBridge: results, exceptions, cancellation both ways, concurrency, shutdown."""

import asyncio
import threading

import pytest
import trio

from blobmount.storage._aio_bridge import AsyncioBridge, BridgeClosedError


@pytest.fixture
def bridge():
    with AsyncioBridge() as b:
        yield b


async def test_returns_result_computed_on_the_loop_thread(bridge):
    async def work():
        await asyncio.sleep(0)
        return threading.current_thread().name, asyncio.get_running_loop()

    thread_name, loop = await bridge.run(work)
    assert thread_name == "blobmount-asyncio"
    assert loop is bridge.loop
    assert threading.current_thread().name != thread_name


async def test_reraises_the_exception(bridge):
    class Boom(Exception):
        pass

    async def work():
        await asyncio.sleep(0)
        raise Boom("from asyncio")

    with pytest.raises(Boom, match="from asyncio"):
        await bridge.run(work)


async def test_trio_cancellation_cancels_the_asyncio_task(bridge):
    started = threading.Event()
    saw_cancel = threading.Event()
    finished = threading.Event()

    async def work():
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw_cancel.set()
            raise
        finished.set()

    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bridge.run, work)
            await trio.to_thread.run_sync(started.wait, 5)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught, "bridge.run did not return promptly on cancel"
    # the asyncio side sees CancelledError shortly after
    assert await trio.to_thread.run_sync(saw_cancel.wait, 5)
    assert not finished.is_set()


async def test_trio_thread_is_not_blocked_while_waiting(bridge):
    release = threading.Event()
    ticks = 0

    async def work():
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 5)
        return "done"

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0)
        with trio.fail_after(5):
            async with trio.open_nursery() as inner:
                inner.start_soon(bridge.run, work)
                await trio.sleep(0.05)
                release.set()
        nursery.cancel_scope.cancel()
    assert ticks > 5


async def test_many_concurrent_calls(bridge):
    in_flight = 0
    peak = 0

    async def work(i):
        nonlocal in_flight, peak
        in_flight += 1  # only the loop thread touches these
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return i * i

    results = {}

    async def one(i):
        results[i] = await bridge.run(lambda: work(i))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(500):
                nursery.start_soon(one, i)
    assert results == {i: i * i for i in range(500)}
    assert peak > 1, "calls were not run concurrently"


def test_close_while_idle_is_idempotent_and_stops_the_thread():
    b = AsyncioBridge().start()
    thread = b._thread
    assert thread is not None
    assert thread.is_alive()
    b.close()
    assert not thread.is_alive()
    assert b.loop.is_closed()
    b.close()  # again: no error
    AsyncioBridge().close()  # never started: no error


async def test_run_after_close_raises():
    b = AsyncioBridge().start()
    b.close()

    async def work():
        return 1

    with pytest.raises(BridgeClosedError):
        await b.run(work)


async def test_close_wakes_callers_still_waiting():
    b = AsyncioBridge().start()
    started = threading.Event()

    async def work():
        started.set()
        await asyncio.sleep(60)

    result = {}

    async def caller():
        try:
            await b.run(work)
        except BridgeClosedError as exc:
            result["exc"] = exc

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.to_thread.run_sync(started.wait, 5)
            await trio.to_thread.run_sync(b.close)
    assert isinstance(result.get("exc"), BridgeClosedError)


def test_run_blocking_from_a_plain_thread(bridge):
    async def work():
        await asyncio.sleep(0)
        return 42

    assert bridge.run_blocking(work) == 42


async def test_cancelling_some_calls_of_a_batch_leaves_the_others_their_results(bridge):
    # calls started in one trio step reach the loop in one batch, and their results come back
    # in batches: a cancelled one is skipped, never handed to another waiter
    gate = asyncio.Event()

    async def work(i):
        await gate.wait()
        return i

    results: dict[int, int] = {}
    scopes: dict[int, trio.CancelScope] = {}

    async def one(i):
        with trio.CancelScope() as scopes[i]:
            results[i] = await bridge.run(lambda: work(i))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(one, i)
            await trio.sleep(0.05)
            for i in range(0, 100, 3):
                scopes[i].cancel()
            await trio.sleep(0.05)
            bridge.loop.call_soon_threadsafe(gate.set)
    assert results == {i: i for i in range(100) if i % 3}


async def test_an_error_making_the_coroutine_reaches_the_caller(bridge):
    def broken():
        raise ValueError("not even a coroutine")

    with pytest.raises(ValueError, match="not even a coroutine"):
        await bridge.run(broken)
    assert await bridge.run(lambda: asyncio.sleep(0, result="still fine")) == "still fine"


def test_one_bridge_serves_several_trio_runs_at_once(bridge):
    # results go back to the run that asked (each trio run has its own mailbox)
    def run_in_thread(tag: str, out: dict[str, list[str]]) -> None:
        async def main():
            got = []
            async with trio.open_nursery() as nursery:

                async def one(i):
                    got.append(await bridge.run(lambda: asyncio.sleep(0.001, result=f"{tag}{i}")))

                for i in range(50):
                    nursery.start_soon(one, i)
            out[tag] = sorted(got)

        trio.run(main)

    out: dict[str, list[str]] = {}
    threads = [threading.Thread(target=run_in_thread, args=(tag, out)) for tag in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert out == {tag: sorted(f"{tag}{i}" for i in range(50)) for tag in "ab"}
