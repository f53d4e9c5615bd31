"""Batches read by a framework on its own streams, slower than the loader: no race.

The framework stand-ins of ``tests/emulated_gpu/frameworks.py`` read batches as PyTorch,
JAX (XLA) and TensorFlow do on a GPU: on their streams, told through DLPack or not, and
letting go of a tensor on the host without waiting for their queued kernels. Each
consumer here is slower than the loader (a sleep queued before each step) and reads
every batch; the emulated device refuses a read of a batch before it is written and a
write of memory a step still reads. ``benchmarks/gpu_race.py`` runs the same consumers
with the real frameworks on a GPU (checksums of every batch against the CPU backend's),
and here, smaller, on the emulated device.
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tabloader
from conftest import write_dataset

gpu = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]


def _stand_in(kind: str) -> Any:
    """The device side of ``kind`` on the emulated GPU; skips on a real GPU."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("the frameworks' streams are emulated on the emulated device only")
    from emulated_gpu.frameworks import framework

    return framework(kind)


def _quietly(make: Any, *args: Any, **kwargs: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small row groups, on purpose
        return make(*args, **kwargs)


def _converting_loader(tmp_path: Path, framework: Any) -> tabloader.Loader:
    """A GPU loader over 1,024 rows in chunks of 256 whose batches become ``framework``'s
    tensors (a `tabloader.tensors` framework) as the adapters make them."""
    from tabloader.tensors import BatchConverter, delivered_dtypes

    convert = BatchConverter(framework)
    paths = write_dataset(tmp_path / "data", [[256] * 4])
    loader = _quietly(
        tabloader.Loader, paths, conts=["x"], labels=["label"], batch_size=64, shuffle=True,
        seed=2, device="cuda", parts_per_chunk=1, prefetch=1,
        transform=lambda batch: convert.tensors_of(convert.arrays(batch)),
    )  # fmt: skip
    convert.set_loader(loader, delivered_dtypes(framework, {}))
    return loader


# -- JAX: XLA's streams are non-blocking, and JAX deletes an imported buffer at once ----------


@gpu
@pytest.mark.jax
def test_jax_reads_every_batch_before_the_loader_writes_its_memory_again(tmp_path, monkeypatch):
    """The JAX adapter through XLA's device side: batches imported on XLA's ready-events
    stream, read by steps on its compute stream (behind a slow kernel), deleted on the
    host as soon as the loop moves on. The loader writes a batch's memory again only
    after XLA's queued work on it is done."""
    xla = _stand_in("xla")
    from emulated_gpu.frameworks import sleep
    from tabloader import tensors
    from tabloader.jax import JaxLoader

    monkeypatch.setattr(tensors.JaxTensors, "tensor", lambda self, array: xla.from_dlpack(array))
    monkeypatch.setattr(
        tensors.JaxTensors, "marker", lambda self, device: xla.marker(), raising=False
    )
    paths = write_dataset(tmp_path / "data", [[256] * 3, [256] * 2])
    loader = _quietly(
        JaxLoader, paths, cats=["id"], conts=["x"], labels=["label"], batch_size=64,
        shuffle=True, seed=1, device="cuda", parts_per_chunk=1, prefetch=1,
    )  # fmt: skip
    for _ in range(2):
        ids = []
        for features, labels in loader:
            sleep(0.002, xla.stream)  # XLA is behind: its reads of this batch are queued
            xla.step(features, labels)
            ids.append(xla.copy(features["id"]))  # read later: no host wait now
            del features, labels  # JAX deletes the arrays: the DLPack deleter runs now
        xla.synchronize()
        assert sorted(np.concatenate(ids).tolist()) == list(range(1280))
    assert xla.steps == 2 * len(loader)


@gpu
@pytest.mark.jax
def test_a_jax_marker_queued_while_jax_traces_is_a_real_array():
    """A loader collected by a garbage collection that runs inside the user's jit gives
    its memory back then, queueing a marker: it must run at once, not be traced into the
    user's function (a tracer is never ready, and waiting for it raised in a finalizer,
    keeping the loader's device buffers alive in the traceback)."""
    import jax
    import jax.numpy as jnp

    from tabloader.device import Device
    from tabloader.tensors import JaxTensors

    made = []

    @jax.jit
    def step(x):
        made.append(JaxTensors().marker(Device("cuda", 0)))
        return x * 2

    step(jnp.ones(3))
    (marker,) = made
    assert not isinstance(marker, jax.core.Tracer)
    marker.block_until_ready()
    assert marker.is_ready()


@gpu
@pytest.mark.jax
def test_the_keras_adapters_tensors_on_jax_are_fenced_too(tmp_path, monkeypatch):
    """Keras on JAX makes its tensors with the same `BatchConverter` and `JaxTensors` as
    the JAX adapter: the same fence holds (here through the converter directly)."""
    xla = _stand_in("xla")
    from emulated_gpu.frameworks import sleep
    from tabloader import tensors
    from tabloader.tensors import JaxTensors

    monkeypatch.setattr(JaxTensors, "tensor", lambda self, array: xla.from_dlpack(array))
    monkeypatch.setattr(JaxTensors, "marker", lambda self, device: xla.marker(), raising=False)
    loader = _converting_loader(tmp_path, JaxTensors())
    if hasattr(tensors, "MarkerFence"):
        assert isinstance(loader.backend.xp.memory.consumer, tensors.MarkerFence)
    copies = []
    for batch in loader:
        sleep(0.002, xla.stream)
        xla.step(batch)
        copies.append(xla.copy(batch["x"]))
        del batch
    xla.synchronize()
    assert sorted(np.concatenate(copies).tolist()) == (np.arange(1024) / 4.0).tolist()


@gpu
@pytest.mark.jax
def test_without_a_fence_jax_would_read_memory_written_again(tmp_path, monkeypatch):
    """The tests above can fail: with no fence for JAX, the emulated device refuses the
    loader's reuse of memory XLA still reads."""
    xla = _stand_in("xla")
    from cupy.cuda import RaceError

    from emulated_gpu.frameworks import settle, sleep
    from tabloader import tensors
    from tabloader.jax import JaxLoader

    monkeypatch.setattr(tensors.JaxTensors, "tensor", lambda self, array: xla.from_dlpack(array))
    monkeypatch.setattr(tensors.JaxTensors, "release_fence", lambda self, device: None)
    paths = write_dataset(tmp_path / "data", [[256] * 4])
    loader = _quietly(
        JaxLoader, paths, cats=["id"], labels=["label"], batch_size=64, shuffle=True,
        seed=1, device="cuda", parts_per_chunk=1, prefetch=1,
    )  # fmt: skip

    def train() -> None:
        for features, labels in loader:
            sleep(0.002, xla.stream)
            xla.step(features, labels)
            del features, labels

    try:
        with pytest.raises(RaceError):
            train()
    finally:
        settle()


# -- PyTorch: its current stream ---------------------------------------------------------------


@gpu
@pytest.mark.torch
@pytest.mark.parametrize("rules", ["both", "without the second"])
def test_pytorch_on_a_stream_of_its_own_follows_the_two_rules_of_the_gpu_page(
    tmp_path, monkeypatch, rules
):
    """A PyTorch step under ``torch.cuda.stream(s)`` (non-blocking, as PyTorch makes its
    streams; its tensors imported in the loader's thread, on the default stream): ``s``
    waits for ``last_event`` after taking a batch, and the default stream waits for ``s``
    before the batch is let go (``torch.cuda.default_stream().wait_stream(s)``), as
    docs/gpu.md says. Without the second rule the loader would write the batch's memory
    under the step's kernels, and the emulated device refuses it."""
    torch_gpu = _stand_in("torch")
    import cupy
    from cupy.cuda import RaceError

    from emulated_gpu.frameworks import settle, sleep
    from tabloader.tensors import TorchTensors

    monkeypatch.setattr(TorchTensors, "tensor", lambda self, array: torch_gpu.from_dlpack(array))
    loader = _converting_loader(tmp_path, TorchTensors())
    side = cupy.cuda.Stream(non_blocking=True)

    def train() -> list[Any]:
        copies = []
        with torch_gpu.use(side):
            for batch in loader:
                side.wait_event(loader.backend.xp.last_event)  # the first rule
                sleep(0.002, side)
                torch_gpu.step(batch)
                copies.append(torch_gpu.copy(batch["x"]))
                if rules == "both":
                    cupy.cuda.Stream.null.wait_event(side.record())  # the second rule
                del batch
            torch_gpu.synchronize()
        return copies

    if rules == "both":
        copies = train()
        assert sorted(np.concatenate(copies).tolist()) == (np.arange(1024) / 4.0).tolist()
    else:
        try:
            with pytest.raises(RaceError):
                train()
        finally:
            settle()


# -- TensorFlow: the recipe of docs/gpu.md ----------------------------------------------------


def _recipe(name: str) -> str:
    """The code block of docs/gpu.md that follows ``name:`` ("TensorFlow (needs a CUDA
    GPU)")."""
    page = (ROOT / "docs" / "gpu.md").read_text()
    after = page.split(name, 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@gpu
@pytest.mark.tensorflow
def test_the_tensorflow_recipe_of_the_gpu_page_reads_complete_batches_in_order(
    tmp_path, monkeypatch
):
    """docs/gpu.md's TensorFlow recipe, run with TensorFlow's device side: TensorFlow is
    told no stream (its DLPack import takes a capsule) and reads on a non-blocking stream
    of its own, so a batch must be complete on the host's word before it reads, and its
    memory written again only after TensorFlow's queued work. Each step is queued behind
    a slow kernel, as a busy TensorFlow's are."""
    tf_gpu = _stand_in("tensorflow")
    import types

    import tensorflow as tf

    from emulated_gpu.frameworks import sleep

    fake = types.ModuleType("tensorflow")
    fake.experimental = types.SimpleNamespace(  # type: ignore[attr-defined]
        dlpack=types.SimpleNamespace(from_dlpack=tf_gpu.from_dlpack)
    )
    fake.test = types.SimpleNamespace(  # type: ignore[attr-defined]
        experimental=types.SimpleNamespace(sync_devices=tf_gpu.sync_devices)
    )
    fake.config = tf.config  # type: ignore[attr-defined]
    fake.int64, fake.float32 = np.dtype("int64"), np.dtype("float32")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorflow", fake)
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "train"
    data.mkdir()
    ids = np.arange(2048)
    for f in range(2):
        part = slice(f * 1024, (f + 1) * 1024)
        table = pa.table({"C1": ids[part], "I1": ids[part] / 4.0, "label": (ids[part] % 2) * 1.0})
        pq.write_table(table, data / f"part-{f}.parquet", row_group_size=256)
    code = _recipe("TensorFlow (needs a CUDA GPU):").replace('"data/train/"', repr(str(data)))
    code = code.split("for batch in loader:")[0]  # the loop is the test's own
    namespace: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "docs/gpu.md", "exec"), namespace)
    loader = namespace.get("loader")
    if loader is None:  # a recipe that only defines the transform
        loader = _quietly(
            tabloader.Loader, str(data), cats=["C1"], conts=["I1"], labels=["label"],
            batch_size=256, shuffle=True, seed=0, device="cuda",
            transform=namespace["to_tf"],
        )  # fmt: skip
    for _ in range(2):
        seen = []
        for batch in loader:
            sleep(0.002, tf_gpu.stream)
            tf_gpu.step(batch)
            seen.append(tf_gpu.copy(batch["C1"]))
            del batch
        tf_gpu.sync_devices()
        assert sorted(np.concatenate(seen).ravel().tolist()) == list(range(2048))


# -- the race test of the GPU host run, smaller ------------------------------------------------


@gpu
@pytest.mark.slow
def test_the_race_test_of_the_gpu_host_run_passes_on_the_emulated_device(tmp_path):
    """``benchmarks/gpu_race.py`` (the race test of the GPU host run) on the emulated device:
    every framework it can run here, streamed and cached, a consumer slower than the
    loader, every batch's checksum against the CPU backend's."""
    import cupy

    if not getattr(cupy, "__emulated__", False):
        pytest.skip("the GPU host run runs it on a GPU")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_race.py"),
            *("--rows", "6000", "--row-group-size", "250", "--batch-size", "100"),
            *("--min-batches", "60", "--step-seconds", "0.001"),
            *("--data", str(tmp_path / "data")),
            *("--out", str(tmp_path / "race.json")),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "EMULATED" in output
    rows = re.findall(r"^(\S.*?) +(\d+) batches +(\d+) mismatches", output, re.M)
    assert len(rows) >= 6, output
    assert all(int(batches) >= 60 and mismatches == "0" for _, batches, mismatches in rows), output
