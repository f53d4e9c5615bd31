"""The race test of the GPU host run: a consumer slower than the loader, every batch checked.

For each framework (PyTorch, JAX, Keras on JAX and on PyTorch, TensorFlow where it is
installed) and each placement (streamed; the decoded cache in GPU memory; in pinned host
memory), a GPU loader feeds a consumer whose reads of each batch are queued behind a slow
kernel: ``torch.cuda._sleep`` on PyTorch's stream, a long ``lax.fori_loop`` inside the
jitted JAX step. The loader so runs ahead, reaches chunk boundaries often (small row
groups, ``prefetch=1``) and writes memory again while the consumer's reads of earlier
batches are still queued. The consumer computes each batch's checksum on its stream,
after the slow kernel, and the checksums are compared with those of the CPU backend's
batches for the same seed: the pass is 0 mismatches in at least ``--min-batches`` batches
per case.

The checksum of a batch weighs each column's values (their 32 bits) by their row and the
columns by their place, modulo 2**32, so a row out of place, a torn row or a value written
over changes it; JAX's ids narrowed to int32 keep their bits.

On the emulated device (``tests/emulated_gpu``) the frameworks are the stand-ins of
``emulated_gpu/frameworks.py`` (PyTorch, XLA and TensorFlow reading on their streams,
told through DLPack as they are, deleting at once as they do) and the slow kernel a
sleep on the emulated clock. Its values are computed at once, so a race there is the
emulated device's ``RaceError``, reported as the case's error. Nothing measured there is
a GPU result.

    python benchmarks/gpu_race.py --rows 400000 --row-group-size 10000 --batch-size 200 \\
        --min-batches 2000 --out race.json

Each framework runs in a process of its own (Keras fixes its backend when imported).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FRAMEWORKS = ("torch", "jax", "keras-jax", "keras-torch", "tensorflow")
PLACEMENTS = {
    "streamed": {},
    "cache in GPU memory": {"cache": "memory", "cache_placement": "device"},
    "cache in pinned memory": {"cache": "memory", "cache_placement": "host"},
}
CATS, CONTS, LABELS = ["c0", "c1"], ["x0", "x1"], ["label"]
MOD = 2**32


# -- the data and the reference ----------------------------------------------------------------


def write_data(directory: Path, rows: int, row_group: int) -> list[str]:
    """Files of ``rows`` rows (ids, a category, floats, a label), row groups of
    ``row_group`` rows, every value a function of the row's id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = directory / f"{rows}-rows-{row_group}-per-row-group"  # reused when the same
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    per_file = max(row_group, rows // 4)
    for start in range(0, rows, per_file):
        ids = np.arange(start, min(rows, start + per_file), dtype=np.int64)
        table = pa.table(
            {
                "c0": ids,
                "c1": (ids * 7919) % 100_003,
                "x0": (ids / 8.0).astype(np.float32),
                "x1": np.sin(ids).astype(np.float32),
                "label": (ids % 2).astype(np.float32),
            }
        )
        path = directory / f"part-{start:09d}.parquet"
        if not path.exists():
            pq.write_table(table, path, row_group_size=row_group)
        paths.append(str(path))
    return paths


def _bits(values: np.ndarray) -> np.ndarray:
    """A column's values as their low 32 bits, unsigned."""
    values = np.ascontiguousarray(values)
    if values.dtype.itemsize == 4:
        return values.view(np.uint32).astype(np.uint64)
    return (values.astype(np.int64) & (MOD - 1)).astype(np.uint64)


def checksum(columns: list[np.ndarray]) -> int:
    """Each column's 32-bit values weighed by their row (1, 2, ...), the columns weighed
    by their place (1, 3, 5, ...), modulo 2**32."""
    total = 0
    for k, column in enumerate(columns):
        weights = np.arange(1, len(column) + 1, dtype=np.uint64)
        total += (int(((_bits(column) * weights) % MOD).sum()) % MOD) * (2 * k + 1)
    return total % MOD


def reference(files: list[str], options: dict[str, Any], epochs: int) -> list[int]:
    """The checksums of the CPU backend's batches, epoch after epoch."""
    import tabloader

    cpu = tabloader.Loader(files, device="cpu", **options)
    return [
        checksum([batch[c] for c in (*CATS, *CONTS, *LABELS)])
        for _ in range(epochs)
        for batch in cpu
    ]


# -- consumers on a GPU ------------------------------------------------------------------------


def _torch_consumer(
    step_seconds: float,
) -> tuple[Callable[..., Any], Callable[[list[Any]], list[int]]]:
    """PyTorch: ``torch.cuda._sleep`` on the current stream, then the checksum there."""
    import torch

    cycles = int(step_seconds * 1.5e9)

    def bits(column: Any) -> Any:
        if column.dtype == torch.float32:
            column = column.view(torch.int32)
        return column.to(torch.int64) & (MOD - 1)

    def consume(columns: list[Any]) -> Any:
        torch.cuda._sleep(cycles)  # the step before the reads
        total = torch.zeros((), dtype=torch.int64, device=columns[0].device)
        for k, column in enumerate(columns):
            weights = torch.arange(1, len(column) + 1, dtype=torch.int64, device=column.device)
            total = total + (((bits(column) * weights) % MOD).sum() % MOD) * (2 * k + 1)
        return total % MOD

    def finish(sums: list[Any]) -> list[int]:
        torch.cuda.synchronize()
        return [int(s.item()) for s in sums]

    return consume, finish


def _jax_consumer(
    step_seconds: float,
) -> tuple[Callable[..., Any], Callable[[list[Any]], list[int]]]:
    """JAX: a jitted step whose long ``lax.fori_loop`` comes before its reads (the weights
    depend on the loop's result), on XLA's compute stream."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def check(columns: list[Any], iterations: Any) -> Any:
        spun = jax.lax.fori_loop(0, iterations, lambda i, a: a * 1.0000001 + 1e-9, jnp.float32(1))
        total = jnp.uint32(0)
        for k, column in enumerate(columns):
            bits = (
                jax.lax.bitcast_convert_type(column, jnp.uint32)
                if column.dtype.itemsize == 4
                else column.astype(jnp.uint32)
            )
            rows = jnp.arange(1, column.shape[0] + 1, dtype=jnp.uint32)
            weights = jnp.where(spun > -1.0, rows, rows + 1)  # read after the loop
            total = total + (bits * weights).sum(dtype=jnp.uint32) * jnp.uint32(2 * k + 1)
        return total

    probe = [jnp.zeros(256, jnp.float32)]
    check(probe, 1000).block_until_ready()
    started = time.perf_counter()
    check(probe, 100_000).block_until_ready()
    per = max((time.perf_counter() - started) / 100_000, 1e-9)
    iterations = max(1, int(step_seconds / per))

    def consume(columns: list[Any]) -> Any:
        return check(list(columns), iterations)

    def finish(sums: list[Any]) -> list[int]:
        return [int(s) for s in jax.block_until_ready(sums)]

    return consume, finish


def _tensorflow_consumer(
    step_seconds: float,
) -> tuple[Callable[..., Any], Callable[[list[Any]], list[int]]]:
    """TensorFlow: the checksum on its stream (it has no sleep kernel: no slow step)."""
    import tensorflow as tf

    def consume(columns: list[Any]) -> Any:
        total = tf.constant(0, tf.int64)
        for k, column in enumerate(columns):
            if column.dtype == tf.float32:
                column = tf.bitcast(column, tf.int32)
            bits = tf.bitwise.bitwise_and(tf.cast(column, tf.int64), MOD - 1)
            weights = tf.range(1, tf.shape(column, tf.int64)[0] + 1, dtype=tf.int64)
            total += (tf.reduce_sum((bits * weights) % MOD) % MOD) * (2 * k + 1)
        return total % MOD

    def finish(sums: list[Any]) -> list[int]:
        return [int(s.numpy()) for s in sums]

    return consume, finish


# -- consumers on the emulated device --------------------------------------------------------


def _emulated_consumer(
    kind: str, step_seconds: float
) -> tuple[Any, Callable[..., Any], Callable[[list[Any]], list[int]]]:
    """The stand-in of ``kind``, its consumer (a sleep on its stream, then copies of the
    batch's columns made there), and the checksums of those copies once it is done."""
    sys.path.insert(0, str(ROOT / "tests"))
    from emulated_gpu.frameworks import framework, sleep

    side = framework(kind)

    def consume(columns: list[Any]) -> Any:
        sleep(step_seconds, side.stream)
        side.step(columns)
        return [side.copy(column) for column in columns]

    def finish(copies: list[Any]) -> list[int]:
        if hasattr(side, "sync_devices"):
            side.sync_devices()
        else:
            side.synchronize()
        return [checksum(columns) for columns in copies]

    return side, consume, finish


def _patch_tensors(kind: str, side: Any) -> None:
    """The adapters' tensors made by the stand-in (``tabloader.tensors``): imported as the
    framework imports them; JAX's marker queued on its compute stream."""
    from tabloader import tensors

    if kind == "xla":
        tensors.JaxTensors.tensor = lambda self, array: side.from_dlpack(array)  # type: ignore[method-assign]
        tensors.JaxTensors.marker = lambda self, device: side.marker()  # type: ignore[method-assign]
    elif kind == "torch":
        tensors.TorchTensors.tensor = lambda self, array: side.from_dlpack(array)  # type: ignore[method-assign]
    else:
        tensors.TensorflowTensors.tensor = (  # type: ignore[method-assign]
            lambda self, array: side.from_dlpack(array.__dlpack__())
        )
        import tensorflow as tf

        tf.test.experimental.sync_devices = side.sync_devices


# -- the loaders, as each framework's adapter makes them ----------------------------------------


def _columns_of(framework: str, item: Any) -> list[Any]:
    """The batch's columns in checksum order, from what the adapter delivered."""
    if isinstance(item, dict):  # a transform's tensors by column (the emulated PyTorch)
        return [item[c] for c in (*CATS, *CONTS, *LABELS)]
    if framework == "torch":  # TorchAsyncItr: (x_cat [B, cats], x_cont [B, conts], y [B])
        x_cat, x_cont, y = item
        columns = [x_cat[:, j] for j in range(len(CATS))]
        return columns + [x_cont[:, j] for j in range(len(CONTS))] + [y]
    features, labels = item[0], item[1]
    return [features[c] for c in (*CATS, *CONTS)] + [labels]


def _loader(framework: str, files: list[str], options: dict[str, Any], emulated: bool) -> Any:
    import tabloader

    if framework == "torch" and not emulated:
        from tabloader.torch import TorchAsyncItr

        return TorchAsyncItr(files, device="cuda", **options)
    if framework == "torch":  # the stand-in cannot run TorchAsyncItr's torch ops
        from tabloader.tensors import BatchConverter, delivered_dtypes, tensors_for

        torch_tensors = tensors_for("torch")
        convert = BatchConverter(torch_tensors)
        loader = tabloader.Loader(
            files, device="cuda", transform=lambda b: convert.tensors_of(convert.arrays(b)),
            **options,
        )  # fmt: skip
        convert.set_loader(loader, delivered_dtypes(torch_tensors, {}))
        return loader
    if framework == "jax":
        from tabloader.jax import JaxLoader

        return JaxLoader(files, device="cuda", **options)
    from tabloader.keras import KerasSequenceLoader

    keras_options = dict(options)
    return KerasSequenceLoader(
        files,
        device="cuda",
        cat_names=keras_options.pop("cats"),
        cont_names=keras_options.pop("conts"),
        label_names=keras_options.pop("labels"),
        **keras_options,
    )


def _epoch(loader: Any, framework: str) -> Iterator[Any]:
    if framework.startswith("keras") or framework == "tensorflow":
        for index in range(len(loader)):
            yield loader[index]
        return
    yield from loader


def run_case(
    framework: str, placement: str, args: argparse.Namespace, emulated: bool
) -> dict[str, Any]:
    """One framework and placement: batches consumed, checksums compared."""
    files = write_data(Path(args.data), args.rows, args.row_group_size)
    options: dict[str, Any] = {
        "cats": CATS,
        "conts": CONTS,
        "labels": LABELS,
        "batch_size": args.batch_size,
        "shuffle": True,
        "seed": 7,
        "prefetch": 1,
        "parts_per_chunk": 1,
        **PLACEMENTS[placement],
    }
    result: dict[str, Any] = {"framework": framework, "placement": placement, "batches": 0}
    started = time.perf_counter()
    try:
        kind = {"torch": "torch", "keras-torch": "torch", "tensorflow": "tensorflow"}.get(
            framework, "xla"
        )
        if emulated:
            side, consume, finish = _emulated_consumer(kind, args.step_seconds)
            _patch_tensors(kind, side)
        elif kind == "torch":
            consume, finish = _torch_consumer(args.step_seconds)
        elif kind == "xla":
            consume, finish = _jax_consumer(args.step_seconds)
        else:
            consume, finish = _tensorflow_consumer(args.step_seconds)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # small row groups, on purpose
            loader = _loader(framework, files, options, emulated)
        per_epoch = len(loader)
        # a cache is filled by the first epoch and placed by the second: three at least
        epochs = max(3 if "cache" in options else 1, -(-args.min_batches // per_epoch))
        sums = []
        for _ in range(epochs):
            for item in _epoch(loader, framework):
                sums.append(consume(_columns_of(framework, item)))
                del item  # the consumer lets go; its reads are still queued
        got = finish(sums)
        cpu = {k: v for k, v in options.items() if k != "cache_placement"}
        expected = reference(files, cpu, epochs)
        result["batches"] = len(got)
        result["mismatches"] = sum(a != b for a, b in zip(got, expected, strict=False)) + abs(
            len(got) - len(expected)
        )
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {err}"
        result["traceback"] = traceback.format_exc()[-3000:]
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


# -- the driver ------------------------------------------------------------------------------


def _missing(framework: str) -> str | None:
    import importlib.util

    needs = {
        "torch": ["torch"],
        "jax": ["jax"],
        "keras-jax": ["keras", "jax"],
        "keras-torch": ["keras", "torch"],
        "tensorflow": ["keras", "tensorflow"],
    }[framework]
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    return f"needs {', '.join(missing)}" if missing else None


def _emulated() -> bool:
    import cupy

    return bool(getattr(cupy, "__emulated__", False))


def child(framework: str, args: argparse.Namespace) -> None:
    """Run every placement of ``framework`` in this process; one JSON line each."""
    emulated = _emulated()
    for placement in args.placements.split(","):
        print(json.dumps(run_case(framework, placement, args, emulated)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--row-group-size", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--min-batches", type=int, default=2000)
    parser.add_argument("--step-seconds", type=float, default=0.002)
    parser.add_argument("--data", default=str(Path(tempfile.gettempdir()) / "tabloader-race"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--case-timeout", type=float, default=300.0)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args)
        return 0
    write_data(Path(args.data), args.rows, args.row_group_size)
    emulated = _emulated()
    where = "EMULATED device: not GPU results" if emulated else _gpu_name()
    print(f"race test on {where}: a consumer slower than the loader, every batch's checksum "
          f"against the CPU backend's (at least {args.min_batches} batches a case)")  # fmt: skip
    results: list[dict[str, Any]] = []
    for framework in args.frameworks.split(","):
        missing = _missing(framework)
        if missing:
            results.append({"framework": framework, "skipped": missing})
            print(f"{framework:<36} skipped: {missing}", flush=True)
            continue
        env = dict(os.environ)
        if framework.startswith("keras"):
            env["KERAS_BACKEND"] = framework.split("-", 1)[1]
        elif framework == "tensorflow":
            env["KERAS_BACKEND"] = "tensorflow"
        command = [sys.executable, __file__, "--child", framework, *_forwarded(args)]
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=args.case_timeout,
                check=False,
            )  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            found = [json.loads(line) for line in lines]
            if not found:
                found = [{"framework": framework, "placement": "all", "batches": 0,
                          "error": (done.stderr or done.stdout).strip()[-2000:]}]  # fmt: skip
        except subprocess.TimeoutExpired:
            found = [{"framework": framework, "placement": "all", "batches": 0,
                      "error": f"timed out after {args.case_timeout:.0f} s"}]  # fmt: skip
        for result in found:
            results.append(result)
            print(_line(result, args.min_batches), flush=True)
    ran = [r for r in results if "skipped" not in r]
    passed = [r for r in ran if _passed(r, args.min_batches)]
    print(f"{len(passed)} of {len(ran)} cases passed, {len(results) - len(ran)} frameworks skipped")
    if args.out is not None:
        args.out.write_text(json.dumps({"on": where, "results": results}, indent=1))
    return 0 if ran and len(passed) == len(ran) else 1


def _forwarded(args: argparse.Namespace) -> list[str]:
    return [
        *("--placements", args.placements, "--rows", str(args.rows)),
        *("--row-group-size", str(args.row_group_size), "--batch-size", str(args.batch_size)),
        *("--min-batches", str(args.min_batches), "--step-seconds", str(args.step_seconds)),
        *("--data", args.data),
    ]


def _passed(result: dict[str, Any], least: int) -> bool:
    return "error" not in result and result["batches"] >= least and result["mismatches"] == 0


def _line(result: dict[str, Any], least: int) -> str:
    name = f"{result['framework']} {result['placement']}"
    if "error" in result:
        return f"{name:<36} FAILED after {result['batches']} batches: {result['error'][:300]}"
    verdict = "ok" if _passed(result, least) else "FAILED"
    return (
        f"{name:<36} {result['batches']} batches {result['mismatches']} mismatches "
        f"{result['seconds']:.1f} s {verdict}"
    )


def _gpu_name() -> str:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


if __name__ == "__main__":
    sys.exit(main())
