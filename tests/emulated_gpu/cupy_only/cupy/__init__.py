"""Emulated cupy: numpy arrays dressed as device arrays, for hosts without a GPU.

Arrays live in host memory allocated through ``cupy.cuda.alloc`` (the default pool, or
whatever ``cupy.cuda.set_allocator`` installed, e.g. rmm's allocator once cudf is
imported), so allocation counts and memory limits behave as on a device. Every way in
which real cupy would silently copy device data to the host, or synchronise the host
with the device, is refused with a TypeError; the docstring of each refusal says whether
real cupy refuses too, or whether the emulation is stricter on purpose. Results are never
GPU figures.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import cuda, random  # noqa: F401  (cupy.random, as in cupy)
from .cuda import _order
from .cuda import memory as _memory
from .cuda import runtime as _runtime

__emulated__ = True
__version__ = "13.6.0-emulated"

# dtype names, as cupy re-exports numpy's
bool_, int8, int16, int32, int64 = np.bool_, np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float16, float32, float64 = np.float16, np.float32, np.float64
dtype, nan, inf, newaxis = np.dtype, np.nan, np.inf, np.newaxis


def _host_copy_refused(what: str) -> TypeError:
    return TypeError(
        f"{what} would copy a device array to the host and synchronise (emulated cupy "
        "refuses it, stricter than cupy, to expose hidden device-to-host copies). "
        "Use .get() or cupy.asnumpy() where the copy is intended"
    )


class _Window:
    """Exposes device memory to numpy; every numpy view of it keeps the allocation alive."""

    def __init__(self, memptr: _memory.MemoryPointer, nbytes: int) -> None:
        self.memptr = memptr
        self.__array_interface__ = {
            "data": (memptr.ptr, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": 3,
        }


class _Keeper:
    """The base of the numpy view a DLPack capsule exports: holds the device array."""

    def __init__(self, array: ndarray) -> None:
        self.array = array
        self.__array_interface__ = array._host.__array_interface__


class ndarray:
    """A device array: ``_host`` is a numpy view of device memory held by ``_memptr``."""

    __array_priority__ = 100
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        shape: Any,
        dtype: Any = float,
        memptr: _memory.MemoryPointer | None = None,
        strides: Any = None,
        order: str = "C",
    ) -> None:
        shape = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(shape)
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if memptr is None:
            memptr = _memory.alloc(nbytes)
        if nbytes == 0:  # nothing to address (allocators may return a null pointer)
            self._set(np.empty(shape, dt, order=order), memptr)
            return
        raw = np.asarray(_Window(memptr, nbytes))
        if strides is None:
            host = raw[:nbytes].view(dt).reshape(shape, order=order)
        else:
            host = np.lib.stride_tricks.as_strided(raw.view(dt), shape, strides)
        self._set(host, memptr)

    def _set(self, host: np.ndarray, memptr: _memory.MemoryPointer) -> None:
        self._host, self._memptr = host, memptr
        self._base: ndarray | None = None

    @classmethod
    def _view(cls, host: np.ndarray, memptr: _memory.MemoryPointer, of: ndarray) -> ndarray:
        """A view of ``of``'s memory; its ``base`` is the array that owns the memory, as
        in cupy (``_view`` in cupy/_core/core.pyx passes the viewed array as base)."""
        out = cls.__new__(cls)
        out._set(host, memptr)
        out._base = of if of._base is None else of._base
        return out

    def _history(self) -> _order.History | None:
        return _order.history(self._memptr.mem.ptr)

    # -- attributes ------------------------------------------------------------------
    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    ndim = property(lambda self: self._host.ndim)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    itemsize = property(lambda self: self._host.itemsize)
    strides = property(lambda self: self._host.strides)
    flags = property(lambda self: self._host.flags)
    base = property(lambda self: self._base)

    @property
    def device(self) -> cuda.Device:
        return cuda.Device(self._memptr.device_id)

    @property
    def data(self) -> _memory.MemoryPointer:
        """The pointer to the first element (``a.data.ptr``), inside the allocation."""
        mem = self._memptr.mem
        return _memory.MemoryPointer(mem, self._host.__array_interface__["data"][0] - mem.ptr)

    @property
    def T(self) -> ndarray:
        return self._derive(self._host.T)

    def _derive(self, host: np.ndarray) -> ndarray:
        """A numpy result of this array's host view: a view if it shares the memory."""
        if isinstance(host, np.ndarray) and np.may_share_memory(host, self._host):
            return ndarray._view(host, self._memptr, self)
        return _to_device(np.asarray(host))

    # -- refusing implicit host conversion ----------------------------------------------
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # cupy refuses it too, with this message (cupy/_core/core.pyx, ndarray.__array__).
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly."
        )

    def __iter__(self) -> Any:
        # cupy iterates, one indexing kernel per element (core.pyx __iter__): refused here.
        raise _host_copy_refused("iterating over a device array")

    def tolist(self) -> Any:
        raise _host_copy_refused("tolist()")  # cupy: self.get().tolist()

    def item(self) -> Any:
        raise _host_copy_refused("item()")  # cupy copies the element to the host

    def __float__(self) -> float:
        raise _host_copy_refused("float()")  # cupy: float(self.get()), a sync

    def __int__(self) -> int:
        raise _host_copy_refused("int()")  # cupy: int(self.get()), a sync

    def __complex__(self) -> complex:
        raise _host_copy_refused("complex()")

    def __index__(self) -> int:
        raise _host_copy_refused("using a device array as an index")

    def __bool__(self) -> bool:
        raise _host_copy_refused("bool() (an if/while/and/or on a device array)")

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # cupy dispatches np.<func> to cupy.<func> (core.pyx __array_function__). Refused
        # here (stricter): device code should call its array module explicitly, and code
        # that calls numpy is host code that was handed a device array by mistake.
        raise TypeError(
            f"numpy.{func.__name__} was called with a device array (emulated cupy refuses "
            "numpy functions on cupy arrays): call the cupy function, or .get() first"
        )

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # cupy runs numpy ufuncs on device arrays and numbers, and raises TypeError for
        # numpy arrays among the inputs (core.pyx __array_ufunc__): so does this.
        if method != "__call__" or kwargs:
            raise TypeError(f"emulated cupy supports only plain calls of ufuncs, not {method}")
        return _ufunc(ufunc, *inputs)

    def __repr__(self) -> str:  # cupy prints through .get() too
        return repr(self._host)

    def __str__(self) -> str:
        return str(self._host)

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return len(self._host)

    # -- explicit transfers -----------------------------------------------------------
    def get(self, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True):
        """A host copy (cupy.ndarray.get): with the array's device current, copied on
        that device's current stream (or ``stream``), which the host then waits for;
        work of other streams is not waited for."""
        with cuda.Device(self._memptr.device_id):
            key = cuda.current_key() if stream is None else stream._key()
            _order.access(
                self._history(), key, _order.issue(key), write=False, what="a copy to the host"
            )
            _order.host_wait(key)
        if out is not None:
            out[...] = self._host
            return out
        return np.array(self._host, order=order, copy=True)

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copy a host array of the same dtype and shape in (cupy.ndarray.set): its checks
        and messages are cupy's (cupy/_core/core.pyx, ``_ndarray_base.set``); a
        destination that is neither C- nor F-contiguous is refused."""
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._host.flags.c_contiguous or self._host.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        key = cuda.current_key() if stream is None else stream._key()
        n = _order.issue(key, _order.kernel_seconds(arr.nbytes))
        _order.access(self._history(), key, n, write=True, what="a copy in")
        self._host[...] = arr

    # -- DLPack and the CUDA array interface ------------------------------------------
    def __dlpack_device__(self) -> tuple[int, int]:
        # The one place the emulation cannot be faithful: the memory is host memory, so it
        # is exported as kDLCPU (1, 0); real cupy reports (kDLCUDA=2, device id).
        return self._host.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        """Export, ordering the consumer's ``stream`` as cupy does (``__dlpack__`` in
        cupy/_core/core.pyx): None means the legacy default stream; unless it is -1 or
        the current stream, the consumer's stream waits for an event recorded on cupy's
        current stream. The consumer then reads on its stream: refused when that read is
        not ordered after the array's last write."""
        if stream != -1:
            device = _runtime.getDevice()
            current = cuda.current_key()
            consumer = cuda.ExternalStream(1 if stream is None else int(stream))._key()
            if consumer != current:
                count, covered, when = _order.snapshot(current)
                _order.wait(consumer, current, count, covered, when)
            _order.access(
                self._history(),
                consumer,
                _order.issued(consumer),
                write=False,
                what=f"a DLPack consumer (stream {stream!r}, device {device})",
                record=False,
            )
        # The capsule holds the exported array itself until the consumer calls its deleter:
        # cupy's toDlpack sets the managed tensor's manager_ctx to the array and
        # Py_INCREFs it (cupy/_core/dlpack.pyx), so a consumer that frees the memory lets
        # go of that very array. Exported through a numpy view whose base is a _Keeper of
        # this array, the capsule here keeps it alive the same way. numpy's exporter takes
        # no stream (host memory); max_version etc. pass through.
        view = np.asarray(_Keeper(self))
        return view.__dlpack__(**{k: v for k, v in kwargs.items() if v is not None})

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        host = self._host
        return {
            "shape": host.shape,
            "typestr": host.dtype.str,
            "descr": host.dtype.descr,
            "data": (host.__array_interface__["data"][0], False),
            "strides": None if host.flags.c_contiguous else host.strides,
            "version": 3,
        }

    # -- shape and dtype ----------------------------------------------------------------
    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return self._derive(self._host.reshape(shape, order=order))

    def ravel(self, order: str = "C") -> ndarray:
        return self._derive(self._host.ravel(order=order))

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._view(
            self._host.view() if dtype is None else self._host.view(dtype), self._memptr, self
        )

    def astype(self, dtype: Any, order: str = "K", copy: bool = True) -> ndarray:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        _launch(self)
        return _to_device(self._host.astype(dtype, order=order))

    def copy(self, order: str = "C") -> ndarray:
        _launch(self)
        return _to_device(np.array(self._host, order=order, copy=True))

    def fill(self, value: Any) -> None:
        self[...] = value

    def take(self, indices: Any, axis: int | None = None, out: Any = None) -> ndarray:
        return take(self, indices, axis=axis, out=out)

    # -- indexing -----------------------------------------------------------------------
    def __getitem__(self, key: Any) -> ndarray:
        key, advanced = _index(key)
        if not advanced:  # basic indexing: a view; a trailing ... keeps 0-d results arrays
            key = key if isinstance(key, tuple) else (key,)
            key = key if any(k is Ellipsis for k in key) else (*key, Ellipsis)
            return ndarray._view(self._host[key], self._memptr, self)
        _launch(self)
        if _has_mask(key):
            _order.host_wait(cuda.current_key())  # the count of true elements, on the host
        # cupy wraps out-of-bounds indices around (core.pyx __getitem__ docstring); numpy,
        # and so this emulation, raises IndexError: stricter, an out-of-bounds index is a bug.
        return _to_device(np.asarray(self._host[key]))

    def __setitem__(self, key: Any, value: Any) -> None:
        key, _ = _index(key)
        if isinstance(value, ndarray):
            _launch(value)
            _written(self)
            value = value._host
        elif isinstance(value, np.ndarray):
            if value.ndim:
                # cupy sends a non-array value to fill(), which refuses numpy arrays with
                # this ValueError (core.pyx ndarray.fill); a 0-d array is used as a scalar.
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.item()
        elif not isinstance(value, (numbers.Number, np.generic)):
            raise TypeError(f"Unsupported type {type(value)}")
        _launch(self, read=False)
        _written(self)
        self._host[key] = value

    # -- arithmetic and comparisons ----------------------------------------------------
    def __neg__(self) -> ndarray:
        return _ufunc(np.negative, self)

    def __abs__(self) -> ndarray:
        return _ufunc(np.absolute, self)

    def __invert__(self) -> ndarray:
        return _ufunc(np.invert, self)

    def sum(self, axis: Any = None, dtype: Any = None, keepdims: bool = False) -> ndarray:
        return _reduce(np.sum, self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> ndarray:
        return _reduce(np.max, self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> ndarray:
        return _reduce(np.min, self, axis=axis, keepdims=keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> ndarray:
        return _reduce(np.any, self, axis=axis, keepdims=keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> ndarray:
        return _reduce(np.all, self, axis=axis, keepdims=keepdims)

    def argsort(self, axis: int = -1) -> ndarray:
        return argsort(self, axis=axis)

    def cumsum(self, axis: Any = None, dtype: Any = None) -> ndarray:
        return cumsum(self, axis=axis, dtype=dtype)


def _binary(ufunc: Any, swap: bool = False) -> Any:
    if swap:
        return lambda self, other: _ufunc(ufunc, other, self)
    return lambda self, other: _ufunc(ufunc, self, other)


def _inplace(ufunc: Any) -> Any:
    return lambda self, other: _ufunc_function(ufunc)(self, other, out=self)


for _name, _func in {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "truediv": np.true_divide,
    "floordiv": np.floor_divide,
    "mod": np.remainder,
    "pow": np.power,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "lshift": np.left_shift,
    "rshift": np.right_shift,
}.items():
    setattr(ndarray, f"__{_name}__", _binary(_func))
    setattr(ndarray, f"__r{_name}__", _binary(_func, swap=True))
    # in place, as cupy's ``__iadd__`` and the others (cupy/_core/core.pyx: the ufunc with
    # ``out=self``, same_kind casting)
    setattr(ndarray, f"__i{_name}__", _inplace(_func))
for _name, _func in {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}.items():
    setattr(ndarray, f"__{_name}__", _binary(_func))


# -- kernels: checks, then numpy on the host views, results in new device memory ---------


def _launch(*arrays: Any, read: bool = True) -> None:
    """The checks of a kernel launch: device arrays only, all on the current device, and
    (``read``) their last writes ordered before the current stream (see ``cuda._order``)."""
    current = _runtime.getDevice()
    key = cuda.current_key()  # refuses a current stream of another device
    nbytes = sum(int(a.nbytes) for a in arrays if isinstance(a, ndarray))
    n = _order.issue(key, _order.kernel_seconds(nbytes))  # a kernel takes time
    for a in arrays:
        if isinstance(a, np.ndarray):
            # cupy's kernels refuse host arrays (cupy/_core/_kernel.pyx _preprocess_arg
            # raises TypeError "Unsupported type"): copy them with cupy.asarray first.
            raise TypeError(f"Unsupported type {type(a)} (move host arrays with cupy.asarray)")
        if isinstance(a, ndarray) and a._memptr.device_id != current:
            # cupy refuses an array of another device when peer access is unavailable
            # (cupy/_core/_kernel.pyx _check_peer_access, this message) and otherwise reads
            # it across devices, unordered with that device's stream. Always refused here
            # (stricter): peer access is never emulated.
            raise ValueError(
                f"The device where the array resides ({a._memptr.device_id}) is different "
                f"from the current device ({current}). Peer access is unavailable between "
                "these devices."
            )
        if read and isinstance(a, ndarray):
            _order.access(a._history(), key, n, write=False, what="a kernel")


def _written(a: ndarray) -> None:
    """Record a kernel's write of ``a`` on the current stream (checked first)."""
    key = cuda.current_key()
    _order.access(a._history(), key, _order.issue(key), write=True, what="a kernel")


def _operand(x: Any) -> Any:
    if isinstance(x, ndarray):
        return x._host
    if isinstance(x, (numbers.Number, np.generic)):
        return x
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x.item()
    raise TypeError(f"Unsupported type {type(x)}")


def _to_device(host: np.ndarray) -> ndarray:
    """A new device array (allocated through the allocator) holding ``host``'s values."""
    host = np.asarray(host)
    out = ndarray(host.shape, host.dtype)
    _written(out)
    out._host[...] = host
    return out


def _ufunc(ufunc: Any, *inputs: Any) -> ndarray:
    _launch(*inputs)
    return _to_device(ufunc(*(_operand(x) for x in inputs)))


def _reduce(func: Any, a: ndarray, **kwargs: Any) -> ndarray:
    _launch(a)
    return _to_device(
        np.asarray(func(a._host, **{k: v for k, v in kwargs.items() if v is not None}))
    )


def _index(key: Any) -> tuple[Any, bool]:
    """A numpy index for a device array's host view, and whether it is advanced indexing."""
    parts = key if isinstance(key, tuple) else (key,)
    out, advanced = [], False
    for part in parts:
        if isinstance(part, ndarray):
            _launch(part)
            part, advanced = part._host, True
        elif isinstance(part, (np.ndarray, list)):
            # cupy copies host index arrays to the device implicitly; refused (stricter):
            # move the index once with cupy.asarray instead of on every indexing.
            raise TypeError(
                "emulated cupy refuses host arrays and lists as indices: use cupy.asarray"
            )
        out.append(part)
    return (tuple(out) if isinstance(key, tuple) else out[0]), advanced


def _has_mask(key: Any) -> bool:
    """Whether a numpy index (from `_index`) holds a boolean mask: cupy then copies the
    number of selected elements to the host before it can size the result."""
    parts = key if isinstance(key, tuple) else (key,)
    return any(isinstance(p, np.ndarray) and p.dtype == np.bool_ for p in parts)


def _check_out(out: Any, shape: tuple[int, ...]) -> None:
    if not isinstance(out, ndarray):
        raise TypeError(f"out must be a cupy.ndarray, got {type(out)}")
    if out.shape != tuple(shape):
        raise ValueError(f"out has shape {out.shape}, the result has {tuple(shape)}")


def _write(result: np.ndarray, out: Any) -> ndarray:
    if out is None:
        return _to_device(result)
    _check_out(out, result.shape)
    _launch(out, read=False)
    _written(out)
    out._host[...] = result
    return out


# -- creation -----------------------------------------------------------------------------


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return ndarray(shape, dtype, order=order)


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    out = empty(shape, dtype, order)
    _written(out)
    out._host[...] = 0
    return out


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    out = empty(shape, dtype, order)
    _written(out)
    out._host[...] = 1
    return out


def full(shape: Any, fill_value: Any, dtype: Any = None, order: str = "C") -> ndarray:
    dt = np.asarray(_operand(fill_value)).dtype if dtype is None else dtype
    out = empty(shape, dt, order)
    _written(out)
    out._host[...] = _operand(fill_value)
    return out


def empty_like(a: ndarray, dtype: Any = None) -> ndarray:
    return empty(a.shape, a.dtype if dtype is None else dtype)


def zeros_like(a: ndarray, dtype: Any = None) -> ndarray:
    return zeros(a.shape, a.dtype if dtype is None else dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> ndarray:
    return _to_device(np.arange(start, stop, step, dtype=dtype))


def _from_cuda_array_interface(owner: Any) -> ndarray:
    """A view of another library's device memory (cupy: ``UnownedMemory`` kept alive by
    ``owner``, its device asked of the pointer)."""
    cai = owner.__cuda_array_interface__
    ptr, dt = int(cai["data"][0]), np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    mem = cuda.UnownedMemory(ptr, nbytes, owner, -1)
    return ndarray(shape, dt, _memory.MemoryPointer(mem, 0), strides=cai.get("strides"))


def asarray(a: Any, dtype: Any = None, order: str | None = None) -> ndarray:
    """A device array of ``a``: a device array as is, another library's device memory
    (``__cuda_array_interface__``) as a view, anything else copied host-to-device."""
    if not isinstance(a, ndarray) and hasattr(a, "__cuda_array_interface__"):
        a = _from_cuda_array_interface(a)
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    return _to_device(np.asarray(a, dtype=dtype, order=order))  # the explicit host->device copy


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K") -> ndarray:
    if isinstance(obj, ndarray) and not copy:
        return asarray(obj, dtype)
    if isinstance(obj, ndarray):
        _launch(obj)
        return _to_device(obj._host.astype(obj.dtype if dtype is None else dtype))
    return _to_device(np.array(obj, dtype=dtype, order=order))


def ascontiguousarray(a: ndarray, dtype: Any = None) -> ndarray:
    _launch(a)
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    return _to_device(np.ascontiguousarray(a._host, dtype=dtype))


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, blocking: bool = True):
    """The explicit device-to-host copy (host arrays are returned as numpy arrays)."""
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return np.asarray(a, order=order)


def get_array_module(*args: Any) -> Any:
    import sys

    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def get_default_memory_pool() -> _memory.MemoryPool:
    return _memory._default_pool


def get_default_pinned_memory_pool() -> Any:
    return cuda.pinned_memory._default_pool


# -- array functions ----------------------------------------------------------------------


def take(a: ndarray, indices: Any, axis: int | None = None, out: Any = None) -> ndarray:
    _launch(a, indices)
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    idx = indices._host if isinstance(indices, ndarray) else _operand(indices)
    # numpy raises IndexError where cupy wraps out-of-bounds indices around: stricter.
    return _write(np.take(a._host, idx, axis=axis), out)


def concatenate(arrays: Sequence[Any], axis: int = 0, out: Any = None, dtype: Any = None):
    arrays = list(arrays)
    if not arrays:
        raise ValueError("Cannot concatenate from empty tuple")
    for a in arrays:
        if not isinstance(a, ndarray):
            # cupy's message (cupy/_core/_routines_manipulation.pyx, concatenate_method)
            raise TypeError("Only cupy arrays can be concatenated")
        if a.ndim == 0:
            raise TypeError("zero-dimensional arrays cannot be concatenated")
    _launch(*arrays)
    return _write(np.concatenate([a._host for a in arrays], axis=axis, dtype=dtype), out)


def stack(arrays: Sequence[Any], axis: int = 0, out: Any = None) -> ndarray:
    arrays = list(arrays)
    if not all(isinstance(a, ndarray) for a in arrays):
        raise TypeError("Only cupy arrays can be stacked")
    _launch(*arrays)
    return _write(np.stack([a._host for a in arrays], axis=axis), out)


def _unary(func: Any) -> Any:
    def run(a: ndarray, *args: Any, **kwargs: Any) -> ndarray:
        _launch(a, *args, *kwargs.values())
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        args = tuple(x._host if isinstance(x, ndarray) else x for x in args)
        return _to_device(np.asarray(func(a._host, *args, **kwargs)))

    run.__name__ = func.__name__
    return run


isnan, isinf, isfinite = _unary(np.isnan), _unary(np.isinf), _unary(np.isfinite)


def _ufunc_function(func: Any) -> Any:
    """A cupy ufunc called as a function: ``out=`` takes the result, in place when it is
    one of the inputs. cupy's ufuncs cast into ``out`` under ``casting="same_kind"`` and
    raise numpy's ``UFuncTypeError`` (a ``TypeError``) otherwise
    (cupy/_core/_kernel.pyx ``ufunc.__call__`` and ``_check_should_use_min_scalar``)."""

    def call(*inputs: Any, out: Any = None, dtype: Any = None) -> ndarray:
        _launch(*inputs)
        result = np.asarray(func(*(_operand(x) for x in inputs), dtype=dtype))
        if out is not None and not np.can_cast(result.dtype, out.dtype, "same_kind"):
            raise TypeError(
                f"Cannot cast ufunc '{func.__name__}' output from {result.dtype} to "
                f"{out.dtype} with casting rule 'same_kind'"
            )
        return _write(result.astype(out.dtype, copy=False) if out is not None else result, out)

    call.__name__ = func.__name__
    return call


add, subtract, multiply = (
    _ufunc_function(np.add),
    _ufunc_function(np.subtract),
    _ufunc_function(np.multiply),
)
bitwise_and, bitwise_or = _ufunc_function(np.bitwise_and), _ufunc_function(np.bitwise_or)
bitwise_xor = _ufunc_function(np.bitwise_xor)
left_shift, right_shift = _ufunc_function(np.left_shift), _ufunc_function(np.right_shift)
diff, argsort = _unary(np.diff), _unary(np.argsort)
sort, unique = _unary(np.sort), _unary(np.unique)


def cumsum(a: ndarray, axis: Any = None, dtype: Any = None, out: Any = None) -> ndarray:
    _launch(a, out)
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    return _write(np.cumsum(a._host, axis=axis, dtype=dtype), out)


def repeat(a: ndarray, repeats: Any, axis: Any = None) -> ndarray:
    """Repeats of an int, list or tuple. A device array of repeats is refused, as cupy's
    ``_repeat`` does before v14 (cupy/_core/_routines_manipulation.pyx: "cupy.ndaray
    cannot be specified as `repeats` argument."), although numpy accepts it: code that
    repeats by array lengths must use another construction (e.g. searchsorted)."""
    if isinstance(repeats, ndarray):
        raise ValueError("cupy.ndaray cannot be specified as `repeats` argument.")
    _launch(a)
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    return _to_device(np.asarray(np.repeat(a._host, repeats, axis=axis)))


def where(condition: ndarray, x: Any = None, y: Any = None) -> Any:
    if x is None and y is None:
        return nonzero(condition)  # as cupy: where(condition) is nonzero(condition)
    _launch(condition, x, y)
    return _to_device(np.where(condition._host, _operand(x), _operand(y)))


def nonzero(a: ndarray) -> tuple[ndarray, ...]:
    _launch(a)
    _order.host_wait(cuda.current_key())  # the count of nonzero elements, on the host
    return tuple(_to_device(i) for i in np.nonzero(a._host))


def searchsorted(a: ndarray, v: Any, side: str = "left", sorter: Any = None) -> ndarray:
    _launch(a, v, sorter)
    s = None if sorter is None else sorter._host
    return _to_device(np.asarray(np.searchsorted(a._host, _operand(v), side=side, sorter=s)))


def array_equal(a1: ndarray, a2: ndarray, equal_nan: bool = False) -> ndarray:
    _launch(a1, a2)
    return _to_device(np.asarray(np.array_equal(a1._host, a2._host, equal_nan=equal_nan)))


class _Fusion:
    """A function decorated by `fuse`: called with a device array among its arguments, it
    runs as one elementwise kernel, as cupy's ``Fusion.__call__`` (cupy/_core/fusion.pyx)
    compiles it (one launch reading the array arguments, each result in new device
    memory); emulated by running the function on the arguments' values with numpy.
    Arguments as cupy accepts them (``_acceptable_types`` there: device arrays, numpy
    scalars, Python numbers, None) and positional only; without a device array the
    function runs as it is, as cupy's does."""

    def __init__(self, func: Any, name: str | None) -> None:
        self.func = func
        self.name = name or func.__name__

    def __call__(self, *args: Any) -> Any:
        if not any(isinstance(a, ndarray) for a in args):
            return self.func(*args)
        for a in args:
            accepted = (ndarray, np.ndarray, np.generic, int, float, complex, bool, type(None))
            if not isinstance(a, accepted):
                types = ", ".join(repr(type(x)) for x in args)
                raise TypeError(f"Invalid argument type for '{self.name}': ({types})")
        _launch(*args)  # refuses host arrays, as the fused kernel's launch does
        result = self.func(*(a._host if isinstance(a, ndarray) else a for a in args))
        if result is None:
            return None
        if isinstance(result, tuple):
            return tuple(_to_device(np.asarray(r)) for r in result)
        return _to_device(np.asarray(result))


def fuse(*args: Any, kernel_name: str | None = None) -> Any:
    """``cupy.fuse``, as a decorator with or without ``kernel_name`` (see `_Fusion`)."""
    if len(args) == 1 and callable(args[0]):
        return _Fusion(args[0], kernel_name)
    return lambda func: _Fusion(func, kernel_name)
