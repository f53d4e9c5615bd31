"""The device side of PyTorch, JAX (XLA through PJRT) and TensorFlow, on the emulated GPU.

On the emulated device the real frameworks see host memory (DLPack says so), so they
read a batch without any stream. These stand-ins read it as each framework does on a
GPU: on the stream it runs its kernels on, ordered by what it tells the producer through
DLPack, and letting go of the memory when the tensor is dropped on the host, without
waiting for its queued kernels. Each rule is cited from the framework's source:

- **PyTorch** (`TorchOnGpu`): ``torch.from_dlpack`` passes its *current* stream to
  ``__dlpack__`` (``torch/utils/dlpack.py``: ``torch.cuda.current_stream(device)``, 1 for
  the legacy default stream), and a step runs on that current stream (the legacy default
  stream unless the code runs under ``torch.cuda.stream(s)``; torch's own streams are
  created non-blocking). The imported tensor calls the DLPack deleter when it is freed
  on the host: memory torch did not allocate is not held by its caching allocator, and no
  ``record_stream`` applies to it.
- **JAX** (`XlaOnGpu`): ``jax.dlpack.from_dlpack`` passes
  ``device.get_stream_for_external_ready_events()`` to ``__dlpack__`` (``jax/_src/dlpack.py``),
  a stream of its own, not the compute stream; the buffer's definition event is recorded
  there, and an execution waits for its inputs' definition events on the compute stream.
  XLA creates its streams non-blocking (``xla/stream_executor/cuda``: ``cuStreamCreate(..,
  CU_STREAM_NON_BLOCKING)``), so nothing on the legacy default stream orders them. A
  ``jax.Array`` dropped on the host is deleted at once: ``PjRtStreamExecutorBuffer::Delete``
  calls ``Release(/*wait_for_operations_to_complete=*/false)``, which does not wait for
  usage events on the compute stream (``xla/pjrt/pjrt_stream_executor_client.cc``), and
  the DLPack deleter runs then. `marker` is a small computation queued on the compute
  stream; ``is_ready()`` says, never blocking, whether it (and so everything queued
  before it there) is done, ``block_until_ready()`` waits for it.
- **TensorFlow** (`TensorflowOnGpu`): ``tf.experimental.dlpack.from_dlpack`` takes a
  capsule, so the producer is told no stream (``__dlpack__()``: the legacy default
  stream), while TensorFlow runs its kernels on a stream of its own, made by the same
  stream executor (non-blocking). ``tf.test.experimental.sync_devices()`` waits on the
  host for its work (`sync_devices`).

``step(*tensors, seconds=...)`` queues one training step on the framework's compute
stream: a kernel taking ``seconds`` that reads every tensor given. `sleep` queues a
kernel that only takes time (``torch.cuda._sleep``), to make a consumer slower than the
loader. The emulated device refuses (``RaceError``) a step that reads a batch before it
is written, and a loader's write into memory a step still reads.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "Imported",
    "TensorflowOnGpu",
    "TorchOnGpu",
    "XlaOnGpu",
    "framework",
    "settle",
    "sleep",
]


def _cupy() -> Any:
    import cupy

    return cupy


def _order() -> Any:
    return _cupy().cuda._order


def sleep(seconds: float, stream: Any = None, device: int = 0) -> None:
    """Queue a kernel that takes ``seconds`` on ``stream`` (the legacy default stream by
    default) and does nothing else."""
    cupy = _cupy()
    with cupy.cuda.Device(device):
        stream = cupy.cuda.Stream.null if stream is None else stream
        _order().sleep(seconds, stream._key())


def settle() -> None:
    """After a test that made a race on purpose: every device's work done (the host
    waited for it), and the race found at a free, if not raised yet, forgotten; so that
    the memory the race left behind fails no later test."""
    cupy = _cupy()
    for device in range(cupy.cuda.runtime.getDeviceCount()):
        cupy.cuda.Device(device).synchronize()
    _order().forget_races()


class _Capsule:
    """A DLPack capsule, handed to numpy as the object numpy's import expects."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # the emulated device's memory is host memory


class Imported:
    """A tensor a framework imported through DLPack: it holds the producer's memory (the
    capsule's manager) until it is deleted, and no longer."""

    def __init__(self, framework: _Framework, capsule: Any) -> None:
        self.framework = framework
        self._view: np.ndarray | None = np.from_dlpack(_Capsule(capsule))
        self.shape, self.dtype = self._view.shape, self._view.dtype
        self.address = int(self._view.__array_interface__["data"][0])
        self.ready: Any = None  # the event the producer's data is ready at (XLA's)

    def devices(self) -> set[str]:
        return {f"{self.framework.kind}:{self.framework.device}"}

    def __len__(self) -> int:
        return int(self.shape[0])

    def delete(self) -> None:
        """Let go of the memory: the DLPack deleter runs now."""
        self._view = None

    @property
    def deleted(self) -> bool:
        return self._view is None


class _Framework:
    kind = ""
    stream: Any

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.steps = 0

    def _read(self, tensors: Any, key: Any, n: int) -> None:
        order = _order()
        for tensor in _flat(tensors):
            if tensor.deleted:
                raise RuntimeError(f"{self.kind}: a step read a deleted tensor")
            order.access(
                order.history_at(tensor.address), key, n, write=False, what=f"{self.kind}'s step"
            )

    def _before_step(self, tensors: Any) -> None:
        """What the framework orders its compute stream after before a step."""

    def step(self, *tensors: Any, seconds: float = 0.0) -> None:
        """One training step on the compute stream: a kernel of ``seconds`` reading
        every tensor (nested in tuples, lists and dicts)."""
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            self._before_step(tensors)
            key = self.stream._key()
            self._read(tensors, key, _order().issue(key, seconds))
        self.steps += 1

    def copy(self, tensor: Imported) -> np.ndarray:
        """A copy of ``tensor`` into memory of the framework's own, made on the compute
        stream and not waited for (``tensor.clone()``, ``jnp.array(x)``): its values, as
        they will be once the copy ran (read them after `synchronize`)."""
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            self._before_step((tensor,))
            key = self.stream._key()
            self._read((tensor,), key, _order().issue(key))
        assert tensor._view is not None
        return np.array(tensor._view, copy=True)

    def values(self, tensor: Imported) -> np.ndarray:
        """A host copy of ``tensor``, made on the compute stream and waited for (as
        ``tensor.cpu()``, ``np.asarray(jax_array)``, ``tensor.numpy()``)."""
        copied = self.copy(tensor)
        self.synchronize()
        return copied

    def synchronize(self) -> None:
        """The host waits for the compute stream's work (``torch.cuda.synchronize()``,
        ``block_until_ready``)."""
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            _order().host_wait(self.stream._key())


class TorchOnGpu(_Framework):
    """PyTorch on the emulated GPU: imports on its current stream and runs there (the
    current stream is per thread, as PyTorch's)."""

    kind = "torch"

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        self._local = threading.local()  # .current: None, the legacy default stream

    @property
    def stream(self) -> Any:  # type: ignore[override]
        current = getattr(self._local, "current", None)
        return _cupy().cuda.Stream.null if current is None else current

    @contextlib.contextmanager
    def use(self, stream: Any) -> Iterator[None]:
        """``torch.cuda.stream(stream)``: the calling thread's current stream in the block."""
        previous = getattr(self._local, "current", None)
        self._local.current = stream
        try:
            yield
        finally:
            self._local.current = previous

    def current_stream_ptr(self) -> int:
        """``torch.cuda.current_stream(device).cuda_stream`` (0 for the legacy stream)."""
        return int(self.stream.ptr)

    def from_dlpack(self, array: Any) -> Imported:
        ptr = self.current_stream_ptr()
        with _cupy().cuda.Device(self.device):
            return Imported(self, array.__dlpack__(stream=1 if ptr == 0 else ptr))


class _Marker:
    """A computation queued on XLA's compute stream (a ``jax.Array`` result)."""

    def __init__(self, event: Any) -> None:
        self.event = event

    def is_ready(self) -> bool:
        return bool(self.event.query())

    def block_until_ready(self) -> _Marker:
        self.event.synchronize()
        return self


class XlaOnGpu(_Framework):
    """JAX on the emulated GPU: XLA's non-blocking compute stream, DLPack imports ordered
    on its external-ready-events stream, and deletion without waiting."""

    kind = "xla"

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        cupy = _cupy()
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)  # the compute stream
            self.ready_stream = cupy.cuda.Stream(non_blocking=True)

    def get_stream_for_external_ready_events(self) -> int:
        return int(self.ready_stream.ptr)

    def from_dlpack(self, array: Any) -> Imported:
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            tensor = Imported(self, array.__dlpack__(stream=self.ready_stream.ptr))
            tensor.ready = self.ready_stream.record()  # the buffer's definition event
        return tensor

    def _before_step(self, tensors: Any) -> None:
        for tensor in _flat(tensors):  # an execution waits for its inputs' definitions
            if tensor.ready is not None:
                self.stream.wait_event(tensor.ready)

    def marker(self) -> _Marker:
        """A small computation queued on the compute stream now."""
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            _order().issue(self.stream._key())
            return _Marker(self.stream.record())


class TensorflowOnGpu(_Framework):
    """TensorFlow on the emulated GPU: a capsule in, no stream told, kernels on a
    non-blocking stream of its own."""

    kind = "tensorflow"

    def __init__(self, device: int = 0) -> None:
        super().__init__(device)
        cupy = _cupy()
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def from_dlpack(self, capsule: Any) -> Imported:
        if hasattr(capsule, "__dlpack__"):
            raise TypeError("tf.experimental.dlpack.from_dlpack takes a DLPack capsule")
        return Imported(self, capsule)

    def sync_devices(self) -> None:
        """``tf.test.experimental.sync_devices()``: wait for TensorFlow's queued work."""
        cupy = _cupy()
        with cupy.cuda.Device(self.device):
            self.stream.synchronize()


def framework(kind: str, device: int = 0) -> _Framework:
    """A stand-in by name: ``"torch"``, ``"xla"`` (JAX) or ``"tensorflow"``."""
    makers = {"torch": TorchOnGpu, "xla": XlaOnGpu, "jax": XlaOnGpu, "tensorflow": TensorflowOnGpu}
    return makers[kind](device)


def _flat(tensors: Any) -> Iterator[Imported]:
    if isinstance(tensors, Imported):
        yield tensors
    elif isinstance(tensors, dict):
        for value in tensors.values():
            yield from _flat(value)
    elif isinstance(tensors, (tuple, list)):
        for value in tensors:
            yield from _flat(value)
