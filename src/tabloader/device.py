"""The device batches live on, resolved once: the core loader decides, adapters read it.

A loader given ``device=None`` picks the GPU when the GPU backend can run and the CPU
otherwise; ``"cuda"`` without an index means the current CUDA device of the calling
thread (as ``torch.device("cuda")`` does). That decision is made here, once, when the
[`Loader`][tabloader.Loader] is built, and kept as [`Loader.device`][tabloader.Loader.device]. The
PyTorch and Keras adapters take the device from their loader and never decide again, so the tensors
they build always sit where the loader's arrays are.

Examples:
    >>> resolve_device("cpu"), str(resolve_device("cpu"))
    (Device(kind='cpu', index=0), 'cpu')
    >>> parse_device("cuda:1"), parse_device(0), parse_device("gpu")
    (('cuda', 1), ('cuda', 0), ('cuda', None))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from tabloader import _deps
from tabloader.errors import InvalidArgumentError

__all__ = [
    "DEVICE_ENV",
    "Device",
    "default_device_spec",
    "parse_device",
    "resolve_device",
    "split_backend",
]

DEVICE_ENV = "TABLOADER_DEVICE"
"""Environment variable naming the device used when a loader is given none."""

_SPEC_HELP = "'cpu', 'cuda', 'cuda:N' or an int N"


@dataclass(frozen=True)
class Device:
    """A resolved device: the CPU, or one CUDA GPU by index.

    ``str(device)`` is ``"cpu"`` or ``"cuda:N"``, which ``torch.device`` and
    ``tabloader.Loader(device=...)`` both accept.
    """

    kind: Literal["cpu", "cuda"]
    index: int = 0

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def __str__(self) -> str:
        return f"cuda:{self.index}" if self.is_cuda else "cpu"


def parse_device(spec: object) -> tuple[str, int | None]:
    """Normalise a device spec to ``("cpu", 0)`` or ``("cuda", index or None)``.

    Accepts ``"cpu"``, ``"cuda"``, ``"gpu"``, ``"cuda:N"``, an int ``N``, a
    `Device`, or anything with ``type`` and ``index`` attributes (a
    ``torch.device``). ``None`` for the index means "the current CUDA device".
    """
    if isinstance(spec, Device):
        return spec.kind, spec.index
    kind_attr, index_attr = getattr(spec, "type", None), getattr(spec, "index", None)
    if isinstance(kind_attr, str) and not isinstance(spec, str):  # torch.device
        spec = kind_attr if index_attr is None else f"{kind_attr}:{index_attr}"
    if isinstance(spec, bool):
        raise InvalidArgumentError(f"device must be {_SPEC_HELP}, got {spec!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise InvalidArgumentError(f"a device index must be >= 0, got {spec}")
        return "cuda", spec
    if isinstance(spec, str):
        kind, _, index = spec.strip().lower().partition(":")
        if kind == "cpu" and not index:
            return "cpu", 0
        if kind in ("cuda", "gpu"):
            if not index:
                return "cuda", None
            if index.isdigit():
                return "cuda", int(index)
    raise InvalidArgumentError(f"device must be {_SPEC_HELP}, got {spec!r}")


def default_device_spec() -> str:
    """The device a loader uses when given none, as a spec.

    ``$TABLOADER_DEVICE`` when set (``cpu``, ``cuda``, ``cuda:N``); otherwise ``"cuda"``
    when the GPU backend can run (cudf and cupy import and a GPU is visible), else
    ``"cpu"``. Looking for cudf costs nothing when it is not installed.
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
    return "cuda" if _deps.gpu_usable() else "cpu"


def resolve_device(spec: Any = None) -> Device:
    """The `Device` a spec names, with ``None`` and a bare ``"cuda"`` made concrete.

    ``None`` is `default_device_spec`; a CUDA spec without an index is the calling
    thread's current CUDA device (the one ``torch.cuda.set_device(local_rank)`` chose).
    A CUDA device is checked to exist (this imports cupy and cudf).
    """
    if spec is None:
        spec = default_device_spec()
    kind, index = parse_device(spec)
    if kind == "cpu":
        return Device("cpu", 0)
    _, _, found = _deps.import_gpu(index)
    return Device("cuda", found)


def split_backend(device: Any, backend: str | None) -> tuple[Any, int | Literal[False] | None]:
    """``(what the core loader reads on, the CUDA index host batches are staged to)``.

    ``backend=None`` lets ``device`` decide and stages nothing (``False``); ``"gpu"``
    reads with the GPU backend (on ``device``, default ``"cuda"``); ``"cpu"`` reads in
    host memory whatever ``device`` is, and a CUDA ``device`` becomes the staging target
    (its index, None for the current device): for an adapter on a GPU machine without
    cudf.

    Examples:
        >>> split_backend("cuda:1", "cpu"), split_backend(None, "gpu"), split_backend(0, None)
        (('cpu', 1), ('cuda', False), (0, False))
    """
    if backend not in (None, "cpu", "gpu"):
        raise InvalidArgumentError(f"backend must be None, 'cpu' or 'gpu', got {backend!r}")
    kind, index = parse_device(device) if device is not None else (None, None)
    if backend == "gpu" and kind == "cpu":
        raise InvalidArgumentError(
            f"backend='gpu' reads on the GPU and needs a CUDA device, got device={device!r}. "
            "Use backend='cpu', or pass device='cuda'"
        )
    if backend == "cpu":
        return "cpu", index if kind == "cuda" else False
    return ("cuda" if backend == "gpu" and device is None else device), False
