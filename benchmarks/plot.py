"""Draw the throughput report's chart from ``throughput.py`` results.

``throughput.py --plot out.png`` draws it directly; to redraw from a saved report:

    python benchmarks/plot.py benchmarks/results/cpu.json benchmarks/results/cpu.png

One panel per dataset size: each case's first epoch and later epochs as ratios to the
parquet decode limit of the same run. A last panel: each case's peak memory per size.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

MiB = 2**20


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = report["sizes"]
    names = [r["name"] for r in sections[0]["results"]]
    height = 0.42 * len(names) + 1.8
    fig, axes = plt.subplots(
        1, len(sections) + 1, figsize=(6 + 3.6 * len(sections), height), sharey=True
    )
    positions = range(len(names))
    for ax, section in zip(axes, sections, strict=False):
        by_name = {r["name"]: r for r in section["results"]}
        # The copy ceiling is far beyond the rest: clip the axis, label the value.
        shown = [
            r.get(key, 0.0)
            for r in section["results"]
            if r["group"] != "ceiling"
            for key in ("first_ratio", "later_ratio")
        ]
        right = max([*shown, 1.0]) * 1.3
        for offset, key, colour, label in (
            (-0.2, "first_ratio", "#1f77b4", "first epoch"),
            (0.2, "later_ratio", "#aec7e8", "later epoch"),
        ):
            values = [by_name.get(n, {}).get(key, 0.0) for n in names]
            bars = ax.barh(
                [p + offset for p in positions], values, height=0.4, color=colour, label=label
            )
            for bar, value in zip(bars, values, strict=True):
                if value:
                    ax.text(
                        min(value, right),
                        bar.get_y() + 0.2,
                        f" {value:.2f}",
                        va="center",
                        fontsize=7,
                    )
        ax.set_xlim(0, right * 1.12)
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_title(f"{section['rows'] / 1e6:g}M rows: x decode limit", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    ax = axes[-1]
    for k, section in enumerate(sections):
        by_name = {r["name"]: r for r in section["results"]}
        values = [by_name.get(n, {}).get("peak_rss", 0) / MiB for n in names]
        step = 0.8 / len(sections)
        ax.barh(
            [p - 0.4 + step * (k + 0.5) for p in positions],
            values,
            height=step,
            label=f"{section['rows'] / 1e6:g}M rows",
        )
    ax.set_title("peak RSS, MiB", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    axes[0].set_yticks(list(positions), names, fontsize=8)
    axes[0].invert_yaxis()
    machine = report["machine"]
    load = ", ".join(f"{x:.1f}" for x in machine["load_before"])
    fig.suptitle(
        f"tabloader, fresh process per case, batch {report['config']['batch_size']:,}; "
        f"{machine['cpus']} cores, load {load} at start ({machine['started']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="JSON written by throughput.py --json")
    parser.add_argument("out", type=Path, help="PNG to write")
    args = parser.parse_args(argv)
    plot(json.loads(args.report.read_text()), args.out)


if __name__ == "__main__":
    main()
