"""A vector column against the same values as scalar columns: one epoch each, same run.

Writes ``--rows`` rows holding a ``fixed_size_list<float>[k]`` column ``emb`` and the
same values as ``k`` float32 columns ``e0..e{k-1}`` (an id besides), then times shuffled
epochs of ``Loader(conts=["emb"])`` and ``Loader(conts=["e0", ...])``, each in the
``"columns"`` and ``"stacked"`` layouts, alternating, on one backend. Each figure is the
fastest of ``--rounds`` epochs, in seconds, with the ratio vector / scalars (the goal:
about 1, "as fast as k scalar columns")::

    python benchmarks/vectors_speed.py --rows 1000000 --k 64 --rounds 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import tabloader


def write(directory: Path, rows: int, k: int, files: int = 4) -> str:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    share = rows // files
    for f in range(files):
        values = rng.standard_normal((share, k), dtype=np.float32)
        columns = {"id": np.arange(f * share, (f + 1) * share)}
        columns |= {f"e{j}": values[:, j] for j in range(k)}
        table = pa.table(columns).append_column(
            "emb", pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), k)
        )
        pq.write_table(table, directory / f"part-{f}.parquet", row_group_size=131_072)
    return str(directory)


def epoch(data: str, conts: list[str], layout: str, device: str) -> float:
    loader = tabloader.Loader(
        data,
        cats=["id"],
        conts=conts,
        batch_size=65536,
        shuffle=True,
        seed=0,
        layout=layout,  # type: ignore[arg-type]
        device=device,
    )
    started = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    cases = {"vector": ["emb"], "scalars": [f"e{j}" for j in range(args.k)]}
    with tempfile.TemporaryDirectory() as directory:
        data = write(Path(directory) / "data", args.rows, args.k)
        print(f"{args.rows:,} rows, k={args.k}, {args.rounds} rounds, {args.device} (seconds)")
        for layout in ("columns", "stacked"):
            epoch(data, cases["vector"], layout, args.device)  # warm: page cache, pools
            best = dict.fromkeys(cases, float("inf"))
            for _ in range(args.rounds):
                for case, conts in cases.items():
                    best[case] = min(best[case], epoch(data, conts, layout, args.device))
            ratio = best["vector"] / best["scalars"]
            print(
                f"{layout:8} vector {best['vector']:7.3f}  {args.k} scalars "
                f"{best['scalars']:7.3f}  ratio {ratio:5.2f}"
            )


if __name__ == "__main__":
    main()
