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


def _python(
    code: str, backend: str, missing: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``python -c code`` under ``KERAS_BACKEND=backend``, with ``missing`` not importable."""
    (tmp_path / f"{missing}.py").write_text(
        f'raise ImportError("No module named {missing}", name={missing!r})\n'
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_nvtabular_import_works_without_tensorflow(tmp_path):
    """A machine without TensorFlow (such as the GPU host) imports tabloader.tensorflow."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("needs jax")
    done = _python(
        "import pyarrow as pa\n"
        "from tabloader.tensorflow import KerasSequenceLoader\n"
        "loader = KerasSequenceLoader(pa.table({'u': [1, 2], 'y': [0.0, 1.0]}), batch_size=2,\n"
        "                             cat_names=['u'], label_names=['y'], device='cpu')\n"
        "print(type(loader[0][0]['u']).__module__.split('.')[0])\n",
        "jax",
        "tensorflow",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "jaxlib"


def test_a_backend_whose_framework_is_missing_says_what_to_install(tmp_path):
    done = _python("import tabloader.keras", "jax", "jax", tmp_path)
    assert done.returncode != 0
    assert "its backend, 'jax' (KERAS_BACKEND), needs that framework: pip install " in done.stderr
    assert "'tabloader[jax]'" in done.stderr
