"""The frameworks tabloader hands batches to, in one list.

``tabloader bench --framework`` times each one's adapter, ``tabloader selftest`` checks
each one that is installed, and the docs name each of them; a framework added here is
timed, checked and documented, or a test says what is missing.

Examples:
    >>> [framework.name for framework in FRAMEWORKS]
    ['torch', 'tensorflow', 'jax']
    >>> framework_titles()
    'PyTorch, Keras and JAX'
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FRAMEWORKS", "Framework", "framework_titles"]


@dataclass(frozen=True)
class Framework:
    """One framework and its adapter.

    Attributes:
        name: What ``--framework`` takes, and the adapter's module, ``tabloader.<name>``
            (``tabloader.tensorflow`` is the Keras adapter under NVTabular's path).
        title: What the adapter is called in prose: ``"the PyTorch adapter"``.
        packages: What its adapter imports, whose versions ``selftest`` prints.
        classes: The adapter's classes, as ``bench --framework``'s help names them.
        measured: What ``bench`` times through it, in its report's words.
    """

    name: str
    title: str
    packages: tuple[str, ...]
    classes: str
    measured: str


FRAMEWORKS: tuple[Framework, ...] = (
    Framework(
        name="torch",
        title="PyTorch",
        packages=("torch",),
        classes="TorchAsyncItr and DLDataLoader",
        measured="TorchAsyncItr through DLDataLoader (torch tensors)",
    ),
    Framework(
        name="tensorflow",
        title="Keras",
        packages=("keras", "tensorflow"),
        classes="KerasSequenceLoader",
        measured="KerasSequenceLoader, as model.fit reads it (TensorFlow tensors)",
    ),
    Framework(
        name="jax",
        title="JAX",
        packages=("jax",),
        classes="JaxLoader",
        measured="JaxLoader (jax.Array per column, on the loader's JAX device)",
    ),
)
"""Every framework with an adapter, in the order the command line and the docs list them."""


def framework_titles() -> str:
    """The frameworks' titles as prose lists them: ``"PyTorch, Keras and JAX"``."""
    *others, last = [framework.title for framework in FRAMEWORKS]
    return f"{', '.join(others)} and {last}" if others else last
