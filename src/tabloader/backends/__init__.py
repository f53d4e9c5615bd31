"""Array backends: where chunks are read to and where batches live.

A backend reads an epoch's chunks into row-major 2-D blocks (`Backend.read_chunks`)
and names the array namespace (``xp``: ``take``, ``concatenate``, ``empty``) that the
shared batching code in `tabloader.batches` runs with. Everything else (planning,
the shuffled delivery order, batch cutting) is common to all backends, so the same
seed gives the same batches everywhere. The protocol is `tabloader.stages.Backend`,
beside the `ReadRequest` the stages hand it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabloader.stages import Backend, ReadRequest

if TYPE_CHECKING:
    from tabloader.device import Device

__all__ = ["Backend", "ReadRequest", "get_backend"]


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
