"""Optional dependencies, in one place: what each is for, how to install it, how to import it.

``import tabloader`` needs only pyarrow and numpy. Everything else is imported where it
is used, through these functions, so that a missing package is said the same way
everywhere: which feature needs it, and the ``pip install`` line that brings it
(`require`, `missing`). Packages that only make something faster or more precise
(rmm, pylibcudf, psutil, pynvml) are `optional`: None when absent. The GPU's
libraries are imported by `import_gpu`, which also checks the device, and
`gpu_usable` probes for them without importing anything when they are not installed.

This module sits below everything else in the package (it imports only
`tabloader.errors`): `tabloader.device` asks it whether a GPU is usable without
importing the GPU backend.

Examples:
    >>> str(missing("deltalake"))
    "Dataset.from_delta needs the deltalake package: pip install 'tabloader[delta]'"
    >>> optional("a_package_that_is_not_installed") is None
    True
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from typing import Any

from tabloader.errors import GPUUnavailableError, InvalidArgumentError, TabloaderError

__all__ = [
    "INSTALL_GPU",
    "gpu_module",
    "gpu_usable",
    "import_gpu",
    "keras_import_error",
    "missing",
    "optional",
    "require",
]

INSTALL_GPU = "pip install 'tabloader[gpu]'"
"""The install line of the GPU backend's libraries (cudf, cupy, rmm, dask-cudf)."""

_NEEDED_FOR = {
    "torch": "tabloader.torch needs PyTorch: pip install 'tabloader[torch]'",
    "jax": "tabloader.jax needs JAX: pip install 'tabloader[jax]'",
    "keras": "tabloader.keras needs Keras 3: pip install 'tabloader[keras]'",
    "tensorflow": "this needs TensorFlow: pip install 'tabloader[tensorflow]'",
    "deltalake": "Dataset.from_delta needs the deltalake package: pip install 'tabloader[delta]'",
    "pyiceberg": "Dataset.from_iceberg needs pyiceberg: pip install 'tabloader[iceberg]'",
    "fsspec": (
        "reading URLs needs fsspec: pip install fsspec (and s3fs, gcsfs, adlfs for the protocol)"
    ),
    "cupy": "reading GPU memory size needs cupy: pip install 'tabloader[gpu]'",
}
"""Each optional package a feature cannot do without, and the message when it is missing."""


def missing(
    name: str, *, what: str | None = None, extra: str | None = None, otherwise: str | None = None
) -> ImportError:
    """The ``ImportError`` for a missing optional package: the feature and its install line.

    ``what`` and ``extra`` name the feature and the ``tabloader[...]`` extra where the
    package serves several (``"this needs TensorFlow"`` from the tensor conversions);
    ``otherwise`` is what to do instead of installing it.

    Examples:
        >>> str(missing("tensorflow", what="feature_columns", otherwise="pass the names"))
        "feature_columns needs TensorFlow: pip install 'tabloader[tensorflow]', or pass the names"
    """
    if what is not None:
        hint = f"pip install 'tabloader[{extra or name}]'"
        message = f"{what} needs {_display(name)}: {hint}"
    else:
        message = _NEEDED_FOR.get(name, f"this needs {name}: pip install {name}")
    return ImportError(message if otherwise is None else f"{message}, or {otherwise}")


def _display(name: str) -> str:
    return {"torch": "PyTorch", "jax": "JAX", "tensorflow": "TensorFlow"}.get(name, name)


def require(
    name: str, *, what: str | None = None, extra: str | None = None, otherwise: str | None = None
) -> Any:
    """Import ``name``, or raise `missing`'s ``ImportError`` (from None: the install line
    is all there is to say)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise missing(name, what=what, extra=extra, otherwise=otherwise) from None


def optional(name: str) -> Any:
    """``name`` imported, or None when it is not installed (rmm, pylibcudf, psutil, pynvml:
    packages that make something faster or more precise, never required)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def keras_import_error(error: ImportError) -> ImportError:
    """What to install when ``import keras`` failed: Keras itself, or the framework of the
    backend it was asked to run on (``KERAS_BACKEND``)."""
    if error.name == "keras":
        return missing("keras")
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    return ImportError(
        f"Keras could not be imported ({error}): its backend, {backend!r} (KERAS_BACKEND), "
        f"needs that framework: pip install 'tabloader[{backend}]', or set KERAS_BACKEND to "
        "an installed one (tensorflow, jax or torch)"
    )


# -- the GPU's libraries ---------------------------------------------------------------------


def gpu_module(name: str) -> Any:
    """Import one of the GPU backend's libraries, or raise
    [`GPUUnavailableError`][tabloader.errors.GPUUnavailableError] saying what to install."""
    try:
        return importlib.import_module(name)
    except Exception as err:  # a broken CUDA install raises RuntimeError, OSError, ...
        raise GPUUnavailableError(
            f"the GPU backend needs {name}, which could not be imported "
            f"({type(err).__name__}: {err}). Install the CUDA 12 builds (cudf-cu12, "
            f"cupy-cuda12x) with: {INSTALL_GPU}, or pass device='cpu'"
        ) from err


def _visible_devices() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES is not set" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"


def import_gpu(device: int | None = None) -> tuple[Any, Any, int]:
    """Import cudf and cupy and check the device: returns ``(cudf, cupy, device index)``.

    cupy is imported and asked for the device count first, and cudf only when a GPU is
    visible: importing cudf on a host without a usable GPU fails in ways that vary across
    releases. ``device=None`` is the calling thread's current CUDA device (the one
    ``torch.cuda.set_device`` or ``cupy.cuda.Device(i).use()`` chose; 0 by default).

    Raises:
        GPUUnavailableError: cudf or cupy cannot be imported, or no GPU is visible.
        InvalidArgumentError: ``device`` is not one of the visible GPUs.
    """
    cupy = gpu_module("cupy")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as err:  # CUDARuntimeError: no driver, insufficient driver, ...
        raise GPUUnavailableError(
            f"the GPU backend found no usable CUDA GPU: cupy.cuda.runtime.getDeviceCount() "
            f"failed ({type(err).__name__}: {err}). Check the NVIDIA driver with nvidia-smi, "
            f"or pass device='cpu'"
        ) from err
    if count < 1:
        raise GPUUnavailableError(
            f"the GPU backend found no CUDA GPU ({_visible_devices()}). Check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES, or pass device='cpu'"
        )
    if device is None:
        device = int(cupy.cuda.runtime.getDevice())
    if not 0 <= device < count:
        raise InvalidArgumentError(
            f"device cuda:{device} does not exist: {count} CUDA GPU(s) are visible "
            f"(cuda:0..cuda:{count - 1}; {_visible_devices()}). With one process per GPU, "
            "pass device=local_rank, or device='cuda' for the current device"
        )
    return gpu_module("cudf"), cupy, device


@functools.cache
def gpu_usable() -> bool:
    """Whether the GPU backend can run here: cudf and cupy import and a GPU is visible.

    Cheap when cudf or cupy is not installed (their import specs are looked up, nothing
    is imported). The answer is cached for the process; ``gpu_usable.cache_clear()``
    forgets it.
    """
    try:
        if importlib.util.find_spec("cupy") is None or importlib.util.find_spec("cudf") is None:
            return False
    except Exception:  # a half-installed package can fail while its spec is looked up
        return False
    try:
        import_gpu()
    except TabloaderError:
        return False
    return True
