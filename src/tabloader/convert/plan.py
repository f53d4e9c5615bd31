"""What happens to every batch of rows of a conversion, decided once: `ConvertPlan`.

The plan is a value (it pickles, so that the workers of a Dask cluster follow the same
one): how to read and check the rows, which split each row goes to, how to encode
them and the schema they are written with. One machine and a cluster call the same
two functions per input file: `count_file` (the vocabularies' counts, from the
training rows) and `ConvertPlan.batches` (the rows to write, per split).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tabloader.convert.encode import Encoder, Encodings
from tabloader.convert.hashing import TRAIN, row_hashes, split_rows
from tabloader.convert.inputs import Input, cast_table, read, written_type
from tabloader.errors import InvalidArgumentError

__all__ = ["ConvertPlan", "count_file"]


@dataclass(frozen=True)
class ConvertPlan:
    """Everything a conversion does to a batch of rows.

    Attributes:
        read_schema: The types the inputs are read as (numbers at full width).
        cast_schema: The types written before encoding (int64, float32, ...).
        forced: Columns whose type ``schema=`` gave.
        splits: ``{name: fraction}``, empty for no split.
        seed: The seed of the split's hash.
        split_key: Columns the split hashes; empty: the whole row as read.
        encodings: Categorify, hash, time parts.
        transform: The caller's function, applied after the encodings to each split's
            rows of a batch.
        out_schema: The schema of the files written.
    """

    read_schema: pa.Schema
    cast_schema: pa.Schema
    forced: frozenset[str]
    splits: Mapping[str, float]
    seed: int
    split_key: tuple[str, ...]
    encodings: Encodings
    transform: Callable[[pa.Table], pa.Table] | None
    out_schema: pa.Schema

    @staticmethod
    def output_schema(
        cast_schema: pa.Schema,
        encodings: Encodings,
        transform: Callable[[pa.Table], pa.Table] | None,
    ) -> pa.Schema:
        """The schema written: the encodings' columns, then the transform's result with
        its integers as int64 and floating point as float32."""
        encoded = encodings.output_schema(cast_schema)
        if transform is None:
            return encoded
        sample = transform(encoded.empty_table())
        return pa.schema(
            [
                (f.name, f.type if pa.types.is_null(f.type) else written_type(f.type, whole=False))
                for f in sample.schema
            ]
        )

    def rows(self, item: Input) -> Iterator[tuple[pa.Table, pa.Table, int, int]]:
        """``(rows as read, rows cast, input bytes read, rows before)`` of ``item``."""
        for raw, position, first_row in read(item, self.read_schema):
            table = cast_table(item, raw, self.cast_schema, first_row, forced=self.forced)
            yield raw, table, position, first_row

    def split_of(self, raw: pa.Table) -> dict[str, Any]:
        """Each split's rows of a batch as read: by a seeded hash of the row (or of the
        ``split_key`` columns), never of what the encodings make of it."""
        if not self.splits:
            return {"": None}
        hashed = raw.select(list(self.split_key)) if self.split_key else raw
        return split_rows(row_hashes(hashed, self.seed), self.splits)

    def batches(
        self, item: Input, encoder: Encoder
    ) -> Iterator[tuple[dict[str, pa.Table], int, int]]:
        """``({split: rows to write}, input bytes read, rows read)`` per batch of ``item``.

        The transform is called on each split's rows of a batch, after the split is
        drawn: whatever order it gives them, they stay in their split.
        """
        for raw, table, position, first_row in self.rows(item):
            encoded = encoder.encode(table, item.path, first_row)
            where = f"rows {first_row + 1:,} to {first_row + raw.num_rows:,} of {item.path}"
            parts = {
                name: self._written(
                    encoded if rows is None else encoded.take(rows),
                    item,
                    first_row,
                    f"{where}, split {name!r}" if name else where,
                )
                for name, rows in self.split_of(raw).items()
            }
            yield parts, position, raw.num_rows

    def _written(self, rows: pa.Table, item: Input, first_row: int, where: str) -> pa.Table:
        """``rows`` (``where`` tells which) transformed and cast as written, the transform
        checked: the same number of rows, and the columns and types `output_schema` found."""
        if self.transform is None:
            return cast_table(item, rows, self.out_schema, first_row)
        result = self.transform(rows)
        if not isinstance(result, pa.Table) or result.num_rows != rows.num_rows:
            got = f"{result.num_rows:,} rows" if isinstance(result, pa.Table) else repr(result)
            raise InvalidArgumentError(
                f"transform returned {got} for a batch of {rows.num_rows:,} rows "
                f"({where}): a transform changes what is written, never which "
                "rows. Leave rows out before converting, or mark them in a column"
            )
        if result.column_names != self.out_schema.names:
            raise InvalidArgumentError(
                f"transform returned the columns {result.column_names} for {where}, but "
                f"{self.out_schema.names} for a batch without rows: give it the same columns "
                "whatever the rows"
            )
        for f in self.out_schema:
            made = result.schema.field(f.name).type
            if pa.types.is_null(f.type) and not pa.types.is_null(made):
                raise InvalidArgumentError(
                    f"transform makes column {f.name!r} {made}, but null for a batch without "
                    "rows, and the files' types are those of a batch without rows: give the "
                    f"column its type whatever the rows (pa.array(values, type={made!s}) as a "
                    "pyarrow type, e.g. pa.float64())"
                )
        return cast_table(item, result, self.out_schema, first_row)


def count_file(item: Input, plan: ConvertPlan, add: Callable[[str, Any], None]) -> Iterator[int]:
    """Count the training rows' values of every categorified column of ``item``:
    ``add(column, values)`` per batch; yields the input bytes read after each batch."""
    columns = list(plan.encodings.categorify)
    for raw, table, position, _ in plan.rows(item):
        rows = plan.split_of(raw)
        train = rows.get(TRAIN, rows.get(""))
        chosen = table if train is None else table.take(train)
        for name in columns:
            add(name, chosen.column(name))
        yield position
