"""Host batches staged to a GPU: PyTorch's tensors copied through pinned memory on a side
stream, for ``backend="cpu"`` with a CUDA device (a GPU machine without cudf).

`staging_target` is the GPU the batches go to; `CudaStager` sends each batch from the
loader's background thread (`copy_to_pinned`, then a copy to the GPU that does not
block) and hands it to the training thread once its stream may use it, so the copy
overlaps the compute already queued. PyTorch is imported when a stager is made.

Examples:
    >>> import torch
    >>> copy_to_pinned(torch.arange(4), empty=torch.empty).tolist()  # (no GPU here)
    [0, 1, 2, 3]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from tabloader import _deps
from tabloader.errors import InvalidArgumentError

__all__ = ["CudaStager", "copy_to_pinned", "staging_target"]


def _torch() -> Any:
    return _deps.require("torch", what="this")


def staging_target(device: object, index: int | None) -> Any:
    """The ``torch.device`` host batches are copied to: ``backend="cpu"`` with a CUDA
    ``device``, whose CUDA ``index`` `tabloader.device.split_backend` found (None: the
    current device)."""
    torch = _torch()
    if not torch.cuda.is_available():
        raise InvalidArgumentError(
            f"device={device!r} needs CUDA, but torch.cuda.is_available() is False here. "
            "Pass device='cpu' (or leave device out)"
        )
    return torch.device("cuda", torch.cuda.current_device() if index is None else index)


def copy_to_pinned(tensor: Any, empty: Callable[..., Any] | None = None) -> Any:
    """A copy of a host ``tensor`` in pinned memory (``empty`` makes the copy's tensor:
    by default ``torch.empty(..., pin_memory=True)``), written by numpy.

    Not ``tensor.pin_memory()``: its copy is split between PyTorch's intra-op threads,
    and, called from the loader's thread, it woke an OpenMP team of that thread's own,
    whose threads then spin waiting for the next copy; a batch cost about a hundred
    times its 264 bytes a row in CPU time (docs/torch.md). numpy copies in the calling
    thread, with the GIL let go.

    Examples:
        >>> import torch
        >>> t = torch.arange(6).reshape(3, 2)
        >>> copy_to_pinned(t, empty=torch.empty).tolist()  # (torch.empty: no GPU here)
        [[0, 1], [2, 3], [4, 5]]
    """
    if empty is None:
        empty = functools.partial(_torch().empty, pin_memory=True)
    pinned = empty(tuple(tensor.shape), dtype=tensor.dtype)
    np.copyto(pinned.numpy(), tensor.numpy())
    return pinned


class CudaStager:
    """Host batches to one GPU (a ``torch.device``): `send` (background thread) copies
    through pinned memory on a side stream; `receive` (training thread) makes the
    training stream wait for the copy, which so overlaps the compute already queued."""

    def __init__(self, device: Any) -> None:
        self.torch = _torch()
        self.device = device
        self.stream = self.torch.cuda.Stream(device)

    def send(self, batch: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
        cuda = self.torch.cuda
        with cuda.device(self.device), cuda.stream(self.stream):
            moved = tuple(
                t
                if t.device == self.device
                else copy_to_pinned(t).to(self.device, non_blocking=True)
                for t in batch
            )
            done = cuda.Event()
            done.record(self.stream)
        return moved, done

    def receive(self, staged: tuple[tuple[Any, ...], Any]) -> tuple[Any, ...]:
        tensors, done = staged
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(done)
        for t in tensors:  # side-stream memory: not reused before the training stream is done
            if t.numel():
                t.record_stream(current)
        return tensors
