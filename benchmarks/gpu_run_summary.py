"""The short summary that ends ``gpu_host_run.sh``: each step's outcome, the benchmark's
failed cases and GPU goals, and the profile's headline per thread.

    python benchmarks/gpu_run_summary.py --logs LOGS --out OUT --budget 500 --seconds 480

``LOGS`` holds ``steps.tsv`` (name, status, seconds, limit per step) and each step's log;
``OUT`` the benchmark's ``gpu.json`` and ``profile.txt``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PYTEST_RESULT = re.compile(
    r"\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)|no tests ran"
)
SELFTEST_RESULT = re.compile(r"^\d+ failed, \d+ passed$")
VERDICT = re.compile(r"\d+ of \d+ (cases )?passed")


def _pytest_results(log: str) -> list[str]:
    """pytest's closing lines (``12 passed, 3 skipped in 4.2s``), one per run in the log."""
    return [
        line.strip("= ").strip()
        for line in log.splitlines()
        if PYTEST_RESULT.search(line) and re.search(r" in [\d.]+s", line)
    ]


def step_result(name: str, log: str) -> str:
    """What a step's log says of its outcome, in a few words."""
    if name in ("tests", "frameworks"):
        found = _pytest_results(log)
        if not found and "no framework test files" in log:
            return log.strip().splitlines()[-1]
        return "; ".join(found) or "no pytest summary (stopped?)"
    if name == "selftest":
        lines = [line for line in log.splitlines() if SELFTEST_RESULT.match(line.strip())]
        failing = [line.strip() for line in log.splitlines() if line.strip().startswith("FAIL")]
        return "; ".join([*lines[-1:], *failing[:5]]) or "no verdict line (stopped?)"
    if name in ("race", "memory"):
        verdict = [line for line in log.splitlines() if VERDICT.search(line)]
        failing = [line.strip()[:200] for line in log.splitlines() if "FAILED" in line]
        return "; ".join([*verdict[-1:], *failing[:5]]) or "no verdict line (stopped?)"
    return ""


def bench_lines(report: dict[str, Any]) -> list[str]:
    """Cases measured and failed per size; each failure's last line."""
    lines = []
    for section in report.get("sizes", []):
        results = section["results"]
        failed = [r for r in results if "first_rows_per_second" not in r]
        lines.append(
            f"{section['rows'] / 1e6:g}M rows: {len(results) - len(failed)} cases measured, "
            f"{len(failed)} failed"
        )
        for r in failed:
            error = str(r.get("error", "")).strip().splitlines() or ["(no output)"]
            lines.append(f"  FAILED {r['name']}: {error[-1][:200]}")
    return lines


def profile_lines(text: str) -> list[str]:
    """Per mode: its last epoch's rate and each thread's headline (waiting share)."""
    lines = []
    for block in text.split("\n######## ")[1:]:
        mode, _, body = block.partition("\n")
        epochs = [line for line in body.splitlines() if line.startswith("epoch ")]
        if body.startswith("failed"):
            last = body.strip().splitlines()[-1]
            lines.append(f"{mode}: failed: {last[:200]}")
            continue
        lines.append(f"{mode}: {epochs[-1] if epochs else 'no epoch finished'}")
        lines += [
            f"  {line.strip()}"
            for line in body.splitlines()
            if line.startswith("== thread") or line.strip().startswith("innermost frame by")
        ]
    return lines


def summary(logs: Path, out: Path, budget: float, seconds: float) -> str:
    sys.path.insert(0, str(HERE))
    report: dict[str, Any] = {}
    if (out / "gpu.json").exists():
        report = json.loads((out / "gpu.json").read_text())
    machine = report.get("machine", {})
    lines = [
        f"== GPU run: {machine.get('gpu', 'GPU unknown (see env.txt)')}; "
        f"{seconds:.0f} s of a {budget:.0f} s budget",
        "",
        f"{'step':<11} {'outcome':<16} {'s':>5} {'limit':>6}  result",
    ]
    steps = (logs / "steps.tsv").read_text().splitlines() if (logs / "steps.tsv").exists() else []
    for row in steps:
        name, status, took, limit = row.split("\t")
        log = logs / f"{name}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        result = step_result(name, text)
        if status != "ok" and not result and text.strip():  # why it stopped
            result = text.strip().splitlines()[-1][:200]
        lines.append(f"{name:<11} {status:<16} {took:>5} {limit:>6}  {result}")
    if report:
        import gpu_goals

        if machine.get("emulated") or machine.get("in_process"):
            lines += ["", "!! emulated device or one process: these are NOT GPU figures"]
        lines += ["", "== benchmark", *bench_lines(report), "", *gpu_goals.goals(report)]
        missed = gpu_goals.missed(report)
        lines += [f"{len(missed)} goal rows missed or failed", ""]
    if (out / "profile.txt").exists():
        lines += ["== profile (profile.txt)", *profile_lines((out / "profile.txt").read_text())]
    if (out / "cache-profile.txt").exists():  # its table: cached epochs and the floor
        table = (out / "cache-profile.txt").read_text().split("\n\n")[0]
        lines += ["", "== cached epochs (cache-profile.txt)", *table.splitlines()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--logs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    sys.stdout.write(summary(args.logs, args.out, args.budget, args.seconds))


if __name__ == "__main__":
    main()
