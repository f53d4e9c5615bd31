"""Where a loader's threads spend shuffled epochs, sampled in pure Python (``sampler.py``).

    python benchmarks/profile_threads.py --device cuda                 # 4M rows, GPU
    python benchmarks/profile_threads.py --device cuda --modes columns,torch --out p.txt

For hosts without py-spy or perf (the GPU host). For each mode, in this one process: the
loader is built, runs one epoch unsampled (the first epoch, whose costs differ; sampled
and reported apart with ``--first``), then ``--epochs`` more under the sampler (at
least ``--seconds`` of them), and the report gives each epoch's rate,
``loader.stats()``, and per thread (the reader, the batcher, the training loop's main
thread) the share spent waiting, the shares by library and the busiest lines and
functions. Modes, all shuffled:

- ``columns``, ``stacked``: the core ``Loader`` in that layout;
- ``torch``: ``TorchAsyncItr`` through ``DLDataLoader`` (what a training loop iterates);
- ``cache``: ``Loader(cache="memory")``, whose sampled epochs are served from the cache.

A mode that fails is reported with its error and the others still run. The data is the
benchmark's (``throughput.py`` writes it under ``--data`` when missing). With
``profile_stages.py`` (py-spy) for the CPU backend's stages on a machine that has py-spy.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("columns", "stacked", "torch", "cache")
THREADS = ("tabloader", "MainThread")
"""The threads reported: the loader's (named ``tabloader-*``) and the consumer."""


def _epoch_runner(mode: str, files: list[str], device: str, batch_size: int) -> Callable[[], int]:
    """One epoch of ``mode``: returns the rows delivered, with the device synchronised."""
    import tabloader
    from tabloader.synthetic import CATS, CONTS, LABELS

    options: dict[str, Any] = {
        "cats": CATS,
        "conts": CONTS,
        "labels": LABELS,
        "batch_size": batch_size,
        "seed": 0,
        "shuffle": True,
    }
    batches: Iterable[Any]
    if mode == "torch":
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        dataset = TorchAsyncItr(tabloader.Dataset(files), device=device, **options)
        batches = DLDataLoader(dataset, batch_size=None, collate_fn=lambda b: b, num_workers=0)
        loader = dataset.loader
    else:
        extra = {"layout": "stacked"} if mode == "stacked" else {}
        if mode == "cache":
            extra = {"cache": "memory"}
        loader = batches = tabloader.Loader(files, device=device, **options, **extra)

    def run() -> int:
        rows = 0
        for batch in batches:
            first = batch[0] if isinstance(batch, tuple) else next(iter(batch.values()))
            rows += int(first.shape[0])
        if loader.device.is_cuda:
            import cupy

            with cupy.cuda.Device(loader.device.index) as current:
                current.synchronize()
        return rows

    run.loader = loader  # type: ignore[attr-defined]
    return run


def profile_mode(
    mode: str,
    files: list[str],
    *,
    device: str,
    batch_size: int,
    epochs: int,
    seconds: float,
    interval: float,
    top: int,
    first: bool = False,
) -> str:
    """The report of one mode (its error's traceback when it fails); with ``first``, the
    first epoch sampled and reported on its own too."""
    from sampler import Sampler

    try:
        run = _epoch_runner(mode, files, device, batch_size)
        lines = []
        sampler = Sampler(interval)
        started = time.perf_counter()
        if first:
            with sampler:
                rows = run()
        else:
            rows = run()
        took = time.perf_counter() - started
        sampled = "sampled" if first else "not sampled"
        lines.append(f"first epoch ({sampled}): {rows / took:,.0f} rows/s, {took:.3f} s")
        if first:
            lines.append(sampler.report(top=top, threads=THREADS))
            lines.append("-- later epochs")
            sampler = Sampler(interval)
        done = 0
        with sampler:
            begun = time.perf_counter()
            while done < epochs or time.perf_counter() - begun < seconds:
                started = time.perf_counter()
                rows = run()
                took = time.perf_counter() - started
                done += 1
                lines.append(f"epoch {done + 1}: {rows:,} rows, {rows / took:,.0f} rows/s")
        lines.append(f"loader.stats(): {run.loader.stats()}")  # type: ignore[attr-defined]
        lines.append(sampler.report(top=top, threads=THREADS))
        return "\n".join(lines)
    except Exception:
        return "failed:\n" + traceback.format_exc().strip()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--rows-per-file", type=int, default=500_000)
    parser.add_argument("--row-group-size", type=int, default=131_072)
    parser.add_argument("--batch-size", type=int, default=65_536)
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--modes", default=",".join(MODES), help="default: %(default)s")
    parser.add_argument("--epochs", type=int, default=3, help="sampled epochs per mode")
    parser.add_argument("--seconds", type=float, default=0.0, help="sample at least this long")
    parser.add_argument("--interval", type=float, default=0.005, help="seconds between samples")
    parser.add_argument("--top", type=int, default=10, help="lines and functions per thread")
    parser.add_argument(
        "--first", action="store_true",
        help="sample each mode's first epoch too (the first mode's is the process's first)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from throughput import dataset

    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    files = dataset(args.rows, args.rows_per_file, args.row_group_size, args.data)
    sections = [
        f"Shuffled epochs on {args.device}, {args.rows:,} rows, batch {args.batch_size:,}, "
        f"sampled every {1e3 * args.interval:g} ms in pure Python (benchmarks/sampler.py)"
    ]
    for mode in args.modes.split(","):
        print(f"profiling {mode} ...", flush=True)
        report = profile_mode(
            mode,
            files,
            device=args.device,
            batch_size=args.batch_size,
            epochs=args.epochs,
            seconds=args.seconds,
            interval=args.interval,
            top=args.top,
            first=args.first,
        )
        sections.append(f"\n######## {mode}\n{report}")
        if args.out:  # after every mode: a run stopped half-way keeps the modes done
            args.out.write_text("\n".join(sections) + "\n")
    text = "\n".join(sections) + "\n"
    print(text)
    return text


if __name__ == "__main__":
    main()
