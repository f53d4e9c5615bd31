"""What the training examples share: their flags, where their data comes from, threads, progress.

Every training script takes the same flags for the same things:

- ``--data DIR``: the data to train on. A missing or empty directory is an error that
  names it; nothing is generated behind your back.
- ``--synthetic``: train on generated data instead (written to ``--data``, by default a
  ``synthetic`` folder next to the real data, on the first run and reused after).
- ``--rows``: how many training rows ``--synthetic`` generates.
- ``--epochs``, ``--batch-size``, ``--lr``, ``--embedding-dim``, ``--seed``.
- ``--threads`` (PyTorch scripts): PyTorch's intra-op threads; see :func:`torch_threads`.

Each epoch shows a progress bar with rows/s on a terminal, and a plain line every ten
seconds elsewhere (logs, CI): ``tabloader.Progress``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import tabloader
from tabloader import Progress
from tabloader.synthetic import write_criteo_like
from tabloader.threads import LOADER_THREADS, usable_cores

EXAMPLES = Path(__file__).resolve().parent


def parser(
    doc: str,
    *,
    data: Path,
    rows: int,
    epochs: int,
    batch_size: int,
    lr: float,
    embedding_dim: int,
    torch: bool,
    genres: bool = False,
) -> argparse.ArgumentParser:
    """The flags every training script takes, with this script's defaults (and, with
    ``genres``, ``--without-genres`` for the MovieLens scripts). Generated data goes
    to ``data/synthetic``."""
    synthetic = data / "synthetic"
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog=f"Without --data, the data is read from {_shown(data)}; with --synthetic "
        f"it is generated into {_shown(synthetic)} (once, then reused).",
    )
    parser.add_argument("--data", type=Path, help=f"the data directory (default {_shown(data)})")
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="train on generated data, written to --data when it holds none",
    )
    parser.add_argument(
        "--rows", type=at_least(100), default=rows, help="rows --synthetic generates"
    )
    parser.add_argument("--epochs", type=at_least(1), default=epochs)
    parser.add_argument("--batch-size", type=at_least(1), default=batch_size, help="rows per batch")
    parser.add_argument("--lr", type=float, default=lr, help="learning rate")
    parser.add_argument("--embedding-dim", type=int, default=embedding_dim)
    parser.add_argument("--seed", type=int, default=0)
    if torch:
        parser.add_argument(
            "--threads",
            type=int,
            default=None,
            help="PyTorch intra-op threads (default: the cores the loader leaves free)",
        )
    if genres:
        parser.add_argument(
            "--without-genres",
            action="store_true",
            help="leave the genres out (to compare the AUC with and without them)",
        )
    parser.set_defaults(default_data=data, default_synthetic=synthetic)
    return parser


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def genre_lists(paths: Sequence[str | Path]) -> tuple[int, int]:
    """``(number of genre ids, most genres of one movie)`` of the ``genres`` list column
    across ``paths``, or ``(0, 0)`` when the files have no such column."""
    for path in paths:
        schema = pq.read_schema(path)
        if "genres" not in schema.names or not pa.types.is_list(schema.field("genres").type):
            return 0, 0
    count = tabloader.Dataset([str(p) for p in paths]).cardinalities(["genres"])["genres"]
    longest = 0
    for path in paths:
        column = pq.read_table(path, columns=["genres"]).column("genres")
        longest = max(longest, int(pc.max(pc.list_value_length(column)).as_py() or 0))
    return count, longest


def data_directory(
    args: argparse.Namespace,
    parser: argparse.ArgumentParser,
    *,
    needs: Sequence[str],
    generate: Callable[[Path], Any],
    how_to_get: str,
    announce: bool = True,
) -> Path:
    """The directory to train on, checked to hold ``needs`` (files, or folders of parquet).

    With ``--synthetic``, ``generate(directory)`` writes generated data first when
    ``needs`` are missing. Without it, anything missing is an error naming the path.
    """
    directory: Path = args.data or (args.default_synthetic if args.synthetic else args.default_data)
    missing = [name for name in needs if not _present(directory / name)]
    generated = bool(missing and args.synthetic)
    if generated:
        print(f"writing {args.rows:,} rows of generated data to {_shown(directory)}", flush=True)
        generate(directory)
        missing = [name for name in needs if not _present(directory / name)]
    if missing:
        where = directory / missing[0]
        what = "holds no parquet files" if where.is_dir() else "does not exist"
        parser.error(
            f"{_shown(where)} {what}. Pass --data DIR with {' and '.join(needs)} "
            f"({how_to_get}), or --synthetic to train on generated data"
        )
    if announce and args.synthetic and not generated:
        print(
            f"training on the data already in {_shown(directory)} (--synthetic writes data "
            "only where there is none, so --rows does not apply: remove the directory, or "
            "pass another --data, to generate it again)",
            flush=True,
        )
    elif announce:
        kind = "generated" if generated else "your"
        print(f"training on {kind} data in {_shown(directory)}", flush=True)
    return directory


def parquet_files(directory: Path) -> list[str]:
    """The parquet files in ``directory``, sorted."""
    return sorted(str(p) for p in directory.glob("*.parquet"))


def write_synthetic_criteo(data: Path, rows: int) -> None:
    """``rows`` Criteo-like rows in ``data/train/``, a tenth as many in ``data/valid/``."""
    write_criteo_like(data / "train", rows=rows, files=4, row_group_size=max(rows // 8, 1), seed=0)
    valid_rows = max(rows // 10, 1)
    write_criteo_like(data / "valid", rows=valid_rows, files=1, row_group_size=valid_rows, seed=1)


def write_synthetic_movielens(data: Path, rows: int, *, seed: int = 0) -> dict[str, Any]:
    """Generated ratings in the layout of ``movielens/prepare.py``: ``train.parquet``
    (``rows`` rows), ``valid.parquet`` (a fifth as many) and ``meta.json``.

    Every user and movie has a hidden bias and a user likes a movie when the two add up
    high, so the embeddings have something to learn; three genres follow the movie id,
    as flag columns and as a ``genres`` list column. Not MovieLens data.
    """
    rng = np.random.default_rng(seed)
    users, movies = max(rows // 100, 10), max(rows // 200, 10)
    user_bias, movie_bias = rng.normal(size=users), rng.normal(size=movies)
    genres = ["genre_comedy", "genre_drama", "genre_thriller"]
    counts = {"train": rows, "valid": max(rows // 5, 1)}
    data.mkdir(parents=True, exist_ok=True)
    for split, n in counts.items():
        user = rng.integers(0, users, n)
        movie = rng.integers(0, movies, n)
        liked = user_bias[user] + movie_bias[movie] + 0.5 * rng.normal(size=n) > 0
        columns = {
            "userId": user.astype(np.int64),
            "movieId": movie.astype(np.int64),
            "label": liked.astype(np.float32),
        }
        for k, genre in enumerate(genres):
            columns[genre] = (movie % (k + 2) == 0).astype(np.float32)
        # The same genres as a list column of genre ids, for an embedding bag.
        lists = [[k for k in range(len(genres)) if m % (k + 2) == 0] for m in movie.tolist()]
        table = pa.table({**columns, "genres": pa.array(lists, pa.list_(pa.int64()))})
        pq.write_table(table, data / f"{split}.parquet", row_group_size=131_072)
    meta = {
        "source": "synthetic",
        "rows": counts,
        "cardinalities": {"userId": users, "movieId": movies},
        "genres": genres,
        "genre_names": [g.removeprefix("genre_") for g in genres],
        "label": "generated",
    }
    (data / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve from ranks (ties share their average rank).

    >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    >>> roc_auc(np.array([0, 1, 1]), np.zeros(3))
    0.5
    """
    positive = np.asarray(labels) > 0.5
    scores = np.asarray(scores, dtype=np.float64)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    _, group, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # 1-based rank of the last member of each group of ties
    average = last - (counts - 1) / 2.0
    ranks = np.empty(len(scores))
    ranks[order] = average[group]
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _present(path: Path) -> bool:
    if path.is_dir():
        return any(path.glob("*.parquet"))
    return path.is_file() and path.stat().st_size > 0


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def loader_placement(device: Any) -> dict[str, Any]:
    """``TorchAsyncItr`` keywords that deliver batches on ``device`` (a ``torch.device``).

    On a GPU, the GPU backend reads there when cudf can run; otherwise the CPU backend
    reads and each batch is staged to the GPU (``backend="cpu"``).
    """
    if device.type != "cuda":
        return {"device": "cpu"}
    from tabloader.backends.gpu import gpu_usable

    return {"device": device} if gpu_usable() else {"device": device, "backend": "cpu"}


def torch_threads(requested: int | None, *, ranks_per_machine: int = 1) -> int:
    """Set PyTorch's intra-op threads and return them.

    PyTorch starts one intra-op thread per core, and tabloader runs two background
    threads per loader (plus pyarrow's decoding): on a small machine they fight over the
    cores, and an epoch can take ten times longer (docs/performance.md, "Threads"). The
    rule: leave the loader its threads, ``cores // ranks per machine - 2``, at least 1.
    ``--threads`` or ``OMP_NUM_THREADS`` override it.
    """
    import torch

    if requested is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return torch.get_num_threads()
        requested = max(1, usable_cores() // max(ranks_per_machine, 1) - LOADER_THREADS)
    torch.set_num_threads(max(1, requested))
    return torch.get_num_threads()


def epoch_progress(rows: int, epoch: int) -> Progress:
    """A progress bar (or plain lines off a terminal) for one epoch of ``rows`` rows."""
    return Progress(rows, desc=f"epoch {epoch}", stream=sys.stdout)


def keras_progress(rows: int, batch_size: int) -> Any:
    """A Keras callback showing :func:`epoch_progress` for every training epoch."""
    import keras

    class EpochProgress(keras.callbacks.Callback):  # type: ignore[misc]
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.bar = epoch_progress(rows, epoch + 1)
            self.done = 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            step = min(batch_size, rows - self.done)
            self.done += step
            self.bar.update(step)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.bar.close()

    return EpochProgress()
