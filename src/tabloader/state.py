"""Where an epoch stands: an immutable cursor, its state dict, and the check of a saved one.

What a loader must remember to continue an epoch is a few integers: the epoch, its seed,
the batches already handed to the consumer, and which worker process share of the epoch
they belong to. A `Cursor` holds exactly that and never changes; whoever iterates
keeps its own (the core loader, each framework adapter's epochs) and makes a new one to
move on. `Cursor.to_state` writes the state dict (format `STATE_FORMAT`), with the
`Fingerprint` of the data and the options that decide the order of rows, and
`Cursor.from_state` reads one back, refusing a state saved for other data, other
options, another worker share or by another version of tabloader, naming what differs.

Examples:
    >>> saved = Cursor(epoch=2, seed=7, batches=5).to_state(Fingerprint({"rows": 10}, {}))
    >>> (saved["epoch"], saved["seed"], saved["batches"], saved["format"] == STATE_FORMAT)
    (2, 7, 5, True)
    >>> Cursor.from_state(saved, Fingerprint({"rows": 10}, {}), seed=7, batches_in_epoch=9)
    Cursor(epoch=2, seed=7, batches=5, worker=0, num_workers=1)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tabloader._version import __version__
from tabloader.errors import InvalidArgumentError
from tabloader.options import int_at_least

if TYPE_CHECKING:
    from tabloader.dataset import Dataset

__all__ = [
    "STATE_FORMAT",
    "Cursor",
    "Fingerprint",
    "check_state_shape",
    "dataset_difference",
    "dataset_fingerprint",
]

STATE_FORMAT = 3
"""Version of the dict [`Loader.state_dict`][tabloader.Loader.state_dict] returns. 2: the
dataset fingerprint covers the files' contents (their footers), and the state names the
tabloader version. 3: chunks are shuffled by a counter-based permutation (the same on a
GPU), so a seed gives another order than before."""
# The keys of a saved state: where the epoch stands, and what must match to resume it.
STATE_FORMAT_KEY = "format"
STATE_VERSION = "tabloader"
STATE_EPOCH = "epoch"
STATE_SEED = "seed"
STATE_BATCHES = "batches"
STATE_WORKER = "worker"
STATE_NUM_WORKERS = "num_workers"
STATE_DATASET = "dataset"
STATE_OPTIONS = "options"


@dataclass(frozen=True)
class Fingerprint:
    """What must match to resume a saved state: the dataset's fingerprint (see
    `dataset_fingerprint`) and the options that decide the order of rows, as the
    epochs are actually planned (``notes`` say why an option's value is what it is,
    for the message that refuses a state saved with another)."""

    dataset: Mapping[str, Any]
    options: Mapping[str, Any]
    notes: Mapping[str, str] = dataclasses.field(default_factory=dict)


def dataset_fingerprint(dataset: Dataset) -> dict[str, Any]:
    """What of a dataset must match to resume.

    ``digest`` covers the files' names (not where they are, so a run resumes on a copy
    of the data), row counts and footer digests, or for an in-memory table or Dask
    DataFrame its schema and a digest of its rows (see `Dataset.content_digest`).
    ``place`` is a digest of where the files are and ``stamps`` of their whole
    identities: at the same place, a file rewritten since the state was saved (another
    modification or change time, inode, ETag or version) is told even when its footer
    came out byte for byte the same (see `dataset_difference`).
    """
    rows = dataset.partition_rows.tolist()
    identities = dataset.file_identities()
    names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in dataset.files]
    fingerprint: dict[str, Any] = {"files": len(names), "partitions": len(rows)}
    if names:
        contents: list[Any] = [f["footer"] for f in identities]
        fingerprint["place"] = _digest([f["path"] for f in identities])
        fingerprint["stamps"] = _digest(identities)
    else:
        content = dataset.content_digest()
        contents = [str(dataset.schema), content]
        fingerprint["content"] = content
    return {
        **fingerprint,
        "rows": int(sum(rows)),
        "digest": _digest([names, rows, contents]),
    }


def dataset_difference(saved: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why a state saved with dataset fingerprint ``saved`` cannot resume on a dataset
    of fingerprint ``now`` (see `dataset_fingerprint`), or None when it can.

    Examples:
        >>> a = {"files": 1, "partitions": 1, "rows": 5, "digest": "d", "place": "p",
        ...      "stamps": "s"}
        >>> dataset_difference(a, a) is None
        True
        >>> dataset_difference(a, {**a, "place": "q", "stamps": "t"}) is None  # a copy
        True
        >>> dataset_difference(a, {**a, "stamps": "t"})[:54]  # the same place, rewritten
        'the dataset: its files were rewritten in place since t'

    """
    keys = ("files", "partitions", "rows", "digest")
    if any(saved.get(k) != now.get(k) for k in keys):
        return (
            f"the dataset (saved: {_describe_fingerprint(saved)}; now: "
            f"{_describe_fingerprint(now)})"
        )
    if "content" in now and now["content"] is None:
        return (
            "the dataset: dask cannot give this Dask DataFrame a deterministic token, so "
            "nothing tells whether its rows are those the state was saved on. Build the "
            "frame from files (dask.dataframe.read_parquet) or from a pandas frame"
        )
    if saved.get("place") == now.get("place") and saved.get("stamps") != now.get("stamps"):
        return (
            "the dataset: its files were rewritten in place since the state was saved (the "
            "same names, rows and footers, but other modification or change times, inodes "
            "or object versions)"
        )
    return None


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cursor:
    """A position in the epochs: ``batches`` batches of epoch ``epoch`` handed out, in
    worker share ``worker`` of ``num_workers``, the epoch shuffled with ``seed``.

    Immutable: moving on makes a new cursor (`at`, `next_epoch`, ``dataclasses.replace``).
    """

    epoch: int
    seed: int
    batches: int = 0
    worker: int = 0
    num_workers: int = 1

    @property
    def share(self) -> tuple[int, int]:
        """``(worker, num_workers)``."""
        return self.worker, self.num_workers

    def at(self, batches: int) -> Cursor:
        """This epoch, ``batches`` batches in.

        Examples:
            >>> Cursor(3, seed=1).at(4).batches
            4
        """
        return dataclasses.replace(self, batches=batches)

    def next_epoch(self) -> Cursor:
        """The start of the next epoch, with the same seed and share.

        Examples:
            >>> Cursor(3, seed=1, batches=4).next_epoch()
            Cursor(epoch=4, seed=1, batches=0, worker=0, num_workers=1)
        """
        return dataclasses.replace(self, epoch=self.epoch + 1, batches=0)

    def to_state(self, fingerprint: Fingerprint) -> dict[str, Any]:
        """The state dict of this position (small, JSON-serialisable; see
        [`Loader.state_dict`][tabloader.Loader.state_dict])."""
        return {
            STATE_FORMAT_KEY: STATE_FORMAT,
            STATE_VERSION: _version(),
            STATE_EPOCH: int(self.epoch),
            STATE_SEED: int(self.seed),
            STATE_BATCHES: int(self.batches),
            STATE_WORKER: int(self.worker),
            STATE_NUM_WORKERS: int(self.num_workers),
            STATE_DATASET: dict(fingerprint.dataset),
            STATE_OPTIONS: dict(fingerprint.options),
        }

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        fingerprint: Fingerprint,
        *,
        seed: int,
        batches_in_epoch: int,
        adopt_seed: bool = False,
        share: tuple[int, int] = (0, 1),
    ) -> Cursor:
        """The position a saved state holds, checked against where it is resumed.

        ``fingerprint`` is the data and options of the resuming run, ``seed`` its seed
        (with ``adopt_seed``, a different saved seed is taken rather than refused),
        ``share`` its ``(worker, num_workers)`` and ``batches_in_epoch`` the batches an
        epoch of that share has.

        Raises:
            InvalidArgumentError: ``state`` is not a state dict this version reads, or
                was saved by a run with other data, options, seed or worker share (the
                message names the saved and the current value of each).
        """
        check_state_shape(state)
        worker, num_workers = share
        differences = []
        dataset = dataset_difference(state[STATE_DATASET], fingerprint.dataset)
        if dataset is not None:
            differences.append(dataset)
        saved_options = state[STATE_OPTIONS]
        for name, value in fingerprint.options.items():
            if saved_options.get(name) != value:
                note = fingerprint.notes.get(name)
                differences.append(
                    f"{name} (saved: {saved_options.get(name)!r}; now: {value!r}"
                    + (f": {note})" if note else ")")
                )
        for name, value in ((STATE_WORKER, worker), (STATE_NUM_WORKERS, num_workers)):
            if state.get(name, 0 if name == STATE_WORKER else 1) != value:
                differences.append(f"{name} (saved: {state.get(name)!r}; now: {value!r})")
        saved_seed = state[STATE_SEED]
        if not adopt_seed and saved_seed != seed:
            differences.append(f"seed (saved: {saved_seed!r}; now: {seed!r})")
        if differences:
            raise InvalidArgumentError(
                "cannot resume from this state: it was saved by a loader with a different "
                + ", ".join(differences)
                + ". Resume with the same data and options as the run that saved it"
            )
        epoch = int_at_least(state[STATE_EPOCH], 0, "the state's epoch")
        batches = int_at_least(state[STATE_BATCHES], 0, "the state's batches")
        if batches > batches_in_epoch:
            raise InvalidArgumentError(
                f"the state says {batches} batches of epoch {epoch} were delivered, but an "
                f"epoch has {batches_in_epoch} here; was it saved by another version of the data?"
            )
        saved = int_at_least(saved_seed, 0, "the state's seed")
        return cls(epoch, saved, batches, worker, num_workers)


def _version() -> str:
    return __version__


def check_state_shape(state: object) -> None:
    """Raise [`InvalidArgumentError`][tabloader.errors.InvalidArgumentError] unless ``state`` is a
    state dict this version of tabloader reads, saying what it is instead."""
    keys = (STATE_FORMAT_KEY, STATE_EPOCH, STATE_SEED, STATE_BATCHES, STATE_DATASET)
    if not isinstance(state, Mapping) or any(k not in state for k in keys):
        raise InvalidArgumentError(
            f"not a tabloader loader state (a dict from Loader.state_dict() with keys "
            f"{', '.join(keys)}, ...), got {_short(state)}"
        )
    found, version = state[STATE_FORMAT_KEY], state.get(STATE_VERSION)
    if found != STATE_FORMAT:
        by = f"tabloader {version}" if isinstance(version, str) else "another tabloader version"
        if isinstance(found, int) and not isinstance(found, bool) and found < STATE_FORMAT:
            why = (
                f"it was saved by {by} (state format {found}), whose dataset fingerprint "
                "did not cover the files' contents, so it cannot tell whether the data is "
                "the same"
                if found < 2
                else f"it was saved by {by} (state format {found}), which shuffled chunks "
                "in another order: the rest of its epoch would not be the batches it left"
            )
        else:
            why = f"it has state format {found!r} (saved by {by})"
        raise InvalidArgumentError(
            f"cannot resume from this state: {why}; this version of tabloader "
            f"({_version()}) reads format {STATE_FORMAT}. Resume from a state saved by this "
            f"version, or start over at its epoch (loader.set_epoch({state.get(STATE_EPOCH)!r}))"
        )
    for name in (STATE_EPOCH, STATE_SEED, STATE_BATCHES, STATE_WORKER, STATE_NUM_WORKERS):
        value = state.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(
                f"not a tabloader loader state: its {name!r} must be an integer, got "
                f"{_short(value)}"
            )
    for name in (STATE_DATASET, STATE_OPTIONS):
        if not isinstance(state.get(name), Mapping):
            raise InvalidArgumentError(
                f"not a tabloader loader state: its {name!r} must be a dict (as "
                f"Loader.state_dict() makes it), got {_short(state.get(name))}"
            )


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_fingerprint(fingerprint: object) -> str:
    if not isinstance(fingerprint, Mapping):
        return _short(fingerprint)
    return (
        f"{fingerprint.get('rows')} rows in {fingerprint.get('partitions')} partitions of "
        f"{fingerprint.get('files')} files, digest {fingerprint.get('digest')}"
    )
