"""The GPU suite on the emulated device, run in CI on every push.

Every test marked ``gpu`` (the GPU backend, its parity with the CPU, the contract suite
through the core loader, ``TorchAsyncItr``/``DLDataLoader`` and the Keras loader on a
CUDA device) runs here in a subprocess with the stand-in cudf, cupy and rmm of
``tests/emulated_gpu`` first on the path, through the same code a real GPU runs. Two
GPUs are emulated, so ``cuda:1`` is exercised too. Nothing measured here is a GPU
result: the reports say "emulated". Where a real cudf imports, ``pytest -m gpu`` runs
the same tests on the real GPU instead.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emulated_gpu.paths import FULL

ROOT = Path(__file__).resolve().parents[1]
MIN_GPU_TESTS = 120
"""The suite holds more GPU tests than this; fewer passing means some were not collected."""


def _run_emulated(
    *args: str, gpus: int = 2, timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    """``python args...`` from the repository root, with ``gpus`` emulated GPUs."""
    env = {k: v for k, v in os.environ.items() if k != "TABLOADER_DEVICE"}
    env["PYTHONPATH"] = os.pathsep.join([*FULL, str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["TABLOADER_EMULATED_GPUS"] = str(gpus)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _real_cudf_installed() -> bool:
    return importlib.util.find_spec("cudf") is not None


@pytest.mark.slow
def test_the_gpu_suite_passes_on_the_emulated_device():
    if _real_cudf_installed():
        pytest.skip("a real cudf is installed: `pytest -m gpu` runs the GPU suite on it")
    done = _run_emulated(
        "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests", timeout=1200
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20000:]
    assert "emulated device" in output  # the session says what it ran on
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None, output[-5000:]
    print(f"GPU suite on the EMULATED device (not GPU results): {passed.group(0)}")
    assert int(passed.group(1)) >= MIN_GPU_TESTS, output[-5000:]


@pytest.mark.slow
def test_selftest_passes_on_the_emulated_device():
    if _real_cudf_installed():
        pytest.skip("a real cudf is installed: run `tabloader selftest --device cuda` on it")
    done = _run_emulated("-m", "tabloader.cli", "selftest", "--device", "cuda", "--rows", "20000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "emulated device: results are not GPU results" in done.stdout
    assert "PASS  CPU/GPU parity" in done.stdout
    assert "0 failed" in done.stdout


def test_selftest_says_in_one_line_that_there_is_no_gpu():
    done = _run_emulated("-m", "tabloader.cli", "selftest", "--device", "cuda", gpus=0)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no usable cuda here:"), done.stdout
