"""The background prefetcher: bounded, exception-transparent, and never left running."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabloader.stages import Prefetcher, SplitWork, balanced_groups, map_on_threads


def test_items_arrive_in_order():
    assert list(Prefetcher(lambda: iter(range(100)), depth=3)) == list(range(100))


def test_the_producer_stays_at_most_depth_items_ahead():
    produced = []

    def items():
        for i in range(50):
            produced.append(i)
            yield i

    prefetcher = Prefetcher(items, depth=2)
    assert next(prefetcher) == 0
    time.sleep(0.3)
    # One taken and two ahead of it (for chunks: the consumer's and two more in memory).
    assert produced == [0, 1, 2]
    assert next(prefetcher) == 1
    time.sleep(0.3)
    assert produced == [0, 1, 2, 3]
    prefetcher.close()


def test_starved_is_set_while_the_consumer_waits_for_an_item():
    gate = threading.Event()

    def items():
        yield 0
        gate.wait()
        yield 1

    prefetcher = Prefetcher(items, depth=1)
    assert next(prefetcher) == 0
    assert not prefetcher.starved.is_set()
    waiter = threading.Thread(target=next, args=(prefetcher,))
    waiter.start()
    assert prefetcher.starved.wait(2)
    gate.set()
    waiter.join(2)
    assert not prefetcher.starved.is_set()
    prefetcher.close()


def test_an_exception_is_raised_in_the_consumer_after_the_items_before_it():
    def items():
        yield 1
        yield 2
        raise ValueError("bad row group in f.parquet")

    prefetcher = Prefetcher(items, depth=4)
    assert next(prefetcher) == 1
    assert next(prefetcher) == 2
    with pytest.raises(ValueError, match=r"f\.parquet"):
        next(prefetcher)
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_close_stops_a_producer_blocked_on_a_full_queue():
    prefetcher = Prefetcher(lambda: iter(range(10**9)), depth=1, name="tabloader-test")
    next(prefetcher)
    started = time.monotonic()
    prefetcher.close()
    assert not prefetcher.thread.is_alive()
    assert time.monotonic() - started < 2
    assert list(prefetcher) == []


def test_garbage_collection_stops_the_thread():
    prefetcher = Prefetcher(lambda: iter(range(10**9)), depth=1)
    thread = prefetcher.thread
    del prefetcher
    thread.join(2)
    assert not thread.is_alive()


def test_a_linked_stage_stops_when_the_stage_it_feeds_is_closed():
    downstream = threading.Event()
    upstream = Prefetcher(lambda: iter(range(10**9)), depth=1, linked=downstream)
    next(upstream)
    downstream.set()
    upstream.thread.join(2)
    assert not upstream.thread.is_alive()


def test_the_producer_generator_is_closed_when_stopped():
    closed = threading.Event()

    def items():
        try:
            while True:
                yield 1
        finally:
            closed.set()

    prefetcher = Prefetcher(items, depth=1)
    next(prefetcher)
    prefetcher.close()
    assert closed.wait(2)


# -- SplitWork: one step's independent jobs on several threads -------------------------


def test_split_work_runs_every_job_once_on_the_caller_and_the_helpers():
    ran: list[tuple[int, str]] = []
    work = SplitWork(2, name="tabloader-split-test")
    jobs = [(w, lambda w=w: ran.append((w, threading.current_thread().name))) for w in (5, 4, 3, 2)]
    work.run(jobs)
    work.close()
    assert sorted(w for w, _ in ran) == [2, 3, 4, 5]
    threads = {name for _, name in ran}
    assert threading.current_thread().name in threads
    assert {name.split("_")[0] for name in threads} - {threading.current_thread().name} == {
        "tabloader-split-test"
    }
    # Balanced by weight: 5 + 2 on one thread, 4 + 3 on the other.
    by_thread: dict[str, int] = {}
    for w, name in ran:
        by_thread[name] = by_thread.get(name, 0) + w
    assert sorted(by_thread.values()) == [7, 7]


def test_split_work_raises_a_helpers_error_once_every_job_has_ended():
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.2)
        finished.set()

    def failing() -> None:
        raise ValueError("bad column")

    work = SplitWork(2, name="tabloader-split-test")
    with pytest.raises(ValueError, match="bad column"):
        work.run([(2, slow), (1, failing)])  # the caller runs the heavier job
    assert finished.is_set()
    work.close()


def test_split_work_on_one_thread_runs_jobs_in_the_caller_and_starts_none():
    before = set(threading.enumerate())
    names = []
    work = SplitWork(1, name="tabloader-split-test")
    work.run([(1, lambda: names.append(threading.current_thread().name))] * 3)
    assert names == [threading.current_thread().name] * 3
    assert set(threading.enumerate()) == before


def test_split_work_close_ends_its_threads():
    work = SplitWork(3, name="tabloader-split-test")
    work.run([(1, lambda: time.sleep(0.01))] * 6)
    helpers = [t for t in threading.enumerate() if t.name.startswith("tabloader-split-test")]
    assert helpers
    work.close()
    assert not any(t.is_alive() for t in helpers)


@given(weights=st.lists(st.integers(0, 10**9), max_size=60), count=st.integers(1, 8))
def test_balanced_groups_use_every_job_once_and_stay_near_the_mean(weights, count):
    groups = balanced_groups(weights, count)
    assert sorted(i for g in groups for i in g) == list(range(len(weights)))
    assert all(groups) and len(groups) <= count
    if weights:
        loads = [sum(weights[i] for i in g) for g in groups]
        # Greedy, heaviest first: no group exceeds the mean by more than one job.
        assert max(loads) <= sum(weights) / len(groups) + max(weights)


@given(cores=st.integers(1, 512))
def test_every_stage_gets_at_least_one_thread_and_never_more_than_the_cores(cores):
    from tabloader.threads import Threads

    threads = Threads(cores)
    for count in (threads.layout, threads.gather, threads.fill):
        assert 1 <= count <= cores
    # On few cores every stage takes them all, as the pipeline was measured to want.
    if cores <= 4:
        assert threads.layout == threads.gather == threads.fill == cores


def test_threads_are_sized_from_the_cores_this_process_may_run_on(monkeypatch):
    import tabloader.threads
    from tabloader.threads import Threads

    monkeypatch.setattr(tabloader.threads, "usable_cores", lambda: 12)
    assert Threads.sized().cores == 12
    assert Threads.sized(3).cores == 3


@given(items=st.lists(st.integers(), max_size=40), threads=st.integers(1, 6))
def test_map_on_threads_computes_each_item_once_in_order_on_at_most_threads_threads(items, threads):
    seen: list[int] = []
    names: set[str] = set()

    def double(x: int) -> int:
        seen.append(x)
        names.add(threading.current_thread().name)
        return 2 * x

    assert map_on_threads(double, items, threads, name="t") == [2 * x for x in items]
    assert sorted(seen) == sorted(items)
    assert len(names) <= threads


def test_map_on_threads_raises_an_items_error_after_its_threads_have_ended():
    def fail_on_seven(x: int) -> int:
        if x == 7:
            raise ValueError("seven")
        time.sleep(0.001)
        return x

    before = threading.active_count()
    with pytest.raises(ValueError, match="seven"):
        map_on_threads(fail_on_seven, list(range(20)), 3, name="t")
    assert threading.active_count() == before


def test_close_drops_the_item_the_producer_was_making():
    import gc
    import weakref

    class Item:
        pass

    made: list[weakref.ref[Item]] = []
    producing = threading.Event()

    def items():
        for _ in range(5):
            producing.set()
            time.sleep(0.2)  # closed meanwhile: it is put after the queue was emptied
            item = Item()
            made.append(weakref.ref(item))
            yield item

    prefetcher = Prefetcher(items, depth=1)
    taken = next(prefetcher)
    producing.clear()
    assert producing.wait(5)
    prefetcher.close()
    gc.collect()
    assert [r() for r in made[1:]] == [None] * len(made[1:])  # nothing the stage holds
    assert made[0]() is taken
