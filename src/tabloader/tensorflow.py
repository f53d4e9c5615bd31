"""The Keras adapter under NVTabular's import path: ``from tabloader.tensorflow import
KerasSequenceLoader, KerasSequenceValidater`` gives the classes of `tabloader.keras`,
on whichever backend Keras runs (TensorFlow, JAX or PyTorch). TensorFlow itself is
imported only when it is Keras' backend, or for ``feature_columns``.
"""

from __future__ import annotations

from tabloader.keras import *  # noqa: F403  (every name of tabloader.keras.__all__)
from tabloader.keras import __all__ as __all__
