"""The Keras suite on Keras' JAX and PyTorch backends, each in a pytest session of its own.

Keras fixes its backend when it is first imported, so one session cannot run the suite
on two backends. This session runs ``test_keras.py`` and the contract suite's Keras
adapters on the backend Keras picked (TensorFlow unless ``KERAS_BACKEND`` says
otherwise); the tests here run the same files under ``KERAS_BACKEND=jax`` and ``torch``
in subprocesses, on the CPU and, for the tests marked ``gpu``, on the emulated GPU
(``tests/emulated_gpu``). On a GPU host, run them directly:
``KERAS_BACKEND=jax python -m pytest -m gpu tests/test_keras.py``.
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
SUITE = ["tests/test_keras.py", "tests/test_contract.py", "-k", "keras"]
BACKENDS = {"jax": "jax", "torch": "torch"}


def _session(backend: str, *args: str, emulated: bool = False) -> tuple[str, int]:
    """Run pytest with ``args`` under ``KERAS_BACKEND=backend``; its output and passes."""
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"needs {backend}")
    env = {k: v for k, v in os.environ.items() if k not in ("TABLOADER_DEVICE", "PYTHONPATH")}
    paths = [*FULL] if emulated else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT / "src")])
    env["KERAS_BACKEND"] = backend
    env["TABLOADER_EMULATED_GPUS"] = "2"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-20000:]
    assert f"keras backend: {backend}" in output  # the session says what it ran on
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None, output[-5000:]
    return output, int(passed.group(1))


@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_the_keras_suite_passes_on_the_backend(backend):
    """On the CPU, and its GPU tests on the emulated device (where no real cudf is)."""
    emulated = importlib.util.find_spec("cudf") is None
    output, passed = _session(backend, *SUITE, emulated=emulated)
    gpu = re.search(r"GPU-marked tests ran on the emulated device", output)
    assert (gpu is not None) == emulated, output[-5000:]
    assert passed >= 45 + (20 if emulated else 0), output[-5000:]
