"""Where a loader's CPU time goes, by pipeline stage, sampled with py-spy.

    python benchmarks/profile_stages.py                       # Loader, shuffle, 4M rows
    python benchmarks/profile_stages.py --no-shuffle --epochs 3 --out profile.txt

Runs ``--epochs`` epochs of the core ``Loader`` on the benchmark data (written by
``throughput.py``) under ``py-spy record --native --threads``, then attributes every
sample of the loader's background threads to the deepest tabloader function on its
stack, grouped into stages: decode (pyarrow reading and decoding row groups), deal
(scattering a chunk's rows into their batches), gather (a shuffled batch's rows from
its window), permutation (drawing and dealing the chunk's order), memory (mapping in
fresh buffers), queue hand-offs, and the rest. Needs ``py-spy`` (``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

STAGES = (
    (
        "decode",
        ("read_row_group", "read_partition", "iter_pieces", "Dataset.", "Source.", "_decode"),
    ),
    ("deal", ("_dealt_segment", "_scatter_rows")),
    ("gather", ("PooledNumpy.take", "_staged", "_cut", "_concat")),
    ("permutation", ("chunk_permutation", "deal_into_batches", "inverse_permutation", "deal")),
    ("memory", ("_map_memory", "BufferPool.")),
    ("arrow to numpy", ("column_to_numpy",)),
    ("cutting a chunk into parts", ("_shuffled_parts", "read_chunks", "EpochPlan.")),
)
WAITING = ("_put", "Prefetcher.__next__", "_stopped")
"""Functions where a thread waits on a queue (py-spy samples some of these waits)."""

CHILD = """
import sys, tabloader
from tabloader.synthetic import CATS, CONTS, LABELS
files, shuffle, epochs = sys.argv[1].split(","), sys.argv[2] == "1", int(sys.argv[3])
loader = tabloader.Loader(files, cats=CATS, conts=CONTS, labels=LABELS, batch_size=65536,
                          seed=0, shuffle=shuffle)
for _ in range(epochs):
    for _ in loader:
        pass
"""


def stage_of(stack: str) -> str | None:
    """The stage of one sampled stack (``frame;frame;...``); None for the main thread
    (imports, the consuming loop) and for waits."""
    frames = stack.split(";")
    if "tabloader/stages.py" not in stack:  # not a background thread of the loader
        return None
    deepest = ""
    for frame in reversed(frames):
        if "tabloader/" in frame:
            deepest = frame.split(" (")[0]
            break
    if any(deepest.startswith(w) for w in WAITING):
        return None
    for stage, markers in STAGES:
        if any(m in deepest for m in markers) or (stage == "decode" and "read_row_group" in stack):
            return stage
    return f"other ({deepest})"


def summarise(raw: Path) -> str:
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        stage = stage_of(stack)
        if stage is not None:
            counts[stage] += int(n)
    total = sum(counts.values()) or 1
    lines = [f"{'stage':<34} {'samples':>8} {'share':>7}"]
    for stage, n in counts.most_common():
        lines.append(f"{stage:<34} {n:>8} {n / total:>7.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--data", type=Path, default=HERE / "data")
    parser.add_argument("--no-shuffle", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rate", type=int, default=100, help="samples per second")
    parser.add_argument("--out", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from throughput import dataset

    files = dataset(args.rows, 500_000, 131_072, args.data)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.raw"
        subprocess.run(
            [
                *("py-spy", "record", "--native", "--threads", "--format", "raw"),
                *("--rate", str(args.rate), "-o", str(raw), "--"),
                *(sys.executable, "-c", CHILD, ",".join(files)),
                *("0" if args.no_shuffle else "1", str(args.epochs)),
            ],
            check=True,
            capture_output=True,
        )
        summary = summarise(raw)
    mode = "no shuffle" if args.no_shuffle else "shuffle"
    text = f"Loader, {mode}, {args.rows:,} rows, {args.epochs} epochs, background threads\n"
    text += summary + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
