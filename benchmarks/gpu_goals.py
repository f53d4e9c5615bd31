"""The GPU goals and side-by-side figures, derived from a GPU report's rows.

``throughput.py`` appends :func:`goals` to the tables of a ``--device cuda`` report (and
so to ``benchmarks/results/gpu.md`` and the generated section of ``docs/gpu.md``). Every
figure is computed from the report alone: redrawing with ``--from-json`` gives the same.

Goals, at every size unless said otherwise, as ratios of rows/s:

- the GPU ``Loader`` to cudf's ``read_parquet`` of the same row groups (measured in the
  same run): shuffled at least 0.7 on the first epoch and 0.8 on later ones; unshuffled
  at least 0.9; the columns and the stacked layouts both;
- ``TorchAsyncItr`` to the core ``Loader`` in the stacked layout it uses: at least 0.9;
- cached epochs (smallest size) to cudf's decode: 10 (``cache="memory"``, shuffled),
  5 (``shuffle="global"``), 2 (the cache in pinned host memory).

The rest is shown without a goal: the hand-written loop, the CPU paths, merlin-dataloader,
and the training step's time alone and fed by the loader.
"""

from __future__ import annotations

import statistics
from typing import Any

from cases_gpu import (
    CPU_REFERENCE,
    CPU_TORCH,
    HANDLOOP,
    PINNED,
    TORCH_DIRECT,
    cpu_loader_name,
    loader_name,
    torch_name,
)
from cases_gpu_cache import DISK_SHUFFLE, MEMORY_GLOBAL, MEMORY_SHUFFLE, PINNED_SHUFFLE
from cases_merlin import MERLIN_GPU
from cases_training import TRAIN_CPU, TRAIN_GPU, TRAIN_GPU_CACHED, TRAIN_JAX

MET, MISSED = "✓", "✗ missed"

RATIO_GOALS: list[tuple[str, str, str, float]] = [
    # (figure, case, measure, at least): ratios to cudf's decode of the same run
    *(
        (f"Loader {mode} ({layout}), {epoch}", loader_name(shuffle, stacked), measure, goal)
        for stacked, layout in ((False, "columns"), (True, "stacked [B, k]"))
        for shuffle, mode, first_goal, later_goal in (
            (True, "shuffle", 0.7, 0.8),
            (False, "no shuffle", 0.9, 0.9),
        )
        for epoch, measure, goal in (
            ("first epoch", "first_ratio", first_goal),
            ("later epochs", "later_ratio", later_goal),
        )
    ),
    ("cache='memory', shuffle: cached epochs", MEMORY_SHUFFLE, "later_ratio", 10.0),
    ("cache='memory', global shuffle: cached epochs", MEMORY_GLOBAL, "later_ratio", 5.0),
    ("cache in pinned host memory, shuffle: cached epochs", PINNED_SHUFFLE, "later_ratio", 2.0),
    ("cache='disk', shuffle: cached epochs", DISK_SHUFFLE, "later_ratio", 0.0),
]
"""A goal of 0 is a figure shown without a goal."""

PAIR_GOALS: list[tuple[str, str, str, float]] = [
    # (figure, case, reference, at least): speed ratios within one size, first and later
    (
        "TorchAsyncItr + DLDataLoader / Loader stacked, shuffle",
        torch_name(True),
        loader_name(True, True),
        0.9,
    ),
    (
        "TorchAsyncItr + DLDataLoader / Loader stacked, no shuffle",
        torch_name(False),
        loader_name(False, True),
        0.9,
    ),
    (
        "TorchAsyncItr, no DataLoader / Loader stacked, shuffle",
        TORCH_DIRECT,
        loader_name(True, True),
        0.9,
    ),
    ("Loader shuffle / hand-written cudf + cupy loop", loader_name(True), HANDLOOP, 0.0),
    ("Loader shuffle / CPU Loader + pinned copies", loader_name(True), PINNED, 0.0),
    ("Loader shuffle / merlin-dataloader on the GPU", loader_name(True), MERLIN_GPU, 0.0),
    (
        "cache='memory' shuffle, cache-filling epoch / Loader shuffle first epoch",
        MEMORY_SHUFFLE,
        loader_name(True),
        0.0,
    ),
    ("CPU Loader shuffle / pyarrow on all cores", cpu_loader_name(True), CPU_REFERENCE, 0.0),
    ("CPU Loader no shuffle / pyarrow on all cores", cpu_loader_name(False), CPU_REFERENCE, 0.0),
    (
        "TorchAsyncItr backend='cpu' to the GPU / pyarrow on all cores",
        CPU_TORCH,
        CPU_REFERENCE,
        0.0,
    ),
    ("TorchAsyncItr backend='cpu' / backend GPU, shuffle", CPU_TORCH, torch_name(True), 0.0),
]
TRAINING = (
    # (figure, training case, the same feed without training, at most fed/alone)
    ("training step fed by TorchAsyncItr(device='cuda')", TRAIN_GPU, torch_name(True), 1.15),
    (
        "training step fed by TorchAsyncItr(device='cuda', cache='memory')",
        TRAIN_GPU_CACHED,
        MEMORY_SHUFFLE,
        1.05,
    ),
    ("training step fed by JaxLoader(device='cuda')", TRAIN_JAX, loader_name(True, False), 0.0),
    ("training step fed by TorchAsyncItr(backend='cpu')", TRAIN_CPU, CPU_TORCH, 0.0),
)
"""A goal of 0 is a figure shown without a goal."""


def _mark(value: float, goal: float) -> str:
    if not goal:
        return ""
    return f" {MET}" if value >= goal else f" {MISSED}"


def _ratio_cell(result: dict[str, Any] | None, measure: str, goal: float) -> str:
    if result is None:
        return "-"
    if measure not in result:
        return "failed"
    value = result[measure]
    if value != value:  # NaN: the limit of that round failed
        return "-"
    return f"{value:.2f}{_mark(value, goal)}"


def _pair_cell(a: dict[str, Any] | None, b: dict[str, Any] | None, goal: float) -> str:
    if a is None or b is None:
        return "-"
    if "first_rows_per_second" not in a or "first_rows_per_second" not in b:
        return "failed"
    first = a["first_rows_per_second"] / b["first_rows_per_second"]
    later = a["later_rows_per_second"] / b["later_rows_per_second"]
    return f"{first:.2f} first, {later:.2f} later{_mark(min(first, later), goal)}"


def _later_seconds(result: dict[str, Any]) -> float:
    good = [x for x in result["runs"] if "error" not in x]
    return statistics.median(s for x in good for s in x["seconds"][1:])


def _training_cell(
    trained: dict[str, Any] | None,
    alone: dict[str, Any] | None,
    batch_size: int,
    most: float = 0.0,
) -> str:
    if trained is None:
        return "-"
    facts = trained.get("facts", {})
    if "step_ms_alone" not in facts or "steps_per_epoch" not in facts:
        return "failed"
    step = facts["step_ms_alone"]
    fed = 1e3 * _later_seconds(trained) / max(1, facts["steps_per_epoch"])
    mark = _mark(-fed / step, -most) if most else ""
    cell = f"{step:.2f} ms alone, {fed:.2f} ms fed ({fed / step - 1:+.0%}){mark}"
    if alone is not None and "later_rows_per_second" in alone:
        loader_ms = 1e3 * batch_size / alone["later_rows_per_second"]
        cell += f"; loader alone {loader_ms:.2f} ms/batch"
    return cell


def _placing_cell(result: dict[str, Any] | None) -> str:
    """The first cached epoch (which places the cache) against a steady one, in seconds."""
    if result is None:
        return "-"
    good = [x for x in result.get("runs", []) if "error" not in x and len(x["seconds"]) > 2]
    if not good:
        return "-" if "first_rows_per_second" in result else "failed"
    placing = statistics.median(x["seconds"][1] for x in good)
    steady = statistics.median(s for x in good for s in x["seconds"][2:])
    return f"{placing:.3f} s, then {steady:.3f} s"


def _device_growth(result: dict[str, Any] | None) -> str:
    """GPU memory after the last epoch against after the second (the first cached one)."""
    if result is None:
        return "-"
    after = [d for d in result.get("device_used_after_epoch", []) if d is not None]
    if len(after) < 3:
        return "-" if "first_rows_per_second" in result else "failed"
    growth = after[-1] / after[1] - 1
    return f"{growth:+.1%}{_mark(-abs(growth), -0.01)}"


def goals(report: dict[str, Any]) -> list[str]:
    """The goals table of a GPU report: one column per dataset size."""
    sections = report["sizes"]
    batch_size = int(report["config"]["batch_size"])
    head = " | ".join(f"{s['rows'] / 1e6:g}M rows" for s in sections)
    lines = [
        f"**GPU goals** (from the rows above: ratios of rows/s; {MET} met, {MISSED}; "
        "- not measured at that size)",
        "",
        f"| figure | goal | {head} |",
        "|---|---|" + "---:|" * len(sections),
    ]
    by_size = [{r["name"]: r for r in s["results"]} for s in sections]
    limit = "x cudf decode"
    for what, name, measure, goal in RATIO_GOALS:
        cells = [_ratio_cell(rows.get(name), measure, goal) for rows in by_size]
        shown = f">= {goal:g}{limit}" if goal else ""
        lines.append(f"| {what} | {shown} | {' | '.join(cells)} |")
    for what, name in (("cache='memory'", MEMORY_SHUFFLE), ("pinned host", PINNED_SHUFFLE)):
        cells = [_placing_cell(rows.get(name)) for rows in by_size]
        lines.append(f"| {what}, shuffle: the epoch placing the cache, then a cached one | "
                     f"| {' | '.join(cells)} |")  # fmt: skip
    cells = [_device_growth(rows.get(MEMORY_SHUFFLE)) for rows in by_size]
    lines.append(
        f"| cache='memory', shuffle: GPU memory, last epoch / second | flat | {' | '.join(cells)} |"
    )
    for what, name, reference, goal in PAIR_GOALS:
        cells = [_pair_cell(rows.get(name), rows.get(reference), goal) for rows in by_size]
        lines.append(f"| {what} | {f'>= {goal:g}' if goal else ''} | {' | '.join(cells)} |")
    for what, name, feed, most in TRAINING:
        cells = [
            _training_cell(rows.get(name), rows.get(feed), batch_size, most) for rows in by_size
        ]
        shown = f"<= {most:g}x alone" if most else ""
        lines.append(f"| {what}: step time | {shown} | {' | '.join(cells)} |")
    lines.append("")
    return lines


def missed(report: dict[str, Any]) -> list[str]:
    """The goal rows missed or failed, one line each (the summary of a GPU run)."""
    return [
        line
        for line in goals(report)
        if line.startswith("| ") and (MISSED in line or "| failed" in line)
    ]
