"""Files others write: every parquet type pyarrow writes, encrypted parquet, and every table
feature deltalake and pyiceberg write, each with one outcome.

Each case is written by the real writer and read two ways: by the reference reader
(pyarrow, deltalake, pyiceberg) and by tabloader. The outcome is either exactly the
reference's values (row for row, in the dtype tabloader delivers) or a clear refusal: a
tabloader error, raised when the loader is built, that names the column or file and says
what to do. Never a traceback from inside a dependency, and never another value.
"""

from __future__ import annotations

import base64
import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabloader

ROOT = Path(__file__).resolve().parents[1]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


def run_python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a process of its own: a dependency that aborts takes only that one down."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TABLOADER_DEVICE": "cpu"}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


# -- encrypted parquet ---------------------------------------------------------------------


def _encryption(**config: Any) -> Any:
    """pyarrow's encryption properties from a KMS that wraps keys in base64 (a stand-in
    for a key service: the files are encrypted for real, with AES-GCM)."""
    encryption = pytest.importorskip("pyarrow.parquet.encryption")

    class Base64Kms(encryption.KmsClient):  # type: ignore[misc]
        def __init__(self, _config: Any) -> None:
            super().__init__()

        def wrap_key(self, key: bytes, _master: str) -> bytes:
            return base64.b64encode(key)

        def unwrap_key(self, wrapped: bytes, _master: str) -> bytes:
            return base64.b64decode(wrapped)

    factory = encryption.CryptoFactory(Base64Kms)
    settings = encryption.EncryptionConfiguration(footer_key="footer", **config)
    return factory.file_encryption_properties(encryption.KmsConnectionConfig(), settings)


def write_encrypted(path: Path, *, plaintext_footer: bool) -> Path:
    """A file whose column ``secret`` is encrypted with a key of its own, ``x`` not."""
    table = pa.table({"secret": [1, 2, 3], "x": [0.5, 1.5, 2.5]})
    properties = _encryption(
        column_keys={"column": ["secret"]},
        plaintext_footer=plaintext_footer,
        double_wrapping=False,
    )
    with pq.ParquetWriter(path, table.schema, encryption_properties=properties) as writer:
        writer.write_table(table)
    return path


ENCRYPTED = {
    # a plaintext footer (ends with PAR1): pyarrow aborts on the encrypted chunk's metadata
    True: "is an encrypted parquet file: its column(s) secret are encrypted (modular "
    "encryption under a plaintext footer); tabloader has no keys to read encrypted parquet",
    # an encrypted footer (ends with PARE)
    False: "is an encrypted parquet file (its footer is encrypted: it ends with PARE); "
    "tabloader has no keys to read encrypted parquet",
}


@pytest.mark.parametrize("plaintext_footer", [True, False])
def test_an_encrypted_file_is_refused_by_the_loader_naming_it(tmp_path, plaintext_footer):
    path = write_encrypted(tmp_path / "enc.parquet", plaintext_footer=plaintext_footer)
    assert path.read_bytes()[-4:] == (b"PAR1" if plaintext_footer else b"PARE")
    code = (
        "import tabloader\n"
        "try:\n"
        f"    tabloader.Loader({str(path)!r}, cats=['secret'], conts=['x'], batch_size=2)\n"
        "except tabloader.InvalidFileError as err:\n"
        "    print(err)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr  # not SIGABRT from inside pyarrow
    assert done.stdout.startswith(f"{path} {ENCRYPTED[plaintext_footer]}")
    assert "decryption_properties" in done.stdout


@pytest.mark.parametrize("plaintext_footer", [True, False])
def test_inspect_says_a_file_is_encrypted_without_a_traceback(tmp_path, plaintext_footer):
    path = write_encrypted(tmp_path / "enc.parquet", plaintext_footer=plaintext_footer)
    code = f"import sys; from tabloader.cli import main; sys.exit(main(['inspect', {str(path)!r}]))"
    done = run_python(code)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"tabloader: error: {path} {ENCRYPTED[plaintext_footer]}")
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_only_the_unencrypted_columns_of_a_file_are_never_read_either(tmp_path):
    # The file is refused whole, even for its plaintext column: what a footer key guards
    # (the footer's signature) cannot be checked without the key.
    path = write_encrypted(tmp_path / "enc.parquet", plaintext_footer=True)
    code = (
        "import tabloader\n"
        "try:\n"
        f"    tabloader.Dataset({str(path)!r})\n"
        "except tabloader.InvalidFileError as err:\n"
        "    print(type(err).__name__)\n"
    )
    assert run_python(code).stdout == "InvalidFileError\n"


def test_a_plain_file_beside_encrypted_ones_reads_as_pyarrow_reads_it(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"secret": [1, 2, 3], "x": [0.5, 1.5, 2.5]}), path)
    batch = next(iter(tabloader.Loader(str(path), cats=["secret"], conts=["x"], batch_size=3)))
    assert batch["secret"].tolist() == pq.read_table(path).column("secret").to_pylist()


# -- page checksums ---------------------------------------------------------------------------


def write_damaged(path: Path) -> np.ndarray:
    """A file with page checksums (two row groups) whose second row group's data page has
    one byte flipped, as a bad disk or transfer leaves it; returns the ids written."""
    ids = np.arange(2000, dtype=np.int64)
    pq.write_table(
        pa.table({"id": ids}),
        path,
        row_group_size=1000,
        write_page_checksum=True,
        compression="none",
        use_dictionary=False,
    )
    chunk = pq.read_metadata(path).row_group(1).column(0)
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size - 100] ^= 0xFF
    path.write_bytes(bytes(data))
    return ids


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cache", [None, "memory"])
def test_verify_checksums_refuses_a_damaged_page_naming_the_row_group(tmp_path, device, cache):
    path = tmp_path / "damaged.parquet"
    ids = write_damaged(path)
    # As stored, the damage is a wrong value, read as if it were data:
    read = pq.read_table(path).column("id").to_numpy()
    assert (read != ids).sum() == 1
    unchecked = tabloader.Loader(str(path), cats=["id"], batch_size=500, device=device)
    assert not np.array_equal(np.concatenate([host(b["id"]) for b in unchecked]), ids)
    ds = tabloader.Dataset(str(path), verify_checksums=True)
    assert ds.verify_checksums
    loader = tabloader.Loader(ds, cats=["id"], batch_size=500, device=device, cache=cache)
    with pytest.raises(tabloader.ReadError) as info:
        list(loader)
    assert str(info.value).startswith(f"could not read {path} (row group 1): ")
    assert "CRC checksum verification failed" in str(info.value)


@pytest.mark.parametrize("device", DEVICES)
def test_verify_checksums_reads_sound_files_with_or_without_checksums(tmp_path, device):
    for checksums in (True, False):
        path = tmp_path / f"sound-{checksums}.parquet"
        table = pa.table({"id": np.arange(3000, dtype=np.int64), "x": np.arange(3000) / 8})
        pq.write_table(table, path, row_group_size=700, write_page_checksum=checksums)
        ds = tabloader.Dataset(str(path), verify_checksums=True)
        loader = tabloader.Loader(
            ds, cats=["id"], conts=["x"], batch_size=256, shuffle=True, seed=3, device=device
        )
        batches = list(loader)
        got = np.concatenate([host(b["id"]) for b in batches])
        np.testing.assert_array_equal(np.sort(got), table.column("id").to_numpy())
        x = np.concatenate([host(b["x"]) for b in batches])
        np.testing.assert_array_equal(x, (got / 8).astype(np.float32))


def test_verify_checksums_is_for_parquet_files(tmp_path):
    with pytest.raises(tabloader.InvalidArgumentError) as info:
        tabloader.Dataset(pa.table({"x": [1, 2]}), verify_checksums=True)
    assert str(info.value) == (
        "verify_checksums checks the pages of parquet files as they are read; a table "
        "source is not read from parquet pages here"
    )
    with pytest.raises(tabloader.InvalidArgumentError, match="verify_checksums must be"):
        tabloader.Dataset(str(tmp_path), verify_checksums="yes")


def test_the_page_checksum_benchmark_reports_both_cases(tmp_path):
    script = ROOT / "benchmarks" / "page_checksums.py"
    done = subprocess.run(
        [sys.executable, str(script), "--rows", "4000", "--rounds", "1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "4,000 rows, 1 rounds (seconds: fastest, median)"
    assert [line.split()[0] for line in lines[1:]] == ["without", "verify_checksums", "cost"]


# -- every parquet type pyarrow writes -------------------------------------------------------

ROWS = 40
NULL_ROW = 7
FILL = 1  # fits every stored type: unsigned, boolean, floating point
V = "values"
CTE = tabloader.ColumnTypeError


def _with_null(values: list[Any]) -> list[Any]:
    return [None if i == NULL_ROW else v for i, v in enumerate(values)]


def _column(kind: str) -> pa.Array:
    """ROWS values of a kind, a null at NULL_ROW (where the type holds nulls)."""
    i = np.arange(ROWS)
    ints = (i * 37 % 101 - 50).tolist()
    numbers = {
        "int8": pa.int8(),
        "int16": pa.int16(),
        "int32": pa.int32(),
        "int64": pa.int64(),
    }
    if kind in numbers:
        return pa.array(_with_null(ints), numbers[kind])
    unsigned = {"uint8": pa.uint8(), "uint16": pa.uint16(), "uint32": pa.uint32()}
    if kind in unsigned:
        return pa.array(_with_null((i * 5).tolist()), unsigned[kind])
    if kind == "uint64":
        return pa.array(_with_null((i * 10**17).tolist()), pa.uint64())  # all below 2**63
    if kind == "float16":
        return pa.array(_with_null((i / 8).astype(np.float16).tolist()), pa.float16())
    if kind == "float32":
        return pa.array(_with_null((i / 3).tolist()), pa.float32())
    if kind == "float64":
        values = (i / 7).tolist()
        values[5], values[6], values[8] = float("nan"), float("inf"), -1e30
        return pa.array(_with_null(values), pa.float64())
    if kind == "bool":
        return pa.array(_with_null((i % 3 == 0).tolist()), pa.bool_())
    if kind == "dictionary<int64>":  # pyarrow reads it back as int64
        return pa.array(_with_null(ints), pa.int64()).dictionary_encode()
    if kind.startswith(("list<", "large_list", "list_view")):
        return _list_column(kind)
    if kind.startswith("vector"):
        return _vector_column(kind)
    return _other_column(kind)


def _list_column(kind: str) -> pa.Array:
    rows: list[Any] = [[j * 10 + r for r in range(j % 4)] for j in range(ROWS)]
    rows[3] = [1, None, 2]  # a null inside a list
    rows = _with_null(rows)
    types = {
        "list<int64>": pa.list_(pa.int64()),
        "large_list<int32>": pa.large_list(pa.int32()),
        "list_view<int64>": pa.list_view(pa.int64()),
        "large_list_view<int64>": pa.large_list_view(pa.int64()),
        "list<float16>": pa.list_(pa.float16()),
    }
    if kind in types:
        return pa.array(rows, types[kind])
    if kind == "list<list<int64>>":
        return pa.array(
            [[r] if r is not None else None for r in rows], pa.list_(pa.list_(pa.int64()))
        )
    if kind == "list<string>":
        return pa.array([[str(v) for v in r] if r else r for r in rows], pa.list_(pa.string()))
    raise ValueError(kind)


def _vector_column(kind: str) -> pa.Array:
    i = np.arange(ROWS)
    if kind == "vector<float32>[3]":
        rows = (i[:, None] / 4 + np.arange(3)).tolist()
        rows[3][1] = None  # a null inside a vector
        return pa.array(_with_null(rows), pa.list_(pa.float32(), 3))
    if kind == "vector<int16>[2]":
        return pa.array(
            _with_null((i[:, None] * 2 + np.arange(2)).tolist()), pa.list_(pa.int16(), 2)
        )
    if kind == "vector<bool>[2]":
        return pa.array(
            _with_null((i[:, None] % 2 == np.arange(2)).tolist()), pa.list_(pa.bool_(), 2)
        )
    if kind == "vector<float16>[4]":
        rows = (i[:, None] / 2 + np.arange(4)).astype(np.float16).tolist()
        return pa.array(_with_null(rows), pa.list_(pa.float16(), 4))
    if kind == "vector<string>[2]":
        return pa.array(_with_null([[str(j), "x"] for j in i]), pa.list_(pa.string(), 2))
    raise ValueError(kind)


def _other_column(kind: str) -> pa.Array:
    import datetime
    import decimal

    i = list(range(ROWS))
    made: dict[str, Any] = {
        "decimal32(5,1)": lambda: pa.array(
            [decimal.Decimal(j) / 10 for j in i], pa.decimal32(5, 1)
        ),
        "decimal64(12,3)": lambda: pa.array([decimal.Decimal(j) for j in i], pa.decimal64(12, 3)),
        "decimal128(9,2)": lambda: pa.array([decimal.Decimal(j) for j in i], pa.decimal128(9, 2)),
        "decimal256(40,2)": lambda: pa.array([decimal.Decimal(j) for j in i], pa.decimal256(40, 2)),
        "string": lambda: pa.array([str(j) for j in i], pa.string()),
        "large_string": lambda: pa.array([str(j) for j in i], pa.large_string()),
        "string_view": lambda: pa.array([str(j) for j in i], pa.string_view()),
        "binary": lambda: pa.array([bytes([j]) for j in i], pa.binary()),
        "large_binary": lambda: pa.array([bytes([j]) for j in i], pa.large_binary()),
        "binary_view": lambda: pa.array([bytes([j]) for j in i], pa.binary_view()),
        "fixed_size_binary(4)": lambda: pa.array([bytes([j] * 4) for j in i], pa.binary(4)),
        "dictionary<string>": lambda: pa.array([str(j % 5) for j in i]).dictionary_encode(),
        "date32": lambda: pa.array([datetime.date(2024, 1, 1 + j % 28) for j in i], pa.date32()),
        "date64": lambda: pa.array([datetime.date(2024, 1, 1 + j % 28) for j in i], pa.date64()),
        "time32(ms)": lambda: pa.array(i, pa.time32("ms")),
        "time64(us)": lambda: pa.array(i, pa.time64("us")),
        "time64(ns)": lambda: pa.array(i, pa.time64("ns")),
        "timestamp(s)": lambda: pa.array(i, pa.timestamp("s")),
        "timestamp(ms)": lambda: pa.array(i, pa.timestamp("ms")),
        "timestamp(us, UTC)": lambda: pa.array(i, pa.timestamp("us", tz="UTC")),
        "timestamp(ns)": lambda: pa.array(i, pa.timestamp("ns")),
        "duration(s)": lambda: pa.array(i, pa.duration("s")),
        "duration(ns)": lambda: pa.array(i, pa.duration("ns")),
        "null": lambda: pa.nulls(ROWS),
        "struct<a: int64>": lambda: pa.array([{"a": j} for j in i]),
        "map<string, int64>": lambda: pa.array(
            [[("k", j)] for j in i], pa.map_(pa.string(), pa.int64())
        ),
        "uuid": lambda: pa.array([bytes([j] * 16) for j in i], pa.uuid()),
        "json": lambda: pa.array(["{}"] * ROWS, pa.json_()),
    }
    return made[kind]()


NUMBERS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"]
NUMBERS += ["dictionary<int64>"]
FLOATS = ["float16", "float32", "float64"]
OTHERS = [
    "decimal32(5,1)", "decimal64(12,3)", "decimal128(9,2)", "decimal256(40,2)", "string",
    "large_string", "string_view", "binary", "large_binary", "binary_view",
    "fixed_size_binary(4)", "dictionary<string>", "date32", "date64", "time32(ms)",
    "time64(us)", "time64(ns)", "timestamp(s)", "timestamp(ms)", "timestamp(us, UTC)",
    "timestamp(ns)", "duration(s)", "duration(ns)", "null", "struct<a: int64>",
    "map<string, int64>", "uuid", "json",
]  # fmt: skip
CASES: list[tuple[str, str, Any]] = [
    *[(kind, role, V) for kind in NUMBERS for role in ("cats", "conts", "labels")],
    *[(kind, role, V) for kind in FLOATS for role in ("conts", "labels")],
    *[(kind, "cats", CTE) for kind in FLOATS],
    *[(kind, role, CTE) for kind in OTHERS for role in ("cats", "conts")],
    ("list<int64>", "cats", CTE),  # a list column: name it in sparse_names
    ("list<int64>", "sparse", V),
    ("large_list<int32>", "sparse", V),
    ("list_view<int64>", "sparse", V),
    ("large_list_view<int64>", "sparse", V),
    ("list<float16>", "sparse conts", V),
    ("list<float16>", "sparse", CTE),  # a list of floats as ids
    ("list<list<int64>>", "sparse", CTE),
    ("list<string>", "sparse", CTE),
    ("vector<float32>[3]", "conts", V),
    ("vector<float32>[3]", "labels", V),
    ("vector<float32>[3]", "cats", CTE),
    ("vector<float32>[3]", "sparse conts", V),
    ("vector<int16>[2]", "cats", V),
    ("vector<bool>[2]", "cats", V),
    ("vector<float16>[4]", "conts", V),
    ("vector<string>[2]", "conts", CTE),
]


def _options(column: str, role: str, fill: float | None) -> dict[str, Any]:
    options: dict[str, Any] = {"cats": ["id"], "batch_size": 16, "shuffle": True, "seed": 0}
    if role == "cats":
        options["cats"] = ["id", column]
    elif role in ("conts", "labels"):
        options[role] = [column]
    else:  # sparse, sparse conts
        options["sparse_names"] = [column]
        if role == "sparse conts":
            options["conts"] = [column]
    if fill is not None:
        options["fill_null"] = {column: fill}
    return options


def _expected(
    reference: pa.Table, column: str, dtype: Any, fill: float, *, lists: bool
) -> dict[int, Any]:
    """pyarrow's values by id, as delivered: nulls filled, null lists empty (``lists``:
    read as list columns), a null vector all fill values, in the delivered dtype."""
    out: dict[int, Any] = {}
    field = reference.schema.field(column).type
    values = reference.column(column).to_pylist()
    for i, value in zip(reference.column("id").to_pylist(), values, strict=True):
        if isinstance(value, list) or (value is None and pa.types.is_nested(field)):
            if value is None:
                value = [] if lists else [fill] * field.list_size
            value = [fill if v is None else v for v in value]
        elif value is None:
            value = fill
        out[i] = np.array(value, dtype=object).astype(dtype)
    return out


def _delivered(batches: list[dict[str, Any]], column: str) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for batch in batches:
        ids = host(batch["id"]).tolist()
        value = batch[column]
        if isinstance(value, tuple):
            values, offsets = host(value[0]), host(value[1])
            rows = [values[a:b] for a, b in itertools.pairwise(offsets)]
        else:
            rows = list(host(value))
        out.update(zip(ids, rows, strict=True))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("kind", "role", "outcome"), CASES, ids=[f"{k}-{r}" for k, r, _ in CASES])
def test_every_type_pyarrow_writes_loads_as_pyarrow_reads_it_or_is_refused(
    tmp_path, device, kind, role, outcome
):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": pa.array(range(ROWS), pa.int64()), "c": _column(kind)}), path)
    reference = pq.read_table(path)
    if outcome is not V:
        with pytest.raises(outcome) as info:
            tabloader.Loader(str(path), device=device, **_options("c", role, FILL))
        assert "'c'" in str(info.value)
        return
    loader = tabloader.Loader(str(path), device=device, **_options("c", role, FILL))
    batches = list(loader)
    dtype = loader.dtypes["c"]
    expected = _expected(reference, "c", dtype, FILL, lists=role.startswith("sparse"))
    delivered = _delivered(batches, "c")
    assert sorted(delivered) == list(range(ROWS))
    for i, value in delivered.items():
        assert value.dtype == dtype
        np.testing.assert_array_equal(value, expected[i], err_msg=f"row {i}")


@pytest.mark.parametrize(
    "kind", ["int32", "float64", "bool", "uint64", "vector<float32>[3]", "vector<int16>[2]"]
)
def test_a_null_without_fill_null_is_refused_naming_the_column(tmp_path, kind):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": pa.array(range(ROWS), pa.int64()), "c": _column(kind)}), path)
    role = "cats" if kind in ("int32", "bool", "uint64", "vector<int16>[2]") else "conts"
    # named at construction from the footers' null counts (vectors: when read)
    named = r"null values and no fill value: 'c'|column 'c' has (1 )?null value"
    with pytest.raises(tabloader.NullValuesError, match=named):
        list(tabloader.Loader(str(path), **_options("c", role, None)))


def test_uint64_ids_at_or_above_2_63_are_refused_not_wrapped(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"c": pa.array([1, 2**63 + 5], pa.uint64())}), path)
    with pytest.raises(tabloader.ValueRangeError, match="column 'c' holds 9223372036854775813"):
        tabloader.Loader(str(path), cats=["c"], batch_size=2)
    both = tabloader.Loader(str(path), cats=["c"], batch_size=2, cat_dtype="uint64")
    assert host(next(iter(both))["c"]).tolist() == [1, 2**63 + 5]


# -- every way pyarrow writes them: codecs, encodings, pages, statistics --------------------

WRITERS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{
        f"codec {codec}": {"compression": codec}
        for codec in ("none", "snappy", "gzip", "brotli", "zstd", "lz4")
    },
    "data pages v2": {"data_page_version": "2.0"},
    "no dictionary": {"use_dictionary": False},
    "byte stream split, delta": {
        "use_dictionary": False,
        "column_encoding": {
            "x": "BYTE_STREAM_SPLIT",
            "h": "BYTE_STREAM_SPLIT",
            "id": "DELTA_BINARY_PACKED",
        },
    },
    "no statistics": {"write_statistics": False},
    "page index, small pages": {"write_page_index": True, "data_page_size": 256},
    "format 1.0": {"version": "1.0"},
    "no arrow schema": {"store_schema": False},
    "legacy nested types": {"use_compliant_nested_type": False},
    "page checksums": {"write_page_checksum": True},
    "small row groups": {"row_group_size": 7},
}


def _mixed_table() -> pa.Table:
    """Every kind of column a loader takes, each with a null (filled) where it can."""
    i = np.arange(ROWS)
    return pa.table(
        {
            "id": pa.array(i, pa.int64()),
            "small": _column("int8"),
            "big": _column("uint64"),
            "x": _column("float64"),
            "h": _column("float16"),
            "flag": _column("bool"),
            "tags": _column("list<int64>"),
            "emb": _column("vector<float32>[3]"),
        }
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_option_reads_as_pyarrow_reads_it(tmp_path, device, writer):
    path = tmp_path / "t.parquet"
    pq.write_table(_mixed_table(), path, **WRITERS[writer])
    reference = pq.read_table(path)
    # Without the Arrow schema in the footer, pyarrow reads the vector back as a list
    # (parquet has no fixed-size list), and so it is one: a list column.
    lists = (
        ["tags"]
        if pa.types.is_fixed_size_list(reference.schema.field("emb").type)
        else ["tags", "emb"]
    )
    loader = tabloader.Loader(
        str(path), cats=["id", "small", "big", "flag"], conts=["x", "h", "emb"],
        sparse_names=lists, fill_null=FILL, batch_size=9, shuffle=True, seed=1,
        device=device,
    )  # fmt: skip
    batches = list(loader)
    for column in ("small", "big", "x", "h", "flag", "tags", "emb"):
        dtype = loader.dtypes[column]
        expected = _expected(reference, column, dtype, FILL, lists=column in lists)
        delivered = _delivered(batches, column)
        assert sorted(delivered) == list(range(ROWS))
        for i, value in delivered.items():
            np.testing.assert_array_equal(value, expected[i], err_msg=f"{column} row {i}")


# -- every table feature deltalake writes --------------------------------------------------------


def _rows(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "day": (ids % 3).astype(np.int32),
            "region": pa.array([f"r{j % 2}" for j in ids]),
            "x": ids / 4.0,
        }
    )


def _compare_version(load: Any, reference: Any, columns: list[str]) -> None:
    """tabloader's rows (``load()``: a Dataset) against the reference reader's table
    (``reference()``), or, where the reference cannot read it, a tabloader error."""
    try:
        expected = reference()
    except (OSError, ValueError):  # the reference cannot read it: tabloader says so too
        expected = None
    if expected is None:
        with pytest.raises(tabloader.TabloaderError):
            list(tabloader.Loader(load(), cats=["id"], batch_size=64))
        return
    ds = load()
    present = [c for c in columns if c in expected.column_names]
    conts = [c for c in present if c != "id"]
    loader = tabloader.Loader(
        ds, cats=["id"], conts=conts, batch_size=64, shuffle=True, seed=2, fill_null=FILL
    )
    batches = list(loader)
    delivered = {c: _delivered(batches, c) for c in present}
    ids = expected.column("id").to_pylist()
    assert sorted(delivered["id"]) == sorted(ids)
    for c in conts:
        want = _expected(expected, c, loader.dtypes[c], FILL, lists=False)
        for i in ids:
            np.testing.assert_array_equal(delivered[c][i], want[i], err_msg=f"{c} row {i}")


def _delta_features() -> dict[str, Any]:
    deltalake = pytest.importorskip("deltalake")
    from deltalake import DeltaTable, WriterProperties, write_deltalake

    def append(path: str) -> None:
        write_deltalake(path, _rows(0, 50))
        write_deltalake(path, _rows(50, 30), mode="append")

    def partitions(path: str) -> None:
        write_deltalake(path, _rows(0, 60), partition_by=["day", "region"])
        write_deltalake(path, _rows(60, 30), mode="append", partition_by=["day", "region"])

    def overwrite(path: str) -> None:
        append(path)
        write_deltalake(path, _rows(100, 20), mode="overwrite")

    def replace_where(path: str) -> None:
        write_deltalake(path, _rows(0, 60), partition_by=["day"])
        replacement = _rows(200, 30).filter(pa.compute.equal(_rows(200, 30)["day"], 1))
        write_deltalake(
            path, replacement, mode="overwrite", predicate="day = 1", partition_by=["day"]
        )

    def schema_merge(path: str) -> None:
        write_deltalake(path, _rows(0, 40))
        more = _rows(40, 20).append_column("extra", pa.array(np.arange(20) * 1.5))
        write_deltalake(path, more, mode="append", schema_mode="merge")

    def delete(path: str) -> None:
        append(path)
        DeltaTable(path).delete("id < 25")

    def update(path: str) -> None:
        append(path)
        DeltaTable(path).update(updates={"x": "x * 2"}, predicate="id < 10")

    def merge(path: str) -> None:
        append(path)
        source = _rows(70, 30)  # 70..79 matched, 80..99 new
        (
            DeltaTable(path)
            .merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update(updates={"x": "s.x + 1000"})
            .when_not_matched_insert_all()
            .execute()
        )

    def compact(path: str) -> None:
        append(path)
        DeltaTable(path).optimize.compact()

    def z_order(path: str) -> None:
        append(path)
        DeltaTable(path).optimize.z_order(["id"])

    def vacuum(path: str) -> None:
        compact(path)
        DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    def restore(path: str) -> None:
        overwrite(path)
        DeltaTable(path).restore(0)

    def checkpoint(path: str) -> None:
        append(path)
        DeltaTable(path).create_checkpoint()
        write_deltalake(path, _rows(80, 10), mode="append")

    def configured(**settings: str) -> Any:
        def write(path: str) -> None:
            write_deltalake(path, _rows(0, 50), configuration=settings)
            write_deltalake(path, _rows(50, 30), mode="append")

        return write

    def change_data_feed(path: str) -> None:
        configured(**{"delta.enableChangeDataFeed": "true"})(path)
        DeltaTable(path).update(updates={"x": "x + 1"}, predicate="id < 5")  # writes CDC files

    def constraints(path: str) -> None:
        append(path)
        DeltaTable(path).alter.add_constraint({"positive": "id >= 0"})
        write_deltalake(path, _rows(80, 10), mode="append")

    def timestamp_ntz(path: str) -> None:
        table = _rows(0, 30).append_column("at", pa.array(np.arange(30), pa.timestamp("us")))
        write_deltalake(path, table)

    def writer_properties(path: str) -> None:
        properties = WriterProperties(compression="ZSTD", max_row_group_size=7)
        write_deltalake(path, _rows(0, 50), writer_properties=properties)

    assert deltalake
    return {
        "append": append,
        "partitions": partitions,
        "overwrite": overwrite,
        "overwrite with a predicate": replace_where,
        "schema merge": schema_merge,
        "delete": delete,
        "update": update,
        "merge": merge,
        "compaction": compact,
        "z-order": z_order,
        "vacuum": vacuum,
        "restore": restore,
        "checkpoint": checkpoint,
        "deletion vectors enabled": configured(**{"delta.enableDeletionVectors": "true"}),
        "change data feed": change_data_feed,
        "append only": configured(**{"delta.appendOnly": "true"}),
        "constraints": constraints,
        "reader version 2, no column mapping": configured(
            **{
                "delta.columnMapping.mode": "none",
                "delta.minReaderVersion": "2",
                "delta.minWriterVersion": "5",
            }
        ),
        "timestamp without time zone": timestamp_ntz,
        "writer properties": writer_properties,
        "column mapping by name": configured(**{"delta.columnMapping.mode": "name"}),
    }


DELTA_FEATURES = [
    "append", "partitions", "overwrite", "overwrite with a predicate", "schema merge",
    "delete", "update", "merge", "compaction", "z-order", "vacuum", "restore", "checkpoint",
    "deletion vectors enabled", "change data feed", "append only", "constraints",
    "reader version 2, no column mapping", "timestamp without time zone",
    "writer properties", "column mapping by name",
]  # fmt: skip
REFUSED_DELTA = {"column mapping by name": tabloader.UnsupportedTableError}


@pytest.mark.parametrize("feature", DELTA_FEATURES)
def test_every_delta_feature_loads_as_deltalake_reads_it_or_is_refused(tmp_path, feature):
    from deltalake import DeltaTable

    path = str(tmp_path / "t")
    _delta_features()[feature](path)
    if feature in REFUSED_DELTA:
        assert DeltaTable(path).to_pyarrow_table().num_rows  # deltalake reads it
        with pytest.raises(REFUSED_DELTA[feature]) as info:
            tabloader.Dataset.from_delta(path)
        assert path in str(info.value)
        return
    for version in range(DeltaTable(path).version() + 1):
        _compare_version(
            lambda v=version: tabloader.Dataset.from_delta(path, version=v),
            lambda v=version: _delta_reference(path, v),
            ["id", "x", "day", "extra"],
        )


def _delta_reference(path: str, version: int) -> pa.Table:
    """deltalake's read of a version; for a table with the deletion vectors feature, which
    deltalake's reader refuses, the version's files as deltalake lists them (none has a
    vector)."""
    from deltalake import DeltaTable

    table = DeltaTable(path, version=version)
    if "deletionVectors" not in (table.protocol().reader_features or ()):
        return table.to_pyarrow_table()
    assert not pa.table(table.deletion_vectors()).num_rows
    return pa.concat_tables(
        [pq.read_table(uri.removeprefix("file://")) for uri in table.file_uris()]
    )


# -- every table feature pyiceberg writes ------------------------------------------------------


def _iceberg_features() -> dict[str, Any]:
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform
    from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType, NestedField

    fields = (
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "day", IntegerType(), required=False),
        NestedField(3, "x", DoubleType(), required=False),
    )
    schema = Schema(*fields)

    def rows(start: int, n: int) -> pa.Table:
        return _rows(start, n).drop_columns(["region"])

    def create(catalog: Any, spec: Any = None, **properties: str) -> Any:
        kwargs = {"partition_spec": spec} if spec is not None else {}
        return catalog.create_table("db.t", schema=schema, properties=properties, **kwargs)

    def append(catalog: Any, **properties: str) -> Any:
        table = create(catalog, **properties)
        table.append(rows(0, 50))
        table.append(rows(50, 30))
        return table

    def partitioned(transform: Any, source: int = 2) -> Any:
        def write(catalog: Any) -> Any:
            spec = PartitionSpec(PartitionField(source, 1000, transform, "part"))
            table = create(catalog, spec)
            table.append(rows(0, 60))
            table.append(rows(60, 30))
            return table

        return write

    def overwrite(catalog: Any) -> Any:
        table = append(catalog)
        table.overwrite(rows(100, 20))
        return table

    def overwrite_filter(catalog: Any) -> Any:
        table = partitioned(IdentityTransform())(catalog)
        table.overwrite(rows(200, 30).filter(pa.compute.equal(rows(200, 30)["day"], 1)), "day == 1")
        return table

    def delete(catalog: Any) -> Any:
        table = append(catalog)
        table.delete("id < 25")
        return table

    def upsert(catalog: Any) -> Any:
        table = append(catalog)
        table.upsert(rows(70, 30), join_cols=["id"])
        return table

    def evolved(catalog: Any) -> Any:
        table = append(catalog)
        with table.update_schema() as update:
            update.add_column("extra", FloatType())
            update.rename_column("x", "price")
        more = rows(80, 20).rename_columns(["id", "day", "price"])
        table.append(more.append_column("extra", pa.array(np.arange(20) / 2, pa.float32())))
        with table.update_schema() as update:
            update.update_column("extra", DoubleType())  # float to double
        return table

    def dropped(catalog: Any) -> Any:
        table = append(catalog)
        with table.update_schema() as update:
            update.delete_column("day")
        table.append(rows(80, 10).drop_columns(["day"]))
        return table

    def spec_evolution(catalog: Any) -> Any:
        table = append(catalog)
        with table.update_spec() as update:
            update.add_identity("day")
        table.append(rows(80, 30))
        return table

    def sorted_table(catalog: Any) -> Any:
        table = create(catalog)
        with table.update_sort_order() as update:
            update.desc("x", IdentityTransform())
        table.append(rows(0, 40))
        return table

    def tagged(catalog: Any) -> Any:
        table = append(catalog)
        first = table.snapshots()[0].snapshot_id
        table.manage_snapshots().create_tag(first, "first").create_branch(first, "b").commit()
        return table

    def added_files(catalog: Any) -> Any:
        table = create(catalog)
        path = catalog.tmp / "plain.parquet"
        pq.write_table(rows(0, 40), path)
        table.add_files([str(path)])
        table.append(rows(40, 10))
        return table

    def with_delete_file(content_name: str) -> Any:
        def write(catalog: Any) -> Any:
            from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
            from pyiceberg.typedef import Record

            table = append(catalog, **{"format-version": "2"})
            content = DataFileContent[content_name]
            if content is DataFileContent.POSITION_DELETES:
                data_file = next(iter(table.scan().plan_files())).file.file_path
                deletes = pa.table(
                    [pa.array([data_file]), pa.array([3], pa.int64())],
                    schema=pa.schema(
                        [
                            pa.field(
                                "file_path", pa.string(), False, {"PARQUET:field_id": "2147483546"}
                            ),
                            pa.field("pos", pa.int64(), False, {"PARQUET:field_id": "2147483545"}),
                        ]
                    ),
                )
                extra: dict[str, Any] = {}
            else:
                deletes = pa.table({"id": pa.array([3], pa.int64())})
                extra = {"equality_ids": [1]}
            path = catalog.tmp / f"{content_name.lower()}.parquet"
            pq.write_table(deletes, path)
            delete_file = DataFile.from_args(
                content=content,
                file_path=f"file://{path}",
                file_format=FileFormat.PARQUET,
                partition=Record(),
                record_count=1,
                file_size_in_bytes=path.stat().st_size,
                **extra,
            )
            delete_file.spec_id = table.spec().spec_id
            with table.transaction() as tx, tx.update_snapshot().fast_append() as add:
                add.append_data_file(delete_file)
            return table

        return write

    return {
        "position deletes": with_delete_file("POSITION_DELETES"),
        "equality deletes": with_delete_file("EQUALITY_DELETES"),
        "append": append,
        "format version 1": lambda catalog: append(catalog, **{"format-version": "1"}),
        "identity partitions": partitioned(IdentityTransform()),
        "bucket partitions": partitioned(BucketTransform(4), source=1),
        "truncate partitions": partitioned(TruncateTransform(10), source=1),
        "overwrite": overwrite,
        "overwrite with a filter": overwrite_filter,
        "delete (copy-on-write)": delete,
        "upsert": upsert,
        "schema evolution": evolved,
        "dropped column": dropped,
        "partition evolution": spec_evolution,
        "sort order": sorted_table,
        "tags and branches": tagged,
        "files added without field ids": added_files,
    }


ICEBERG_FEATURES = [
    "append", "format version 1", "identity partitions", "bucket partitions",
    "truncate partitions", "overwrite", "overwrite with a filter", "delete (copy-on-write)",
    "upsert", "schema evolution", "dropped column", "partition evolution", "sort order",
    "tags and branches", "files added without field ids",
]  # fmt: skip
REFUSED_ICEBERG = {  # merge-on-read deletes: how many rows they remove only reading tells
    "position deletes": "has position delete files",
    "equality deletes": "has equality delete files",
}


@pytest.mark.parametrize("feature", list(REFUSED_ICEBERG))
def test_iceberg_delete_files_are_refused_where_pyiceberg_applies_them(tmp_path, feature):
    features = _iceberg_features()
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    catalog.tmp = tmp_path
    table = features[feature](catalog)
    if feature == "position deletes":
        assert table.scan().to_arrow().num_rows == 79  # pyiceberg applies it
    with pytest.raises(tabloader.UnsupportedTableError, match=REFUSED_ICEBERG[feature]):
        tabloader.Dataset.from_iceberg(table)


@pytest.mark.parametrize("feature", ICEBERG_FEATURES)
def test_every_iceberg_feature_loads_as_pyiceberg_reads_it(tmp_path, feature):
    features = _iceberg_features()
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}")
    catalog.create_namespace("db")
    catalog.tmp = tmp_path  # (where a feature writes files of its own)
    table = features[feature](catalog)
    current = table.current_snapshot().snapshot_id
    for snapshot in table.snapshots():
        sid = snapshot.snapshot_id
        pinned = None if sid == current else sid
        reference = table.scan(snapshot_id=sid).to_arrow()
        if not reference.num_rows:
            continue  # an overwrite's first step deletes everything
        _compare_version(
            lambda p=pinned: tabloader.Dataset.from_iceberg(table, snapshot_id=p),
            lambda r=reference: r,
            ["id", "x", "price", "day", "extra"],
        )
