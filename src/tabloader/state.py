"""Where an epoch stands: an immutable cursor, the state dict of a job, and its checks.

What a loader must remember to continue an epoch is a few integers: the epoch, its seed,
the batches already handed to the consumer, and which worker process share of the epoch
they belong to. A `Cursor` holds exactly that for one worker share (with the earlier
worlds of the epoch, when it was resumed on another number of ranks or workers) and
never changes; whoever iterates keeps its own (the core loader, each framework adapter's
epochs) and makes a new one to move on.

A saved state describes a whole job (a `Position`): the ranks of a job are in step, so
one state says how many batches every worker share of every rank delivered, and any
rank's state resumes every rank, on this number of ranks and workers or another.
`Position.to_state` writes it (format `STATE_FORMAT`), with the `Fingerprint` of the
data and of the options that decide the order of rows; `Position.from_state` reads one
back, refusing a state saved for other data or options, or by another version of
tabloader, naming what differs; `agreed_state` checks that the states of a job's ranks
are one.

Examples:
    >>> here = Fingerprint({"rows": 10}, {})
    >>> saved = Cursor(epoch=2, seed=7, batches=5).position(global_size=1).to_state(here)
    >>> (saved["epoch"], saved["seed"], saved["batches"], saved["format"] == STATE_FORMAT)
    (2, 7, 5, True)
    >>> Position.from_state(saved, here, seed=7).cursor(global_size=2)
    Cursor(epoch=2, seed=7, batches=0, worker=0, num_workers=1, legs=(Leg(global_size=1, \
num_workers=1, batches=(5,)),))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tabloader._version import __version__
from tabloader.elastic import Leg
from tabloader.errors import InvalidArgumentError
from tabloader.options import int_at_least

if TYPE_CHECKING:
    from tabloader.dataset import Dataset

__all__ = [
    "STATE_FORMAT",
    "Cursor",
    "Fingerprint",
    "Position",
    "agreed_state",
    "check_state_shape",
    "dataset_difference",
    "dataset_fingerprint",
    "merge_worker_states",
]

STATE_FORMAT = 4
"""Version of the dict [`Loader.state_dict`][tabloader.Loader.state_dict] returns. 2: the
dataset fingerprint covers the files' contents (their footers), and the state names the
tabloader version. 3: chunks are shuffled by a counter-based permutation (the same on a
GPU), so a seed gives another order than before. 4: one state describes the whole job
(every worker share's batches, the world they were delivered on, and the earlier worlds
of the epoch), the same on every rank, and resumes on another number of ranks or
workers. Format 3 states are still read: each resumes its own rank and worker share."""
_PER_RANK_FORMAT = 3
"""The last format whose states belong to one rank (its options name it)."""
# The keys of a saved state: where the epoch stands, and what must match to resume it.
STATE_FORMAT_KEY = "format"
STATE_VERSION = "tabloader"
STATE_EPOCH = "epoch"
STATE_SEED = "seed"
STATE_BATCHES = "batches"
STATE_GLOBAL_SIZE = "global_size"
STATE_NUM_WORKERS = "num_workers"
STATE_WORKER_BATCHES = "worker_batches"
STATE_EARLIER = "earlier"
STATE_WORKER = "worker"  # format 3: the worker share of a state
STATE_DATASET = "dataset"
STATE_OPTIONS = "options"
WORLD_OPTIONS = ("global_rank", "global_size")
"""Options a job state does not hold among its options: a state is every rank's, and its
world (``global_size``) is where it stands, not what it must match."""


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
    came out byte for byte the same (see `dataset_difference`). A local file's stamps
    are its machine's alone (another machine's copy at the same path has other inodes and
    times): ``host`` says which machine took them.
    """
    rows = dataset.partition_rows.tolist()
    identities = dataset.file_identities()
    names = [f.replace("\\", "/").rsplit("/", 1)[-1] for f in dataset.files]
    fingerprint: dict[str, Any] = {"files": len(names), "partitions": len(rows)}
    if names:
        contents: list[Any] = [f["footer"] for f in identities]
        fingerprint["place"] = _digest([f["path"] for f in identities])
        fingerprint["stamps"] = _digest(identities)
        if any("inode" in f for f in identities):  # local files: this machine's stamps
            fingerprint["host"] = _digest(socket.gethostname())
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
        >>> local = {**a, "host": "h"}  # another machine's copy at the same path
        >>> dataset_difference(local, {**local, "stamps": "t", "host": "i"}) is None
        True

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
    same_machine = saved.get("host") == now.get("host")  # (None for object stores')
    if (
        same_machine
        and saved.get("place") == now.get("place")
        and saved.get("stamps") != now.get("stamps")
    ):
        return (
            "the dataset: its files were rewritten in place since the state was saved (the "
            "same names, rows and footers, but other modification or change times, inodes "
            "or object versions)"
        )
    return None


def _rows_identity(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """What of a dataset fingerprint tells its rows, not where they are read from (the
    place, the files' stamps and the machine that took them: every node of a job may
    read a copy of its own)."""
    return {k: v for k, v in fingerprint.items() if k not in ("place", "stamps", "host")}


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cursor:
    """A position in the epochs: ``batches`` batches of epoch ``epoch`` handed out, in
    worker share ``worker`` of ``num_workers``, the epoch shuffled with ``seed``; ``legs``
    are the worlds that served the epoch before this one (see
    [`plan_rest`][tabloader.elastic.plan_rest]), empty unless it was resumed on another.

    Immutable: moving on makes a new cursor (`at`, `next_epoch`, ``dataclasses.replace``).
    """

    epoch: int
    seed: int
    batches: int = 0
    worker: int = 0
    num_workers: int = 1
    legs: tuple[Leg, ...] = ()

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
            Cursor(epoch=4, seed=1, batches=0, worker=0, num_workers=1, legs=())
        """
        return dataclasses.replace(self, epoch=self.epoch + 1, batches=0, legs=())

    def position(
        self, *, global_size: int, worker_batches: Sequence[int | None] | None = None
    ) -> Position:
        """The job's position, this cursor being a worker share of a rank of
        ``global_size`` ranks: what ``worker_batches`` says every worker share delivered,
        or only this one's (when it is not the rank's only share, the other shares are
        unknown: a state of this worker alone).
        """
        if worker_batches is None:
            worker_batches = [None] * self.num_workers
            worker_batches[self.worker] = self.batches
        return Position(
            self.epoch, self.seed, global_size, self.num_workers, tuple(worker_batches), self.legs
        )


@dataclass(frozen=True)
class Position:
    """Where a job stands in its epochs, as a saved state says: epoch ``epoch`` shuffled
    with ``seed``, on ``global_size`` ranks of ``num_workers`` worker shares each, worker
    share ``w`` of every rank having delivered ``worker_batches[w]`` batches (None where
    the state does not know: one saved inside a worker process), after the worlds
    ``legs`` served the epoch before.
    """

    epoch: int
    seed: int
    global_size: int
    num_workers: int
    worker_batches: tuple[int | None, ...]
    legs: tuple[Leg, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether the state knows every worker share's batches (a job state)."""
        return None not in self.worker_batches

    @property
    def started(self) -> bool:
        """Whether any batch of the epoch was delivered (on this world or an earlier)."""
        return bool(self.legs) or any(self.worker_batches)

    @property
    def batches(self) -> int:
        """Batches each rank delivered on this world (those of the shares known)."""
        return sum(b for b in self.worker_batches if b is not None)

    def next_epoch(self) -> Position:
        """The start of the next epoch, on this world."""
        return Position(
            self.epoch + 1, self.seed, self.global_size, self.num_workers, (0,) * self.num_workers
        )

    def cursor(self, *, global_size: int, worker: int = 0, num_workers: int = 1) -> Cursor:
        """Where worker share ``worker`` of ``num_workers`` of a rank of ``global_size``
        ranks continues: on this world, where the share stopped; on another, at the
        start of the rest of the epoch dealt to the new world (this world one of its
        legs), or at the epoch's start when nothing of it was delivered.

        Raises:
            InvalidArgumentError: this state knows only another worker share's batches.
        """
        same = (global_size, num_workers) == (self.global_size, self.num_workers)
        if not self.complete and not (same and self.worker_batches[worker] is not None):
            known = [w for w, b in enumerate(self.worker_batches) if b is not None]
            raise InvalidArgumentError(
                f"this state was saved mid-epoch by worker {known[0]} of {self.num_workers} "
                f"and cannot continue in worker {worker} of {num_workers}"
                + ("" if global_size == self.global_size else f" on {global_size} ranks")
                + ": it says only how far that worker got. Resume with the same num_workers "
                "(with worker processes, save and load through torchdata's "
                "StatefulDataLoader), or save the state of the whole job "
                "(tabloader.torch.agreed_state reads a StatefulDataLoader's workers)"
            )
        if same:
            batches = self.worker_batches[worker]
            assert batches is not None  # known, checked above
            return Cursor(self.epoch, self.seed, batches, worker, num_workers, self.legs)
        if not self.started:
            return Cursor(self.epoch, self.seed, 0, worker, num_workers)
        here = Leg(
            self.global_size, self.num_workers, tuple(int(b or 0) for b in self.worker_batches)
        )
        return Cursor(self.epoch, self.seed, 0, worker, num_workers, (*self.legs, here))

    def to_state(self, fingerprint: Fingerprint) -> dict[str, Any]:
        """The state dict of this position (small, JSON-serialisable; see
        [`Loader.state_dict`][tabloader.Loader.state_dict]); the same on every rank."""
        return {
            STATE_FORMAT_KEY: STATE_FORMAT,
            STATE_VERSION: _version(),
            STATE_EPOCH: int(self.epoch),
            STATE_SEED: int(self.seed),
            STATE_BATCHES: int(self.batches),
            STATE_GLOBAL_SIZE: int(self.global_size),
            STATE_NUM_WORKERS: int(self.num_workers),
            STATE_WORKER_BATCHES: [None if b is None else int(b) for b in self.worker_batches],
            STATE_EARLIER: [
                {
                    STATE_GLOBAL_SIZE: leg.global_size,
                    STATE_NUM_WORKERS: leg.num_workers,
                    STATE_WORKER_BATCHES: list(leg.batches),
                }
                for leg in self.legs
            ],
            STATE_DATASET: dict(fingerprint.dataset),
            STATE_OPTIONS: {k: v for k, v in fingerprint.options.items() if k not in WORLD_OPTIONS},
        }

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        fingerprint: Fingerprint,
        *,
        seed: int,
        adopt_seed: bool = False,
        listing_changes: bool = False,
    ) -> Position:
        """The position a saved state holds, checked against where it is resumed.

        ``fingerprint`` is the data and options of the resuming run, ``seed`` its seed
        (with ``adopt_seed``, a different saved seed is taken rather than refused). A
        state of this format resumes on any world; one of format 3 belongs to the rank
        that saved it, whose ``global_rank`` and ``global_size`` must match.
        ``listing_changes``: the dataset is listed again each epoch (``refresh=True``),
        so a state that delivered nothing of its epoch starts it on any listing.

        Raises:
            InvalidArgumentError: ``state`` is not a state dict this version reads, or
                was saved by a run with other data, options or seed (the message names
                the saved and the current value of each).
        """
        check_state_shape(state)
        per_rank = state[STATE_FORMAT_KEY] == _PER_RANK_FORMAT
        differences = []
        dataset = dataset_difference(state[STATE_DATASET], fingerprint.dataset)
        if dataset is not None and not (listing_changes and _delivered_nothing(state, per_rank)):
            differences.append(dataset)
        saved_options = state[STATE_OPTIONS]
        for name, value in fingerprint.options.items():
            if name in WORLD_OPTIONS and not per_rank:
                continue
            if saved_options.get(name) != value:
                note = fingerprint.notes.get(name)
                differences.append(
                    f"{name} (saved: {saved_options.get(name)!r}; now: {value!r}"
                    + (f": {note})" if note else ")")
                )
        saved_seed = state[STATE_SEED]
        unshuffled = fingerprint.options.get("shuffle") is False  # the seed decides nothing
        if not adopt_seed and not unshuffled and saved_seed != seed:
            differences.append(f"seed (saved: {saved_seed!r}; now: {seed!r})")
        if differences:
            raise InvalidArgumentError(
                "cannot resume from this state: it differs from this loader in "
                + ", ".join(differences)
                + ". Resume with the same data and options as the run that saved it"
            )
        epoch = int_at_least(state[STATE_EPOCH], 0, "the state's epoch")
        saved = int_at_least(saved_seed, 0, "the state's seed")
        if per_rank:
            workers = int_at_least(state.get(STATE_NUM_WORKERS, 1), 1, "the state's num_workers")
            worker = state.get(STATE_WORKER, 0)
            if not 0 <= worker < workers:
                raise InvalidArgumentError(
                    f"not a tabloader loader state: its worker {worker!r} is not in [0, {workers})"
                )
            known: list[int | None] = [None] * workers
            known[worker] = int_at_least(state[STATE_BATCHES], 0, "the state's batches")
            size = saved_options.get("global_size", 1)
            return cls(epoch, saved, size, workers, tuple(known))
        return cls(
            epoch,
            saved,
            state[STATE_GLOBAL_SIZE],
            state[STATE_NUM_WORKERS],
            tuple(state[STATE_WORKER_BATCHES]),
            tuple(
                Leg(
                    leg[STATE_GLOBAL_SIZE], leg[STATE_NUM_WORKERS], tuple(leg[STATE_WORKER_BATCHES])
                )
                for leg in state[STATE_EARLIER]
            ),
        )


def _delivered_nothing(state: Mapping[str, Any], per_rank: bool) -> bool:
    """Whether ``state`` (of a shape already checked) stands at the start of its epoch."""
    if per_rank:
        return bool(state[STATE_BATCHES] == 0)
    return not state[STATE_EARLIER] and not any(state[STATE_WORKER_BATCHES])


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
    if found not in (STATE_FORMAT, _PER_RANK_FORMAT):
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
            f"({_version()}) reads format {STATE_FORMAT} (and {_PER_RANK_FORMAT}). Resume "
            "from a state saved by this version, or start over at its epoch "
            f"(loader.set_epoch({state.get(STATE_EPOCH)!r}))"
        )
    integers = [STATE_EPOCH, STATE_SEED, STATE_BATCHES, STATE_NUM_WORKERS]
    integers += [STATE_WORKER] if found == _PER_RANK_FORMAT else [STATE_GLOBAL_SIZE]
    for name in integers:
        _integer(state.get(name, 0), name)
    for name in (STATE_DATASET, STATE_OPTIONS):
        if not isinstance(state.get(name), Mapping):
            raise InvalidArgumentError(
                f"not a tabloader loader state: its {name!r} must be a dict (as "
                f"Loader.state_dict() makes it), got {_short(state.get(name))}"
            )
    if found == _PER_RANK_FORMAT:
        return
    world = [(state.get(STATE_GLOBAL_SIZE), state.get(STATE_NUM_WORKERS), state)]
    earlier = state.get(STATE_EARLIER)
    if not isinstance(earlier, list) or not all(isinstance(leg, Mapping) for leg in earlier):
        raise InvalidArgumentError(
            f"not a tabloader loader state: its {STATE_EARLIER!r} must be a list of dicts, "
            f"got {_short(earlier)}"
        )
    world += [(leg.get(STATE_GLOBAL_SIZE), leg.get(STATE_NUM_WORKERS), leg) for leg in earlier]
    for i, (size, workers, where) in enumerate(world):
        what = "its" if i == 0 else f"its earlier world {i - 1}'s"
        for name, value in ((STATE_GLOBAL_SIZE, size), (STATE_NUM_WORKERS, workers)):
            if _integer(value, name, what) < 1:
                raise InvalidArgumentError(
                    f"not a tabloader loader state: {what} {name!r} must be at least 1, "
                    f"got {value!r}"
                )
        counts = where.get(STATE_WORKER_BATCHES)
        unknown_allowed = i == 0
        if (
            not isinstance(counts, list)
            or len(counts) != workers
            or not all(
                (c is None and unknown_allowed)
                or (isinstance(c, int) and not isinstance(c, bool) and c >= 0)
                for c in counts
            )
        ):
            raise InvalidArgumentError(
                f"not a tabloader loader state: {what} {STATE_WORKER_BATCHES!r} must be a "
                f"list of {workers} non-negative integers (one per worker share), got "
                f"{_short(counts)}"
            )
    counts = state[STATE_WORKER_BATCHES]
    if state[STATE_BATCHES] != sum(c for c in counts if c is not None):
        raise InvalidArgumentError(
            f"not a tabloader loader state: its {STATE_BATCHES!r} ({state[STATE_BATCHES]!r}) "
            f"is not the sum of its {STATE_WORKER_BATCHES!r} ({_short(counts)})"
        )


def _integer(value: object, name: str, what: str = "its") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(
            f"not a tabloader loader state: {what} {name!r} must be an integer, got {_short(value)}"
        )
    return value


def agreed_state(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The one state of a job whose ranks saved ``states`` (``states[r]`` rank ``r``'s),
    checked: every rank's must be the same, or the ranks were not in step when they
    saved. A job needs to keep one of them: any rank's resumes every rank, on this
    number of ranks or another (the framework adapters gather them for you:
    ``tabloader.torch.agreed_state``, ``tabloader.jax.agreed_state``).

    Raises:
        InvalidArgumentError: ``states`` is empty, is not one state per rank, holds a
            state of one worker process alone, or the ranks' states differ (the message
            names the first thing that differs and the ranks).

    Examples:
        >>> here = Fingerprint({"rows": 10}, {})
        >>> state = Cursor(0, seed=1, batches=3).position(global_size=2).to_state(here)
        >>> agreed_state([state, dict(state)])["batches"]
        3
        >>> ahead = Cursor(0, seed=1, batches=4).position(global_size=2).to_state(here)
        >>> agreed_state([state, ahead])
        Traceback (most recent call last):
        ...
        tabloader.errors.InvalidArgumentError: the ranks' states differ: rank 1's batches \
is 4, rank 0's 3. The ranks were not in step when they saved: save the state at the same \
step on every rank (after the same number of batches)
    """
    if not states:
        raise InvalidArgumentError("no states: pass the state of every rank, rank 0's first")
    for rank, state in enumerate(states):
        check_state_shape(state)
        if state[STATE_FORMAT_KEY] == _PER_RANK_FORMAT:
            raise InvalidArgumentError(
                f"rank {rank}'s state has format {_PER_RANK_FORMAT} (saved by tabloader "
                f"{state.get(STATE_VERSION)}): such states belong to their rank, so each "
                "rank resumes its own. Save the states again with this version"
            )
    first = states[0]
    shuffled = bool(first.get(STATE_OPTIONS, {}).get("shuffle", True))
    for rank, state in enumerate(states[1:], start=1):
        for key in sorted(set(first) | set(state)):
            mine, theirs = first.get(key), state.get(key)
            if key == STATE_SEED and not shuffled:
                continue  # it decides nothing unshuffled (ranks draw their own without one)
            if key == STATE_DATASET and isinstance(mine, Mapping) and isinstance(theirs, Mapping):
                # the same rows, wherever each rank reads them from (a copy on each node)
                mine, theirs = _rows_identity(mine), _rows_identity(theirs)
            if mine != theirs:
                raise InvalidArgumentError(
                    f"the ranks' states differ: rank {rank}'s {key} is "
                    f"{_short(state.get(key))}, rank 0's {_short(first.get(key))}. "
                    + (
                        "The ranks were not in step when they saved: save the state at "
                        "the same step on every rank (after the same number of batches)"
                        if key in (STATE_EPOCH, STATE_BATCHES, STATE_WORKER_BATCHES)
                        else "Every rank must load the same data with the same options and seed"
                    )
                )
    if None in first[STATE_WORKER_BATCHES]:
        raise InvalidArgumentError(
            "this state was saved inside a worker process and says only how far that "
            "worker got: pass the state of the dataset in the training process (with "
            "worker processes, tabloader.torch.agreed_state(loader) reads a "
            "StatefulDataLoader's workers)"
        )
    if first[STATE_GLOBAL_SIZE] != len(states):
        raise InvalidArgumentError(
            f"{len(states)} state(s) for a job of {first[STATE_GLOBAL_SIZE]} ranks: pass "
            "every rank's state, one per rank"
        )
    return dict(first)


def merge_worker_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The state of a rank whose worker processes saved ``states`` (one each, in any
    order): every worker share's batches in one state.

    Raises:
        InvalidArgumentError: the states are not one per worker share of one epoch
            (the message says what differs or is missing).

    Examples:
        >>> here = Fingerprint({"rows": 10}, {})
        >>> shares = [Cursor(1, 7, b, w, 2).position(global_size=1).to_state(here)
        ...           for w, b in ((1, 4), (0, 5))]
        >>> merged = merge_worker_states(shares)
        >>> merged["worker_batches"], merged["batches"]
        ([5, 4], 9)
    """
    if not states:
        raise InvalidArgumentError("no worker states to merge")
    for state in states:
        check_state_shape(state)
        if state[STATE_FORMAT_KEY] == _PER_RANK_FORMAT:
            raise InvalidArgumentError(
                f"a worker's state has format {_PER_RANK_FORMAT} (saved by tabloader "
                f"{state.get(STATE_VERSION)}), which cannot be merged: save it again"
            )
    first = states[0]
    counts: list[int | None] = [None] * first[STATE_NUM_WORKERS]
    same = (STATE_EPOCH, STATE_SEED, STATE_GLOBAL_SIZE, STATE_NUM_WORKERS, STATE_EARLIER)
    for state in states:
        for key in (*same, STATE_DATASET, STATE_OPTIONS):
            if state[key] != first[key]:
                raise InvalidArgumentError(
                    f"the worker states are not of one epoch of one loader: their {key} "
                    f"differs ({_short(state[key])} and {_short(first[key])})"
                )
        for w, batches in enumerate(state[STATE_WORKER_BATCHES]):
            if batches is not None and counts[w] not in (None, batches):
                raise InvalidArgumentError(
                    f"two worker states say worker {w} delivered {counts[w]} and {batches} batches"
                )
            if batches is not None:
                counts[w] = batches
    missing = [w for w, b in enumerate(counts) if b is None]
    if missing:
        raise InvalidArgumentError(
            f"no state of worker(s) {missing} of {len(counts)}: pass every worker's state"
        )
    merged = dict(first)
    merged[STATE_WORKER_BATCHES] = counts
    merged[STATE_BATCHES] = sum(b for b in counts if b is not None)
    return merged


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
