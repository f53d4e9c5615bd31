"""The ``tabloader`` command: look at a dataset's layout, and measure how fast it loads.

tabloader inspect data/train/
tabloader bench data/train/ --cats C1,C2 --conts I1 --labels label --batch-size 65536
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import numpy as np

from tabloader.dataset import Dataset, _ParquetSource
from tabloader.errors import TabloaderError
from tabloader.loader import Loader

__all__ = ["layout_warnings", "main"]

TINY_ROW_GROUP = 16_384
"""Below this many rows per row group, per-row-group overhead dominates reading."""
HUGE_ROW_GROUP_BYTES = 1 << 30
"""Above this many decoded bytes, one row group strains the chunk buffer."""


def layout_warnings(
    partition_rows: np.ndarray, partition_bytes: np.ndarray | None, *, ranks: int
) -> list[str]:
    """Warnings about a layout that will load slowly (pure, for ``inspect``).

    Examples:
        >>> layout_warnings(np.array([100] * 40), None, ranks=1)[0].split(":")[0]
        'tiny row groups'
    """
    found = []
    median = float(np.median(partition_rows)) if len(partition_rows) else 0.0
    if len(partition_rows) > 1 and median < TINY_ROW_GROUP:
        found.append(
            f"tiny row groups: the median row group holds {median:,.0f} rows; reading pays a "
            f"fixed cost per row group, so aim for 64k-1M rows (row_group_size= when writing)"
        )
    if partition_bytes is not None and len(partition_bytes):
        largest = int(partition_bytes.max())
        if largest > HUGE_ROW_GROUP_BYTES:
            found.append(
                f"huge row groups: the largest holds {largest / 2**30:.1f} GiB uncompressed; "
                "a chunk holds at least one row group, so memory use will be high. Write "
                "smaller ones"
            )
    if ranks > len(partition_rows):
        found.append(
            f"more ranks ({ranks}) than row groups ({len(partition_rows)}): every rank will "
            "decode whole row groups to use a fraction of them. Write more, smaller row groups"
        )
    return found


def _row_group_bytes(dataset: Dataset) -> np.ndarray | None:
    source = dataset._source
    if not isinstance(source, _ParquetSource):
        return None
    return np.array(
        [
            source.metadata(int(f)).row_group(int(g)).total_byte_size
            for f, g in zip(source.part_file, source.part_row_group, strict=True)
        ],
        dtype=np.int64,
    )


def inspect(args: argparse.Namespace, out: TextIO) -> int:
    dataset = Dataset(args.path)
    rows = dataset.partition_rows
    sizes = _row_group_bytes(dataset)
    out.write(f"{dataset.num_rows:,} rows in {dataset.num_partitions:,} row groups")
    out.write(f" of {len(dataset.files):,} files\n" if dataset.files else "\n")
    if len(rows):
        out.write(
            f"rows per row group: min {rows.min():,}, median {int(np.median(rows)):,}, "
            f"max {rows.max():,}\n"
        )
    if sizes is not None and len(sizes):
        out.write(
            f"uncompressed bytes per row group: median {int(np.median(sizes)) / 2**20:,.1f} MiB\n"
        )
    source = dataset._source
    if isinstance(source, _ParquetSource):
        out.write("files:\n")
        per_file = np.bincount(source.part_file, weights=rows, minlength=len(dataset.files))
        groups = np.bincount(source.part_file, minlength=len(dataset.files))
        shown = min(len(dataset.files), args.max_files)
        for path, n, g in zip(dataset.files[:shown], per_file, groups, strict=False):
            out.write(f"  {path}  {int(n):,} rows, {int(g)} row groups\n")
        if shown < len(dataset.files):
            out.write(f"  ... and {len(dataset.files) - shown:,} more\n")
    out.write("schema:\n")
    for field in dataset.schema:
        out.write(f"  {field.name}: {field.type}\n")
    for warning in layout_warnings(rows, sizes, ranks=args.ranks):
        out.write(f"warning: {warning}\n")
    return 0


def _names(values: Sequence[str] | None) -> list[str]:
    return [n for v in values or () for n in v.split(",") if n]


def _progress(done: int, total: int, started: float, err: TextIO) -> None:
    if not err.isatty():
        return
    width = 30
    filled = int(width * done / max(total, 1))
    rate = done / max(time.perf_counter() - started, 1e-9)
    err.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} batches, {rate:,.1f}/s")
    err.flush()


def _batches(args: argparse.Namespace, options: dict[str, Any]) -> tuple[Iterable[Any], Loader]:
    """The iterable to time, and the core loader whose statistics describe it."""
    dataset = Dataset(args.path)
    if args.framework == "torch":
        from tabloader.torch import DLDataLoader, TorchAsyncItr

        torch_dataset = TorchAsyncItr(dataset, **options)
        torch_loader = DLDataLoader(torch_dataset, batch_size=None, collate_fn=lambda x: x)
        return torch_loader, torch_dataset.loader
    if args.framework == "tensorflow":
        from tabloader.tensorflow import KerasSequenceLoader

        keras_loader = KerasSequenceLoader(
            dataset,
            batch_size=options["batch_size"],
            cat_names=options["cats"],
            cont_names=options["conts"],
            label_names=options["labels"],
            shuffle=options["shuffle"],
            shuffle_within_batch=options["shuffle_within_batch"],
            seed=options["seed"],
        )

        def items() -> Iterable[Any]:
            for i in range(len(keras_loader)):
                yield keras_loader[i]
            keras_loader.on_epoch_end()

        return _Repeatable(items), keras_loader.loader
    loader = Loader(dataset, **options)
    return loader, loader


class _Repeatable:
    def __init__(self, make: Any) -> None:
        self.make = make

    def __iter__(self) -> Any:
        return iter(self.make())


def _loader_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "cats": _names(args.cats),
        "conts": _names(args.conts),
        "labels": _names(args.labels),
        "batch_size": args.batch_size,
        "shuffle": args.shuffle,
        "shuffle_within_batch": not args.stored_order,
        "seed": args.seed,
    }


def bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    iterable, loader = _batches(args, _loader_options(args))
    batches = len(loader)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        epoch_started = time.perf_counter()
        for i, _ in enumerate(iterable, 1):
            _progress(i, batches, epoch_started, err)
        if err.isatty():
            err.write("\n")
        seconds = time.perf_counter() - epoch_started
        out.write(
            f"epoch {epoch}: {loader.dataset.num_rows // loader.global_size:,} rows in "
            f"{seconds:.2f}s\n"
        )
    elapsed = time.perf_counter() - started
    stats = loader.stats()
    rows = stats.rows if stats.rows else batches * args.batch_size * args.epochs
    out.write(
        f"{rows / elapsed:,.0f} rows/s, {stats.batches / elapsed:,.1f} batches/s "
        f"({args.framework})\n"
        f"background: read {stats.read_seconds:.2f}s, assemble {stats.assemble_seconds:.2f}s, "
        f"shuffle and slice {stats.batch_seconds:.2f}s\n"
        f"waiting for data: {stats.wait_seconds:.2f}s of {stats.consume_seconds:.2f}s "
        f"({stats.input_bound_fraction:.0%} input-bound)\n"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloader", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("inspect", help="files, row groups, rows, schema, layout warnings")
    p.add_argument("path", nargs="+", help="files, directories, globs or URLs")
    p.add_argument("--ranks", type=int, default=1, help="ranks the data will be split across")
    p.add_argument("--max-files", type=int, default=20, help="files to list")

    p = commands.add_parser("bench", help="time full epochs and say where the time goes")
    p.add_argument("path", nargs="+", help="files, directories, globs or URLs")
    p.add_argument("--cats", action="append", help="categorical columns, comma separated")
    p.add_argument("--conts", action="append", help="continuous columns, comma separated")
    p.add_argument("--labels", action="append", help="label columns, comma separated")
    p.add_argument("--batch-size", type=int, default=65_536)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    p.add_argument(
        "--stored-order",
        action="store_true",
        help="shuffled batches keep their rows in stored order (shuffle_within_batch=False)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--framework", choices=["none", "torch", "tensorflow"], default="none")
    p = commands.add_parser(
        "selftest", help="check the install on generated data: parity, adapters, memory, speed"
    )
    p.add_argument("--device", default=None, help="cpu (default), cuda or cuda:N")
    p.add_argument("--rows", type=int, default=200_000, help="rows of generated data")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "selftest":
        from tabloader.selftest import run_selftest

        return run_selftest(args.device, rows=args.rows)
    if len(args.path) == 1:
        args.path = args.path[0]
    try:
        if args.command == "inspect":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # it reports layout problems itself
                return inspect(args, sys.stdout)
        return bench(args, sys.stdout, sys.stderr)
    except TabloaderError as error:
        sys.stderr.write(f"tabloader: error: {error}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
