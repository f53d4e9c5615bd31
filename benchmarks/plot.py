"""Draw the throughput report's bar chart from ``throughput.py --json`` output.

python benchmarks/throughput.py --json benchmarks/results/cpu.json
python benchmarks/plot.py benchmarks/results/cpu.json benchmarks/results/cpu.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLOURS = {"limit": "#7f7f7f", "tabloader": "#1f77b4", "baseline": "#d62728"}


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = [r["name"] for r in results]
    ratios = [r["ratio_to_limit"] for r in results]
    colours = [COLOURS.get(r["group"], "#2ca02c") for r in results]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.6))
    bars = ax.barh(range(len(names)), ratios, color=colours)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("throughput / pyarrow decode limit (median of rounds)")
    for bar, r in zip(bars, results, strict=True):
        ax.text(
            bar.get_width() + 0.01,
            bar.get_y() + bar.get_height() / 2,
            f"{r['ratio_to_limit']:.3g}x  ({r['rows_per_second'] / 1e6:.3g}M rows/s)",
            va="center",
            fontsize=8,
        )
    config, machine = report["config"], report["machine"]
    ax.set_title(
        f"{config['rows']:,} rows, batch {config['batch_size']:,}, {machine['cpus']} CPUs, "
        f"{machine['device']}",
        fontsize=10,
    )
    ax.set_xlim(0, max(ratios) * 1.45)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="JSON written by throughput.py --json")
    parser.add_argument("out", type=Path, help="PNG to write")
    args = parser.parse_args(argv)
    plot(json.loads(args.report.read_text()), args.out)


if __name__ == "__main__":
    main()
