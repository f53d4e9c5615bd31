"""Arrays to framework tensors, through DLPack: TensorFlow, JAX and PyTorch.

One place decides, for each framework, what the adapters (`tabloader.keras`,
`tabloader.jax`, `tabloader.torch`) need to hand it a batch:

- the dtypes it takes (`Tensors.dtypes`): JAX in its default 32-bit mode holds no
  64-bit numbers, so int64 ids are delivered as int32, checked to fit
  (`narrowed`), never wrapped around;
- how an array becomes one of its tensors without a copy (`Tensors.tensor`):
  through DLPack, from host memory or from the GPU;
- whether it can see the memory of the loader's device (`Tensors.check_device`),
  checked when the adapter is built rather than deep inside the framework later;
- how the loader learns that the framework's GPU work on a batch it let go of is done
  (`Tensors.release_fence`): each of them lets go of an imported tensor as soon as it is
  dropped on the host, while kernels that read it may still be queued, so the loader
  writes that memory again only after (`tabloader.backends.gpu_memory`);
- whether a batch must be complete on the host's word before the framework reads it
  (`Tensors.reads_unordered`): TensorFlow reads on a stream DLPack does not tell.

The Keras and JAX adapters make their batches with `BatchConverter`; the PyTorch
adapter's `TorchBatchBuilder` makes NVTabular's ``(x_cat, x_cont, y)`` from stacked
blocks, and sends host batches bound for a GPU through `tabloader.staging`.

Examples:
    >>> import numpy as np
    >>> int32 = np.dtype("int32")
    >>> narrowed({"user": np.array([3, 2**31 - 1])}, {"user": int32})["user"].dtype
    dtype('int32')
    >>> try:
    ...     narrowed({"item": np.array([7]), "user": np.array([2**31])},
    ...              {"item": int32, "user": int32})
    ... except ValueError as err:
    ...     print(str(err).split(", the dtype")[0])
    column 'user' holds 2147483648, which does not fit int32
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from tabloader import _deps
from tabloader.backends.gpu_memory import ConsumerFence, HostFence, MarkerFence, StreamFence
from tabloader.batches import host_int
from tabloader.device import Device
from tabloader.errors import InvalidArgumentError
from tabloader.hostmem import BufferPool, PooledNumpy
from tabloader.memory import ALIGN, address, aligned_columns, aligned_rows
from tabloader.staging import CudaStager

if TYPE_CHECKING:
    from tabloader.loader import Loader

__all__ = [
    "FENCE_BATCHES",
    "BatchConverter",
    "JaxTensors",
    "TensorflowTensors",
    "Tensors",
    "TorchBatchBuilder",
    "TorchTensors",
    "as_numpy_dtype",
    "core_dtypes",
    "delivered_dtypes",
    "dlpack_place",
    "narrowed",
    "tensorflow_gpu_index",
    "tensors_for",
]

Framework = Literal["tensorflow", "jax", "torch"]

_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13

FENCE_BATCHES = 4
"""Batches TensorFlow let go of that the loader keeps before waiting, once, on the host
for TensorFlow's queued work (`HostFence`): the memory held back is bounded by this many
batches."""


def dlpack_place(array: Any) -> tuple[Literal["cpu", "cuda"], int]:
    """Where DLPack says ``array``'s memory is: ``("cpu", 0)`` or ``("cuda", index)``.

    This, not the loader's device, is where a framework finds the memory: the emulated
    GPU of the test suite keeps its "device" memory on the host and says so.

    Examples:
        >>> import numpy as np
        >>> dlpack_place(np.zeros(2))
        ('cpu', 0)
    """
    kind, index = array.__dlpack_device__()
    if int(kind) in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        return "cuda", int(index)
    return "cpu", 0


def narrowed(columns: Mapping[Any, Any], dtypes: Mapping[Any, np.dtype[Any]]) -> dict[Any, Any]:
    """``columns`` (numpy or cupy arrays, keyed by column name or ``(name, part)``) cast
    to the narrower integer ``dtypes``, after checking that every value fits: a
    framework that holds no 64-bit integers (JAX's 32-bit mode) would otherwise wrap
    them around in silence.

    One verdict for all the columns crosses to the host, after the casts are issued: on
    a GPU that is the batch's one wait, which also completes the casts.
    """
    out = {key: array.astype(dtypes[key]) for key, array in columns.items()}
    checked = [key for key, array in columns.items() if len(array)]  # min() needs a value
    misfits = {key: _outside(columns[key], np.iinfo(dtypes[key])) for key in checked}
    if not misfits or not host_int(functools.reduce(operator.or_, misfits.values())):
        return out
    key = next(key for key, misfit in misfits.items() if host_int(misfit))
    array, info = columns[key], np.iinfo(dtypes[key])
    low, high = host_int(array.min()), host_int(array.max())
    name = key[0] if isinstance(key, tuple) else key
    raise InvalidArgumentError(
        f"column {name!r} holds {high if high > info.max else low}, which does not "
        f"fit {dtypes[key]}, the dtype JAX is handed in its 32-bit mode (whole "
        f"numbers from {info.min} to {info.max}): it would wrap around. Enable "
        "64-bit mode (jax.config.update('jax_enable_x64', True), or "
        "JAX_ENABLE_X64=1) and pass cat_dtype='int64', or renumber the ids"
    )


def _outside(array: Any, info: np.iinfo[Any]) -> Any:
    """Whether any of ``array`` lies outside ``info``'s range: a 0-d array, on the device
    for a cupy array (nothing crosses to the host)."""
    return (array.max() > info.max) | (array.min() < info.min)


def tensorflow_gpu_index(
    cuda_index: int, visible: list[int], logical: Mapping[int, int] | None = None
) -> str | None:
    """Why TensorFlow would not find CUDA device ``cuda_index``'s memory, or None if it does.

    TensorFlow's DLPack import names the device of CUDA memory ``"GPU:<CUDA index>"``
    (``DeviceNameFromDlContext`` in ``tensorflow/c/eager/dlpack.cc``), a *logical*
    device name: it is that CUDA device only when every GPU up to it is visible to
    TensorFlow, each as one logical device. ``visible`` lists the CUDA indices of the
    GPUs TensorFlow sees (``tf.config.get_visible_devices("GPU")``), ``logical`` how
    many logical devices each was split into (default one).

    Examples:
        >>> tensorflow_gpu_index(1, [0, 1]) is None
        True
        >>> tensorflow_gpu_index(1, [1]).split(" (")[0]
        'TensorFlow sees only GPU(s) [1]'
    """
    logical = logical or {}
    if cuda_index not in visible:
        if not visible:
            return "TensorFlow sees no GPU (tensorflow-cpu, or a TensorFlow built without CUDA)"
        return (
            f"TensorFlow does not see CUDA device {cuda_index}: it sees GPU(s) "
            f"{sorted(visible)} (tf.config.set_visible_devices)"
        )
    if logical.get(cuda_index, 1) > 1:
        parts = logical[cuda_index]
        return f"TensorFlow splits CUDA device {cuda_index} into {parts} logical devices"
    before = sum(max(logical.get(i, 1), 1) for i in visible if i < cuda_index)
    if before != cuda_index:
        return (
            f"TensorFlow sees only GPU(s) {sorted(visible)} (tf.config.set_visible_devices), "
            f"so its 'GPU:{cuda_index}' is not CUDA device {cuda_index}"
        )
    return None


class Tensors:
    """What an adapter needs to hand one framework its batches (see the module)."""

    name: Framework
    tensor_type: str
    """How the framework's tensors are named in messages."""

    def dtypes(self) -> dict[str, np.dtype[Any]]:
        """The dtypes delivered when the user chooses none: ``cat``, ``cont``, ``label``."""
        return {
            "cat": np.dtype("int64"),
            "cont": np.dtype("float32"),
            "label": np.dtype("float32"),
        }

    def holds(self, dtype: np.dtype[Any]) -> bool:
        """Whether the framework can hold arrays of ``dtype`` as they are."""
        return True

    def tensor(self, array: Any) -> Any:
        """``array`` (contiguous, 64-byte aligned, writable) as a tensor sharing its memory."""
        raise NotImplementedError

    reads_unordered = False
    """Whether the framework reads an imported batch on a stream that DLPack does not
    order after the loader's (a batch is then complete on the host's word first)."""

    def check_device(self, device: Device, place: tuple[str, int]) -> None:
        """Raise if the framework cannot find memory of ``place`` (where DLPack puts the
        memory of the loader's ``device``)."""

    def release_fence(self, device: Device) -> ConsumerFence | None:
        """How the loader learns that the framework's queued work on memory it let go of
        is done, on a GPU ``device`` (None: the loader's default, an event on the legacy
        default stream)."""
        return None


class TensorflowTensors(Tensors):
    name: Framework = "tensorflow"
    tensor_type = "tf.Tensor"
    # tf.experimental.dlpack.from_dlpack takes a capsule: the producer is told no stream
    # (the legacy default stream), and TensorFlow reads on streams of its own
    reads_unordered = True

    def __init__(self) -> None:
        self.tf = _deps.require("tensorflow", what="this")

    def tensor(self, array: Any) -> Any:
        return self.tf.experimental.dlpack.from_dlpack(array.__dlpack__())

    def check_device(self, device: Device, place: tuple[str, int]) -> None:
        if place[0] != "cuda":
            return
        tf = self.tf
        visible = [_ordinal(d.name) for d in tf.config.get_visible_devices("GPU")]
        logical = {
            _ordinal(d.name): len(tf.config.get_logical_device_configuration(d) or [])
            for d in tf.config.list_physical_devices("GPU")
        }
        why = tensorflow_gpu_index(place[1], visible, logical)
        if why is not None:
            raise InvalidArgumentError(
                f"the loader reads on {device}, but {why}: TensorFlow would not find its "
                "batches. Install TensorFlow with CUDA (pip install 'tensorflow[and-cuda]'); "
                "with one process per GPU, pick the GPU with CUDA_VISIBLE_DEVICES=<rank> and "
                "device='cuda:0' rather than tf.config.set_visible_devices; or pass "
                "device='cpu'"
            )

    def release_fence(self, device: Device) -> ConsumerFence | None:
        """The host waits for TensorFlow's queued work (``sync_devices``) once
        `FENCE_BATCHES` batches it let go of wait: its streams are its own."""
        if not device.is_cuda:
            return None
        return HostFence(self.tf.test.experimental.sync_devices, batches=FENCE_BATCHES)


class JaxTensors(Tensors):
    name: Framework = "jax"
    tensor_type = "jax.Array"

    def __init__(self) -> None:
        self.jax = _deps.require("jax", what="this")
        importlib.import_module("jax.dlpack")
        self._tokens: dict[int | None, Any] = {}  # device index -> a marker's input there

    @property
    def x64(self) -> bool:
        """Whether JAX runs in 64-bit mode (``jax_enable_x64``), read when asked."""
        return bool(self.jax.config.jax_enable_x64)

    def dtypes(self) -> dict[str, np.dtype[Any]]:
        out = super().dtypes()
        if not self.x64:
            out["cat"] = np.dtype("int32")
        return out

    def holds(self, dtype: np.dtype[Any]) -> bool:
        return self.x64 or dtype.itemsize < 8

    def tensor(self, array: Any) -> Any:
        # JAX passes a stream of its own to the producer (cupy orders it after the writes),
        # and its computations wait for that (jax/_src/dlpack.py).
        return self.jax.dlpack.from_dlpack(array)

    def release_fence(self, device: Device) -> ConsumerFence | None:
        """A marker queued on XLA's compute stream after JAX let go of a batch: JAX deletes
        an imported buffer without waiting for the computations that read it (PJRT's
        ``Delete`` does not wait for usage events on the compute stream), and XLA's
        streams are non-blocking, so nothing on the default stream orders them."""
        if not device.is_cuda:
            return None
        return MarkerFence(functools.partial(self.marker, device))

    def marker(self, device: Device) -> Any:
        """A tiny computation queued now on the JAX device of the loader's GPU: ready
        once XLA's work queued before it is done (``is_ready()`` asks without blocking)."""
        # Run now, also when called while JAX traces a function (a loader collected by
        # a garbage collection inside the user's jit): a marker traced into that
        # function would be a tracer, never ready.
        with self.jax.ensure_compile_time_eval():
            token = self._tokens.get(device.index)
            if token is None:  # its input, on the device once
                target = self._jax_device(device)
                token = self._tokens[device.index] = self.jax.device_put(
                    np.zeros(1, np.float32), target
                )
            return _jax_bump(self.jax)(token)

    def _jax_device(self, device: Device) -> Any:
        for d in self.jax.local_devices():
            if getattr(d, "platform", "") == "gpu" and (
                getattr(d, "local_hardware_id", d.id) == device.index
            ):
                return d
        return self.jax.local_devices()[0]  # the emulated GPU's memory is host memory

    def check_device(self, device: Device, place: tuple[str, int]) -> None:
        if place[0] != "cuda":
            return
        try:
            found = [
                d
                for d in self.jax.local_devices(backend="gpu")
                if getattr(d, "local_hardware_id", d.id) == place[1]
            ]
            why = "" if found else f"its GPUs are {self.jax.local_devices(backend='gpu')}"
        except RuntimeError as err:  # no GPU backend: "Unknown backend: 'gpu' requested"
            why = str(err)
        if why:
            raise InvalidArgumentError(
                f"the loader reads on {device}, but JAX has no GPU device {place[1]} here "
                f"({why}). Install JAX with CUDA (pip install 'jax[cuda13]'), check "
                "CUDA_VISIBLE_DEVICES, or pass device='cpu'"
            )


class TorchTensors(Tensors):
    name: Framework = "torch"
    tensor_type = "torch.Tensor"

    def __init__(self) -> None:
        self.torch = _deps.require("torch", what="this")

    def tensor(self, array: Any) -> Any:
        """A tensor sharing ``array``'s memory: host numpy, device arrays through DLPack.
        A read-only numpy array (Arrow's memory, which a tensor must not write) is copied.

        Examples:
            >>> block = np.arange(4, dtype=np.int64).reshape(2, 2)
            >>> TorchTensors().tensor(block).data_ptr() == block.ctypes.data
            True
        """
        if isinstance(array, np.ndarray):
            return self.torch.from_numpy(array if array.flags.writeable else array.copy())
        if hasattr(array, "__dlpack__"):
            return self.torch.from_dlpack(array)
        return self.torch.as_tensor(array)  # __cuda_array_interface__ and the like, zero-copy

    def numpy_dtype(self, value: Any, what: str) -> Any:
        """``value`` as the core takes a dtype: a ``torch.dtype`` as its numpy equivalent,
        anything else unchanged (the core checks it).

        Examples:
            >>> tensors = TorchTensors()
            >>> tensors.numpy_dtype(tensors.torch.int32, "cat_dtype")
            dtype('int32')
            >>> tensors.numpy_dtype("float16", "cont_dtype")
            'float16'
        """
        if not isinstance(value, self.torch.dtype):
            return value
        try:
            return self.torch.empty(0, dtype=value).numpy().dtype
        except TypeError:
            raise InvalidArgumentError(
                f"{what}={value} has no numpy equivalent, and batches are built from numpy or "
                "cupy arrays: pass a dtype numpy has (torch.float32, torch.float16, torch.int64, "
                "...) and convert the tensor in the model"
            ) from None

    def check_device(self, device: Device, place: tuple[str, int]) -> None:
        if place[0] != "cuda":
            return
        cuda = self.torch.cuda
        if not cuda.is_available() or place[1] >= cuda.device_count():
            raise InvalidArgumentError(
                f"the loader reads on {device}, but PyTorch sees "
                f"{cuda.device_count() if cuda.is_available() else 'no'} CUDA device(s) "
                "here. Install PyTorch with CUDA, check CUDA_VISIBLE_DEVICES, or pass "
                "device='cpu'"
            )

    def release_fence(self, device: Device) -> ConsumerFence | None:
        """An event on the legacy default stream when PyTorch lets go of a batch: its
        default stream is that stream; a step on a stream of its own
        (``torch.cuda.stream(s)``, non-blocking) makes the default stream wait for it
        before letting go (``torch.cuda.default_stream().wait_stream(s)``, docs/gpu.md)."""
        if not device.is_cuda:
            return None
        return StreamFence(importlib.import_module("cupy"), device.index)


@functools.cache
def _jax_bump(jax: Any) -> Any:
    """One jitted function for markers (compiled once): a kernel on the compute stream."""
    return jax.jit(lambda x: x + 1)


def tensors_for(framework: str) -> Tensors:
    """The `Tensors` of ``framework`` (``"tensorflow"``, ``"jax"`` or ``"torch"``)."""
    makers: dict[str, Callable[[], Tensors]] = {
        "tensorflow": TensorflowTensors,
        "jax": JaxTensors,
        "torch": TorchTensors,
    }
    if framework not in makers:
        raise InvalidArgumentError(
            f"no tensors for framework {framework!r}: use one of {', '.join(makers)}"
        )
    return makers[framework]()


def _ordinal(name: str) -> int:
    """The index at the end of a TensorFlow device name (``/physical_device:GPU:1``)."""
    return int(name.rsplit(":", 1)[-1])


# -- dtypes --------------------------------------------------------------------------------

DTYPE_KEYWORDS = {"cat": "cat_dtype", "cont": "cont_dtype", "label": "label_dtype"}


def as_numpy_dtype(value: Any, what: str) -> np.dtype[Any]:
    """A numpy dtype from a numpy or Keras dtype (``"int32"``) or a framework's
    (``tf.int64``, ``torch.float32``, ``jnp.int32``).

    Examples:
        >>> as_numpy_dtype("int32", "cat_dtype"), as_numpy_dtype(np.float32, "cont_dtype")
        (dtype('int32'), dtype('float32'))
    """
    candidates = (
        value,
        getattr(value, "as_numpy_dtype", None),  # tf.DType
        getattr(value, "name", None),
        str(value).rsplit(".", 1)[-1],  # torch.int64
    )
    for candidate in candidates:
        if candidate is None:
            continue
        try:
            return np.dtype(candidate)
        except (TypeError, ValueError):
            continue
    raise InvalidArgumentError(
        f"{what} must be a dtype ('int32', 'float32', np.int64, tf.int64, torch.float32, ...), "
        f"got {value!r}"
    )


def delivered_dtypes(tensors: Tensors, options: Mapping[str, Any]) -> dict[str, np.dtype[Any]]:
    """The dtypes of cats, conts and labels as the framework gets them: the user's
    ``cat_dtype``/``cont_dtype``/``label_dtype``, else the framework's defaults; a dtype
    the framework cannot hold raises."""
    defaults = tensors.dtypes()
    out = {}
    for kind, keyword in DTYPE_KEYWORDS.items():
        value = options.get(keyword)
        dtype = defaults[kind] if value is None else as_numpy_dtype(value, keyword)
        if not tensors.holds(dtype):
            raise InvalidArgumentError(
                f"{keyword}={dtype.name!r}: JAX holds no 64-bit numbers in its default "
                f"32-bit mode. Leave {keyword} out ({defaults[kind].name}), or enable 64-bit "
                "mode first (jax.config.update('jax_enable_x64', True), or JAX_ENABLE_X64=1)"
            )
        out[kind] = dtype
    return out


def core_dtypes(tensors: Tensors, delivered: Mapping[str, np.dtype[Any]]) -> dict[str, Any]:
    """The core loader's ``cat_dtype``/``cont_dtype``/``label_dtype`` for ``delivered``:
    ids the framework gets narrower than int64 because it holds no int64 are read as
    int64 and narrowed, checked, by `BatchConverter`."""
    out: dict[str, Any] = {DTYPE_KEYWORDS[k]: d for k, d in delivered.items()}
    cat = delivered["cat"]
    # (an id dtype that is no integer stays, for the core to refuse in its own words)
    if cat.kind in "iu" and cat != np.dtype("int64") and not tensors.holds(np.dtype("int64")):
        out["cat_dtype"] = np.dtype("int64")
    return out


# -- batches -------------------------------------------------------------------------------


class BatchConverter:
    """A batch of the core loader's arrays to the framework's tensors, in the loader's
    background thread (the adapters' ``transform`` calls it).

    Columns become tensors through DLPack as `aligned_columns`
    hands them over: shuffled columns and aligned device columns as they are, the
    others copied to 64-byte aligned memory (TensorFlow aborts on unaligned memory, JAX
    copies it, and a tensor must not write into Arrow's buffers). Ids are narrowed
    where the framework holds no int64. On a GPU, the batch's writes are ordered before
    the framework reads (DLPack's stream, or a host wait for TensorFlow), and memory the
    framework let go of is written again only after its queued work is done
    (`Tensors.release_fence`, given to the loader's memory by `set_loader`).
    """

    def __init__(self, tensors: Tensors) -> None:
        self.tensors = tensors
        self.device = Device("cpu")
        self.xp: Any = None
        self.columns: tuple[str, ...] = ()
        self.lists: tuple[str, ...] = ()
        self.vectors: tuple[str, ...] = ()
        self.groups: list[tuple[np.dtype[Any], list[str]]] = []
        self.narrow: dict[str, np.dtype[Any]] = {}

    def set_loader(
        self, loader: Loader, delivered: Mapping[str, np.dtype[Any]] | None = None
    ) -> None:
        """Take the loader's columns, dtypes and device (``delivered``: the dtypes of cats,
        conts and labels as the framework gets them, by default the loader's); raises if
        the framework cannot find memory of that device. On a GPU, the loader then waits
        for this framework before writing memory it let go of."""
        self.device = loader.device
        cuda = self.device.is_cuda
        self.xp = importlib.import_module("cupy") if cuda else PooledNumpy(BufferPool())
        with self.on_device():
            place = dlpack_place(self.xp.empty((1,), np.uint8))
        self.tensors.check_device(self.device, place)
        self.lists = loader.sparse_names
        self.vectors = tuple(loader.widths)  # [B, k] each, handed over whole
        self.columns = tuple(
            c for c in loader.columns if c not in self.lists and c not in self.vectors
        )
        groups: dict[np.dtype[Any], list[str]] = {}
        for name in self.columns:
            groups.setdefault(loader.dtypes[name], []).append(name)
        self.groups = list(groups.items())
        if delivered is not None:
            target = {
                **dict.fromkeys(loader.cats, delivered["cat"]),
                **dict.fromkeys(loader.conts, delivered["cont"]),
                **dict.fromkeys(loader.labels, delivered["label"]),
            }
            self.narrow = {n: t for n, t in target.items() if t != loader.dtypes[n]}
        fence = self.tensors.release_fence(self.device)
        if fence is not None:
            loader.backend.xp.set_consumer(fence)

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """The loader's GPU current in this thread (new threads start on GPU 0)."""
        if not self.device.is_cuda:
            yield
            return
        with self.xp.cuda.Device(self.device.index):
            yield

    def arrays(self, batch: Mapping[str, Any]) -> dict[Any, Any]:
        """The batch's arrays, aligned and narrowed: each scalar column and each vector
        column (``[B, k]``); each list column as ``name`` (padded) or ``(name, "values")``
        and ``(name, "offsets")``."""
        arrays: dict[Any, Any] = aligned_columns(batch, self.groups, self.xp)
        for name in self.vectors:
            arrays[name] = self.aligned(batch[name])
        for name in self.lists:
            value = batch[name]
            if isinstance(value, tuple):
                arrays[(name, "values")] = self.aligned(value[0])
                arrays[(name, "offsets")] = self.aligned(value[1])
            else:
                arrays[name] = self.aligned(value)
        narrow = {
            key: dtype
            for name, dtype in self.narrow.items()
            for key in (name, (name, "values"))
            if key in arrays
        }
        # Our copies, like the batch's own writes, run on the batcher's stream, which DLPack
        # orders the framework's stream after; TensorFlow's is not told, so for it they
        # complete before it reads: one wait of the host. When ids are narrowed, the
        # check's verdict is that wait, unless a copy follows it.
        complete = False
        if narrow:
            cast = narrowed({key: arrays[key] for key in narrow}, narrow)
            complete = any(len(array) for array in cast.values())
            for key, array in cast.items():
                arrays[key] = self.aligned(array)
                complete = complete and arrays[key] is array
        if self.device.is_cuda and self.tensors.reads_unordered and not complete:
            self.xp.cuda.get_current_stream().synchronize()
        return arrays

    def tensors_of(self, arrays: Mapping[Any, Any]) -> dict[Any, Any]:
        """The framework's tensors of ``arrays`` (from `arrays`), sharing their memory."""
        return {key: self.tensors.tensor(array) for key, array in arrays.items()}

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new C-contiguous array of the loader's device, starting 64-byte aligned."""
        size = int(np.prod(shape))
        return aligned_rows(self.xp, 1, size, dtype)[0, :size].reshape(shape)

    def aligned(self, array: Any) -> Any:
        """``array`` itself if contiguous, writable and 64-byte aligned, else such a copy."""
        host = isinstance(array, np.ndarray)
        if (
            array.flags.c_contiguous
            and (not host or array.flags.writeable)
            and address(array) % ALIGN == 0
        ):
            return array
        out = self.empty(tuple(array.shape), array.dtype)
        out[...] = array
        return out


# -- PyTorch's batches ---------------------------------------------------------------------


class TorchBatchBuilder:
    """The core loader's ``transform`` for the PyTorch adapter: a stacked batch dict in,
    ``(x_cat, x_cont, y)`` out (and the list columns' tensors as a fourth item when there
    are any), made in the loader's background thread; host batches for a GPU leave it
    staged (`CudaStager`), and `receive` takes them in the training thread."""

    def __init__(self, tensors: TorchTensors) -> None:
        self.tensors = tensors
        self.device = tensors.torch.device("cpu")
        self.stager: CudaStager | None = None
        self.lists: tuple[str, ...] = ()
        self.dtypes: dict[str, Any] = {}
        """Kind (``"cats"``, ``"conts"``, ``"labels"``) -> its tensors' dtype (for a kind
        without columns)."""

    def set_loader(self, loader: Loader, options: Mapping[str, Any], stage_to: Any) -> Any:
        """Take the loader's list columns and the dtypes in ``options`` (the loader's, which
        it checked); tensors go to ``stage_to`` (a GPU host batches are staged to: None for
        none), else to the loader's device. Returns that ``torch.device``."""
        torch = self.tensors.torch
        self.device = stage_to or torch.device(str(loader.device))
        self.stager = CudaStager(self.device) if stage_to is not None else None
        if loader.sparse_names and self.stager is not None:
            raise InvalidArgumentError(
                f"list columns ({', '.join(loader.sparse_names)}) are not staged to "
                f"{self.device} from host reads (backend='cpu'). Read on the GPU (leave "
                "backend out, with cudf installed), or pass device='cpu' and move the batch "
                "in the training loop (tensor.to('cuda', non_blocking=True))"
            )
        self.lists = tuple(loader.sparse_names)
        self.dtypes = {
            f"{kind}s": torch.from_numpy(np.empty(0, dtype=dtype)).dtype
            for kind, dtype in delivered_dtypes(self.tensors, options).items()
        }
        return self.device

    @property
    def receive(self) -> Callable[[Any], Any] | None:
        """What the training thread calls on a batch (`CudaStager.receive`), or None."""
        return None if self.stager is None else self.stager.receive

    def __call__(self, batch: dict[str, Any]) -> Any:
        tensor, torch = self.tensors.tensor, self.tensors.torch
        first = next(iter(batch.values()))
        # (a list column is (values, offsets): its rows are its offsets but one)
        rows = len(first[1]) - 1 if isinstance(first, tuple) else int(first.shape[0])
        made = {kind: tensor(batch[kind]) for kind in self.dtypes if kind in batch}
        # A kind with no columns is an empty tensor (of its dtype) where the others are.
        where = next(iter(made.values())).device if made else self.device
        x_cat, x_cont, y = (
            made[kind] if kind in made else torch.empty((rows, 0), dtype=dtype, device=where)
            for kind, dtype in self.dtypes.items()
        )
        if y.shape[1] == 1:
            y = y[:, 0]
        if self.lists:  # (values, offsets) for EmbeddingBag: offsets without the final end
            lists = {n: batch[n] for n in self.lists}
            return (
                x_cat,
                x_cont,
                y,
                {
                    n: (tensor(v[0]), tensor(v[1][:-1])) if isinstance(v, tuple) else tensor(v)
                    for n, v in lists.items()
                },
            )
        if self.stager is not None:
            return self.stager.send((x_cat, x_cont, y))
        return x_cat, x_cont, y
