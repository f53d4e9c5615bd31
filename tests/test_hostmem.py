"""Host memory: pooled buffers reused once free and bounded by what is lent, and pages
mapped in ahead, without the GIL."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time

import numpy as np
import pytest

from tabloader.hostmem import BufferPool, map_in, populated_empty


def test_pooled_memory_is_reused_only_once_free():
    pool = BufferPool()
    a = pool.empty((1 << 18,), "int64")
    a[:] = 7
    b = pool.empty((1 << 18,), "int64")
    assert not np.shares_memory(a, b)  # a is still in use
    view = a[10:20]
    del a
    c = pool.empty((1 << 18,), "int64")
    assert not np.shares_memory(view, c)  # a view keeps the buffer lent
    assert (view == 7).all()
    del view, b, c
    d = pool.empty((1 << 18,), "int64")
    assert d.ctypes.data % 64 == 0
    assert pool.idle_bytes() >= 1 << 21
    del d


def test_pooled_memory_is_bounded_by_what_is_lent_at_once():
    # Requests of varying sizes, a few lent at a time (chunks and carried rows differ
    # from one chunk to the next): the pool must not keep a buffer for every size seen.
    pool = BufferPool()
    rng = np.random.default_rng(0)
    lent: list[np.ndarray] = []
    most = 0
    for _ in range(300):
        lent.append(pool.empty((int(rng.integers(1 << 17, 1 << 20)),), "int64"))
        if len(lent) > 3:
            lent.pop(0)
        most = max(most, sum(a.nbytes for a in lent))
    # A lent buffer may be up to twice its request; in practice the pool stays near
    # the memory in use (an unbounded one kept 2.7-3.9 times as much here).
    assert pool.pooled_bytes() <= 2 * most
    del lent
    assert pool.idle_bytes() == pool.pooled_bytes()


def test_pooled_memory_lets_go_of_a_buffer_it_no_longer_lends():
    # Two chunks in flight as a rule, three at a rare moment: the third chunk's buffer
    # is released once the pool has gone on without it, rather than kept for good.
    pool = BufferPool()
    chunk = (1 << 20,)  # 8 MiB of int64
    lent = [pool.empty(chunk, "int64") for _ in range(3)]
    assert pool.pooled_bytes() == 3 * (8 << 20)
    del lent[1:]
    for _ in range(40):
        lent.append(pool.empty(chunk, "int64"))
        lent.pop(0)
    assert pool.pooled_bytes() == 2 * (8 << 20)
    # Buffers in use all along are kept.
    del lent
    assert pool.idle_bytes() == pool.pooled_bytes() == 2 * (8 << 20)


def test_pooled_memory_is_mapped_in_ahead_and_page_aligned():
    pool = BufferPool()
    a = pool.empty((3, 1 << 17), "float32")
    assert a.ctypes.data % 4096 == 0 and a.flags.writeable and a.shape == (3, 1 << 17)
    a[:] = 1.5
    assert float(a.sum()) == 1.5 * 3 * (1 << 17)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(sys.platform != "linux", reason="pages mapped in by madvise(2) on Linux")
def test_a_lazily_mapped_array_takes_memory_as_each_part_is_mapped_in():
    array = populated_empty(((64 << 20) // 8,), "int64", populate=False)
    before = _resident_bytes()
    if not map_in(array[: len(array) // 2]):
        pytest.skip("this kernel does not map pages in ahead (MADV_POPULATE_WRITE)")
    grown = _resident_bytes() - before
    assert 30 << 20 <= grown <= 40 << 20  # half of the 64 MiB, not all of it
    with pytest.raises(ValueError, match="contiguous"):
        map_in(array.reshape(-1, 2)[:, 0])


@pytest.mark.skipif(sys.platform != "linux", reason="pages mapped in by madvise(2) on Linux")
def test_mapping_memory_in_lets_the_other_threads_run():
    """Mapping in a cache's gigabyte took a quarter of a second: with the GIL held
    (``mmap.madvise``), every other thread of the loader stood still meanwhile."""
    array = populated_empty(((512 << 20) // 8,), "int64", populate=False)
    stamps = np.zeros(1 << 22)  # written in place: the thread allocates nothing meanwhile
    stop = threading.Event()

    def spin() -> None:
        for i in range(len(stamps)):
            if stop.is_set():
                return
            stamps[i] = time.perf_counter()

    thread = threading.Thread(target=spin)
    thread.start()
    try:
        time.sleep(0.05)
        started = time.perf_counter()
        mapped = map_in(array)
        ended = time.perf_counter()
    finally:
        stop.set()
        thread.join()
    if not mapped:
        pytest.skip("this kernel does not map pages in ahead (MADV_POPULATE_WRITE)")
    # The other thread ran all along, not only between the switches of the GIL around
    # the call: no pause in its stamps as long as half of the call.
    during = [started, *stamps[(stamps > started) & (stamps < ended)].tolist(), ended]
    longest = max(b - a for a, b in itertools.pairwise(during))
    assert longest < (ended - started) / 2, (
        f"{longest:.3f} s without Python in {ended - started:.3f} s"
    )
