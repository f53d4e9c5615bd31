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

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def host(array: Any) -> np.ndarray:
    return array.get() if hasattr(array, "get") else np.asarray(array)


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
