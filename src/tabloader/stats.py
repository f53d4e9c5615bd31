"""Loader statistics: cheap counters, always on.

Each counter is written by exactly one thread (the reader, the batcher or the consumer),
so no lock is needed; `StatsRecorder.snapshot` reads them all at once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["LoaderStats", "StatsRecorder"]


@dataclass(frozen=True)
class LoaderStats:
    """What a loader has done since it was created (all epochs, all iterators).

    Attributes:
        rows: Rows delivered to the consumer.
        batches: Batches delivered to the consumer.
        chunks: Chunks read (for epochs served from the decoded cache: batches gathered).
        bytes_read: Bytes of decoded column data read from the source.
        read_seconds: Background time spent reading and decoding partitions.
        assemble_seconds: Background time spent casting and laying out chunks.
        batch_seconds: Background time spent shuffling and cutting batches (and in
            the loader's ``transform``).
        wait_seconds: Time the consumer spent waiting for the next batch.
        consume_seconds: Time the consumer spent iterating (from asking for the first
            batch to the end of the epoch, or to leaving the loop).
        device_bytes: On a GPU, device memory in use after the last chunk was read (the
            pool's allocated bytes when tabloader set the pool up); 0 on the CPU.
        from_cache: Whether the last epoch started was served from the decoded cache
            (no file read at all).
        cache_epochs: Epochs served from the decoded cache.
        cache_bytes: Bytes of decoded rows the cache holds (0 until it is complete).
        cache_placement: Where a GPU loader serves its complete cache from: ``"device"``
            (GPU memory) or ``"pinned host"``; None on the CPU, and until it is placed.
        rows_skipped: Rows whose file was deleted or truncated during an epoch, skipped
            and replaced by repeated rows (``Dataset(on_missing="skip")``).
        threads: The CPU threads the loader's stages were sized for: its ``threads``
            option, else the cores the process may run on.

    Examples:
        >>> import pyarrow as pa, tabloader
        >>> loader = tabloader.Loader(pa.table({"x": [1.0] * 8}), conts=["x"], batch_size=4)
        >>> _ = list(loader)
        >>> loader.stats().rows, loader.stats().batches
        (8, 2)
    """

    rows: int = 0
    batches: int = 0
    chunks: int = 0
    bytes_read: int = 0
    read_seconds: float = 0.0
    assemble_seconds: float = 0.0
    batch_seconds: float = 0.0
    wait_seconds: float = 0.0
    consume_seconds: float = 0.0
    device_bytes: int = 0
    from_cache: bool = False
    cache_epochs: int = 0
    cache_bytes: int = 0
    cache_placement: str | None = None
    rows_skipped: int = 0
    threads: int = 0

    @property
    def input_bound_fraction(self) -> float:
        """Share of the consumer's time spent waiting for data (0 = never waited)."""
        return self.wait_seconds / self.consume_seconds if self.consume_seconds > 0 else 0.0

    @property
    def rows_per_second(self) -> float:
        """Rows delivered per second of consumer time."""
        return self.rows / self.consume_seconds if self.consume_seconds > 0 else 0.0

    def __str__(self) -> str:
        return (
            f"{self.rows:,} rows in {self.batches:,} batches, {self.rows_per_second:,.0f} rows/s; "
            f"read {self.read_seconds:.2f}s, assemble {self.assemble_seconds:.2f}s, "
            f"batch {self.batch_seconds:.2f}s (background); waited {self.wait_seconds:.2f}s of "
            f"{self.consume_seconds:.2f}s (input-bound {self.input_bound_fraction:.0%}); "
            f"{self.threads} threads"
        )


class StatsRecorder:
    """Mutable counterpart of [`LoaderStats`][tabloader.LoaderStats], shared by a loader's
    iterators."""

    def __init__(self) -> None:
        for f in fields(LoaderStats):
            setattr(self, f.name, f.default)

    rows: int
    batches: int
    chunks: int
    bytes_read: int
    read_seconds: float
    assemble_seconds: float
    batch_seconds: float
    wait_seconds: float
    consume_seconds: float
    device_bytes: int
    from_cache: bool
    cache_epochs: int
    cache_bytes: int
    cache_placement: str | None
    rows_skipped: int
    threads: int

    def snapshot(self) -> LoaderStats:
        return LoaderStats(**{f.name: getattr(self, f.name) for f in fields(LoaderStats)})
