"""Column names from ``tf.feature_column`` columns, for the Keras adapter's
``feature_columns=`` (needs TensorFlow, imported when called, on any Keras backend)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabloader import _deps
from tabloader.errors import InvalidArgumentError

__all__ = ["feature_column_names"]


def feature_column_names(columns: Sequence[Any]) -> tuple[list[str], list[str]]:
    """``(cat_names, cont_names)`` read from ``tf.feature_column`` columns.

    Categorical columns, also wrapped in embedding, indicator or weighted columns, name
    cats; numeric columns, the sources of bucketized columns and the weights of weighted
    columns name conts. Names keep their first-seen order, without repeats.

    Examples:
        >>> import tensorflow as tf
        >>> fc = tf.feature_column
        >>> feature_column_names([
        ...     fc.embedding_column(fc.categorical_column_with_identity("user", 100), 8),
        ...     fc.indicator_column(fc.categorical_column_with_identity("genre", 20)),
        ...     fc.numeric_column("age", (1,)),
        ... ])
        (['user', 'genre'], ['age'])
    """
    tf = _deps.require(
        "tensorflow",
        what="feature_columns",
        otherwise="pass the column names as cat_names=[...] and cont_names=[...]",
    )
    if getattr(tf, "feature_column", None) is None:
        raise InvalidArgumentError(
            f"feature_columns needs tf.feature_column, which TensorFlow {tf.__version__} "
            "does not provide: pass the column names as cat_names=[...] and cont_names=[...]"
        )
    if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
        raise InvalidArgumentError(
            f"feature_columns must be a list of tf.feature_column columns, got {columns!r}"
        )
    kinds: dict[str, str] = {}

    def add(name: str, kind: str, owner: Any) -> None:
        if kinds.setdefault(name, kind) != kind:
            raise InvalidArgumentError(
                f"feature column {owner!r} uses {name!r} as {kind}, but another feature "
                f"column uses it as {kinds[name]}; a column is either categorical or "
                "continuous"
            )

    def walk(column: Any) -> None:
        classes = {cls.__name__ for cls in type(column).__mro__}
        if "FeatureColumn" not in classes:
            raise InvalidArgumentError(
                f"feature_columns must hold tf.feature_column columns, got {column!r}"
            )
        kind = type(column).__name__
        if kind == "NumericColumn" or kind == "BucketizedColumn":
            for name in _raw_keys(column):
                add(name, "cont", column)
        elif kind == "WeightedCategoricalColumn":
            walk(column.categorical_column)
            add(column.weight_feature_key, "cont", column)
        elif kind == "CrossedColumn":
            raise InvalidArgumentError(
                f"crossed feature column {column!r} is not supported: it computes crosses "
                "tabloader does not. List its source columns in cat_names= and cross them "
                "in the model (keras.layers.HashedCrossing)"
            )
        elif hasattr(column, "categorical_column"):  # embedding, indicator, shared embedding
            walk(column.categorical_column)
        elif "CategoricalColumn" in classes and all(isinstance(p, str) for p in column.parents):
            for name in column.parents:
                add(name, "cat", column)
        else:
            raise InvalidArgumentError(
                f"feature column {column!r} is not supported: use categorical, embedding, "
                "indicator, weighted, numeric or bucketized columns, or pass cat_names= and "
                "cont_names= instead"
            )

    for column in columns:
        walk(column)
    return (
        [n for n, k in kinds.items() if k == "cat"],
        [n for n, k in kinds.items() if k == "cont"],
    )


def _raw_keys(column: Any) -> list[str]:
    keys: list[str] = []
    for parent in column.parents:
        keys.extend([parent] if isinstance(parent, str) else _raw_keys(parent))
    return keys
