"""Array backends: where chunks are read to and where batches live.

A backend reads an epoch's chunks into row-major 2-D blocks (`Backend.read_chunks`)
and names the array namespace (``xp``: ``take``, ``concatenate``, ``empty``) that the
shared batching code in `tabloader.batches` runs with. Everything else (planning,
the shuffled delivery order, batch cutting) is common to all backends, so the same
seed gives the same batches everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from tabloader.stages import ReadRequest

if TYPE_CHECKING:
    from tabloader.batches import Part
    from tabloader.device import Device

__all__ = ["Backend", "Piece", "ReadRequest", "get_backend"]

Piece = tuple[int, int, int]
"""(partition index, first row, one past the last row) of a partition slice."""


class Backend(Protocol):
    """What the loader needs from an array backend."""

    name: str
    xp: Any
    groups_columns: bool
    """Whether the ``"columns"`` layout keeps columns of one dtype in one block
    (see `Layout.build`)."""

    def scope(self) -> AbstractContextManager[None]:
        """Set up the calling thread to work with this backend's arrays (a GPU backend's
        device, stream and allocator), for as long as the block runs."""
        ...

    def read_chunks(self, request: ReadRequest) -> Iterator[list[Part]]:
        """Read the plan's chunks in turn, each block cast to its dtype.

        Unshuffled, a chunk is one part per piece, its rows in stored order (zero-copy
        where the layout allows). Shuffled, it is parts that deliver the chunk's rows in
        [`EpochPlan.batch_order`][tabloader.plan.EpochPlan.batch_order]: reordered
        up front, or gathered batch by batch through an index.

        A backend whose batches are views of their chunk (the CPU's, shuffled) holds
        at most ``chunks_ahead`` chunks besides the one being cut, waiting for an older
        chunk to be let go before laying out a new one, unless ``consumer_waiting`` says
        the consumer has run out (it keeps batches, so the old chunk stays).
        """
        ...


def get_backend(device: Device) -> Backend:
    """The backend for a resolved device (see `tabloader.device.resolve_device`).

    The CPU backend never imports cudf or cupy and never touches CUDA.
    """
    if not device.is_cuda:
        from tabloader.backends.cpu import CPUBackend

        return CPUBackend()
    from tabloader.backends.gpu import GPUBackend

    backend: Backend = GPUBackend(device.index)
    return backend
