"""Your files as parquet the loader reads fast: CSV, TSV, JSON lines or parquet in.

``tabloader convert raw/*.csv data --split valid=0.1`` (or [`convert`][tabloader.convert.convert])
reads every file, in order, and writes parquet:

- **one schema for every file**: integer columns, and text columns of whole numbers
  (pandas writes ``123.0`` for integers with nulls), become ``int64``; other floating
  point columns ``float32``; text stays text; ``schema=``
  (``--schema``) sets the type of any column. A value that would change (a fraction in
  a column of whole numbers, an id ``float32`` cannot hold, a value beyond ``int64``) is
  an error naming the file, the column, the value and the row;
- **row groups sized for the loader**: 131,072 rows (fewer for wide rows, so that one
  holds about 64 MiB), never below the size the loader warns about, and files of 16 row
  groups;
- **splits by a seeded hash of each row as read** (``split={"valid": 0.1}``), or of a
  key (``split_key="user_id"``): a row's split depends on those values and the seed
  only, never on the files, their order, the machine or how the columns are encoded;
  the rest is ``train``;
- **categories as ids** (``categorify=["user_id"]``): ids by frequency, counted on the
  training split only, written to ``DEST/_vocabulary`` and reused for later data
  (``vocabulary=``); or ids by hash (``hash_buckets={"item_id": 100_000}``); and the
  parts of timestamps (``time_parts={"event_time": ["hour", "dow"]}``);
- **rows in = rows out**, checked against the written footers before anything is moved
  into place. Files are written into a hidden folder of the destination first, so an
  interrupted conversion leaves the destination as it was.

CSV and TSV files may have a header or not (it is detected: a first line holding no
number is a header), ``names=`` names or renames their columns, empty fields are nulls,
and ``.gz``, ``.bz2`` and ``.zst`` files are read as they are.

Examples:
    >>> import os, tempfile, tabloader
    >>> from tabloader.convert import convert
    >>> tmp = tempfile.mkdtemp()
    >>> with open(os.path.join(tmp, "clicks.csv"), "w") as f:
    ...     rows = "".join(f"u{i % 7},{i / 4},{i % 2}\\n" for i in range(100))
    ...     _ = f.write("user,price,label\\n" + rows)
    >>> result = convert(os.path.join(tmp, "clicks.csv"), os.path.join(tmp, "data"),
    ...                  split={"valid": 0.2}, categorify=["user"], seed=0)
    >>> result.rows_in, sum(result.rows_out.values()), sorted(result.rows_out)
    (100, 100, ['train', 'valid'])
    >>> tabloader.Dataset(os.path.join(tmp, "data", "train")).schema.types
    [DataType(int64), DataType(float), DataType(int64)]
    >>> result.vocabulary  # 7 users, and the ids of unknown users and nulls
    {'user': 9}
"""

from tabloader.convert.categories import CategoryIndex
from tabloader.convert.hashing import column_hashes, row_hashes, split_rows
from tabloader.convert.options import (
    TIME_PARTS,
    Format,
    parse_schema,
    parse_split,
)
from tabloader.convert.run import ConvertResult, convert, row_group_rows_for

__all__ = [
    "TIME_PARTS",
    "CategoryIndex",
    "ConvertResult",
    "Format",
    "column_hashes",
    "convert",
    "parse_schema",
    "parse_split",
    "row_group_rows_for",
    "row_hashes",
    "split_rows",
]
