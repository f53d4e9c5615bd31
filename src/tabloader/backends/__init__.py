"""Array backends: where chunks are read to and where batches live.

A backend reads an epoch's chunks into row-major 2-D blocks (:meth:`Backend.read_chunks`)
and names the array namespace (``xp``: ``take``, ``concatenate``, ``empty``) that the
shared batching code in :mod:`tabloader.batches` runs with. Everything else (planning,
the shuffled delivery order, batch cutting) is common to all backends, so the same
seed gives the same batches everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tabloader.errors import InvalidArgumentError

if TYPE_CHECKING:
    from tabloader.batches import Block, Part
    from tabloader.dataset import Dataset
    from tabloader.plan import EpochPlan
    from tabloader.stats import StatsRecorder

__all__ = ["DEVICE_ENV", "Backend", "Piece", "default_device", "get_backend", "parse_device"]

DEVICE_ENV = "TABLOADER_DEVICE"
"""Environment variable naming the device used when a loader is given none."""

Piece = tuple[int, int, int]
"""(partition index, first row, one past the last row) of a partition slice."""


class Backend(Protocol):
    """What the loader needs from an array backend."""

    name: str
    xp: Any

    def read_chunks(
        self,
        dataset: Dataset,
        plan: EpochPlan,
        blocks: Sequence[Block],
        fill_null: Mapping[str, float],
        *,
        stats: StatsRecorder,
    ) -> Iterator[list[Part]]:
        """Read the plan's chunks in turn, each block cast to its dtype.

        Unshuffled, a chunk is one part per piece, its rows in stored order (zero-copy
        where the layout allows). Shuffled, it is parts that deliver the chunk's rows in
        :meth:`EpochPlan.batch_order <tabloader.plan.EpochPlan.batch_order>`: reordered
        up front, or gathered batch by batch through an index.
        """
        ...


def parse_device(device: str | int | None) -> tuple[str, int]:
    """Normalise a device spec to ``("cpu", 0)`` or ``("cuda", index)``.

    A spec without an index (``"cuda"``, ``"gpu"``) normalises to index 0 here;
    :func:`get_backend` gives it the current CUDA device instead, as PyTorch does.

    Examples:
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


def default_device() -> str:
    """The device a loader uses when given none.

    ``$TABLOADER_DEVICE`` when set (``cpu``, ``cuda``, ``cuda:N``); otherwise ``"cuda"``
    when the GPU backend can run (cudf and cupy import and a GPU is visible), else
    ``"cpu"``. Looking for cudf costs nothing when it is not installed; when it is,
    cupy and cudf are imported once per process to check for a GPU.
    """
    value = os.environ.get(DEVICE_ENV, "").strip()
    if value:
        try:
            parse_device(value)
        except InvalidArgumentError:
            raise InvalidArgumentError(
                f"{DEVICE_ENV}={value!r} is not a device: set it to 'cpu', 'cuda' or 'cuda:N', "
                "or unset it"
            ) from None
        return value
    from tabloader.backends.gpu import gpu_usable

    return "cuda" if gpu_usable() else "cpu"


def get_backend(device: str | int | None) -> Backend:
    """The backend for a device spec (see :func:`parse_device` and :func:`default_device`).

    ``"cpu"`` never imports cudf or cupy and never touches CUDA. A CUDA spec without an
    index is the current CUDA device of the calling thread (the one
    ``torch.cuda.set_device(local_rank)`` selected), like ``torch.device("cuda")``.
    """
    if device is None:
        device = default_device()
    kind, index = parse_device(device)
    if kind == "cpu":
        from tabloader.backends.cpu import CPUBackend

        return CPUBackend()
    from tabloader.backends.gpu import GPUBackend

    explicit = isinstance(device, int) or ":" in str(device)
    backend: Backend = GPUBackend(index if explicit else None)
    return backend
