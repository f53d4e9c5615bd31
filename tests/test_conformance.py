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
