"""Array backends: where chunks are read to and where batches live.

A backend reads a chunk's pieces into row-major 2-D blocks (:meth:`Backend.load_chunk`)
and names the array namespace (``xp``: ``take``, ``concatenate``, ``empty``) that the
shared batching code in :mod:`tabloader.batches` runs with. Everything else (planning, permutation
indices, batch cutting) is common to all backends, so the same seed gives the same
batches everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tabloader.errors import InvalidArgumentError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from tabloader.batches import Block, Segment
    from tabloader.dataset import Dataset
    from tabloader.stats import StatsRecorder

__all__ = ["Backend", "Piece", "get_backend", "parse_device"]

Piece = tuple[int, int, int]
"""(partition index, first row, one past the last row) of a partition slice."""


class Backend(Protocol):
    """What the loader needs from an array backend."""

    name: str
    xp: Any

    def load_chunk(
        self,
        dataset: Dataset,
        pieces: Sequence[Piece],
        blocks: Sequence[Block],
        fill_null: Mapping[str, float],
        *,
        concatenate: bool,
        stats: StatsRecorder,
    ) -> list[Segment]:
        """Read the pieces and build each block, cast to the block's dtype.

        With ``concatenate`` the result is one segment holding all rows in piece order;
        otherwise one segment per piece (zero-copy where the layout allows).
        """
        ...

    def as_index(self, permutation: NDArray[np.int64]) -> Any:
        """Move a host permutation to where the chunk lives."""
        ...

    def release(self) -> None:
        """An epoch ended: give back cached memory that no batch uses any more."""
        ...


def parse_device(device: str | int | None) -> tuple[str, int]:
    """Normalise a device spec to ``("cpu", 0)`` or ``("cuda", index)``.

    >>> parse_device(None), parse_device("cpu"), parse_device("cuda:1"), parse_device(0)
    (('cpu', 0), ('cpu', 0), ('cuda', 1), ('cuda', 0))
    """
    if device is None or device == "cpu":
        return "cpu", 0
    if isinstance(device, bool):
        raise InvalidArgumentError(
            f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}"
        )
    if isinstance(device, int):
        if device < 0:
            raise InvalidArgumentError(f"a device index must be >= 0, got {device}")
        return "cuda", device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind in ("cuda", "gpu"):
            if not index:
                return "cuda", 0
            if index.isdigit():
                return "cuda", int(index)
    raise InvalidArgumentError(f"device must be 'cpu', 'cuda', 'cuda:N' or an int, got {device!r}")


def get_backend(device: str | int | None) -> Backend:
    """The backend for a device spec (see :func:`parse_device`)."""
    kind, index = parse_device(device)
    if kind == "cpu":
        from tabloader.backends.cpu import CPUBackend

        return CPUBackend()
    from tabloader.backends.gpu import GPUBackend  # type: ignore[import-not-found]

    backend: Backend = GPUBackend(index)
    return backend
