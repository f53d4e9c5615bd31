"""The MovieLens example: prepare.py on stand-in MovieLens zips, then the training scripts
on them, on generated ratings (``--synthetic``), and on nothing (an error, never a fallback).

The MovieLens licence does not allow shipping the ratings, and tests fetch nothing: a
full-size stand-in of ``ml-100k.zip`` (`ml100k_standin`: 943 users, 1,682 movies,
100,000 ratings, 19 genres, in its exact files and formats) takes its place, with
ratings drawn from hidden user and movie biases so that there is something to learn."""

from __future__ import annotations

import importlib.util
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "movielens"
GENRES = ["unknown", "Action", "Comedy", "Drama", "Children's"]


def load(name):
    spec = importlib.util.spec_from_file_location(f"movielens_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare():
    return load("prepare")


def fake_ratings(rows=1500, seed=0):
    """Unique (user, movie) pairs; even-numbered movies are liked, with 10% noise.

    Original ids have gaps (multiples of 7 and 11) so that contiguity is tested.
    """
    rng = np.random.default_rng(seed)
    pairs = rng.choice(60 * 40, size=rows, replace=False)
    users = (pairs // 40 + 1) * 7
    movie_index = pairs % 40
    movies = (movie_index + 1) * 11
    liked = (movie_index % 2 == 0) ^ (rng.random(rows) < 0.1)
    ratings = np.where(liked, rng.integers(4, 6, rows), rng.integers(1, 4, rows)).astype(float)
    timestamps = 880_000_000 + rng.permutation(rows) * 100
    # a user whose only rating is the latest one: unseen in training with a time split
    users[np.argmax(timestamps)] = 9_999
    genres = {int((i + 1) * 11): [GENRES[i % 5], GENRES[(i * 3 + 1) % 5]] for i in range(40)}
    genres = {movie: sorted(set(names)) for movie, names in genres.items()}
    return users, movies, ratings, timestamps, genres


def ml100k_zip(path, data):
    users, movies, ratings, timestamps, genres = data
    lines = [
        f"{u}\t{m}\t{int(r)}\t{t}"
        for u, m, r, t in zip(users, movies, ratings, timestamps, strict=True)
    ]
    items = []
    for movie, names in genres.items():
        flags = "|".join("1" if g in names else "0" for g in GENRES)
        items.append(f"{movie}|Movie \xe9 {movie} (1995)|01-Jan-1995||http://x|{flags}")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ml-100k/u.data", "\n".join(lines) + "\n")
        archive.writestr("ml-100k/u.item", ("\n".join(items) + "\n").encode("latin-1"))
        archive.writestr("ml-100k/u.genre", "".join(f"{g}|{i}\n" for i, g in enumerate(GENRES)))
    return path


def latest_zip(path, data):
    users, movies, ratings, timestamps, genres = data
    out = io.StringIO()
    out.write("userId,movieId,rating,timestamp\n")
    for u, m, r, t in zip(users, movies, ratings, timestamps, strict=True):
        out.write(f"{u},{m},{r - 0.5 if r > 3 else r},{t}\n")
    movies_csv = "movieId,title,genres\n" + "".join(
        f'{movie},"Movie {movie}, The (1995)",{"|".join(names)}\n'
        for movie, names in genres.items()
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ml-latest-small/ratings.csv", out.getvalue())
        archive.writestr("ml-latest-small/movies.csv", movies_csv)
    return path


ML100K_GENRES = [
    "unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
    "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
    "Romance", "Sci-Fi", "Thriller", "War", "Western",
]  # fmt: skip


@pytest.fixture(scope="module")
def ml100k_standin(tmp_path_factory):
    """``ml-100k.zip`` as GroupLens ships it (``u.data``: user, item, rating, timestamp
    separated by tabs; ``u.item`` in latin-1 with 19 genre flags; ``u.genre``), the same
    size, every user with 20 ratings or more, popular movies rated more often."""
    rng = np.random.default_rng(100)
    users, movies = 943, 1682
    popularity = rng.zipf(1.6, movies).astype(float)
    popularity /= popularity.sum()
    counts = 20 + rng.multinomial(100_000 - 20 * users, np.full(users, 1 / users))
    user_bias, movie_bias = rng.normal(0, 0.8, users), rng.normal(0, 0.9, movies)
    lines = []
    for user in range(users):
        chosen = rng.choice(movies, size=counts[user], replace=False, p=popularity)
        score = user_bias[user] + movie_bias[chosen] + rng.normal(0, 0.6, len(chosen))
        ratings = np.clip(np.round(3.6 + score), 1, 5).astype(int)
        stamps = 874_724_710 + rng.integers(0, 20_000_000, len(chosen))
        lines += [
            f"{user + 1}\t{m + 1}\t{r}\t{t}"
            for m, r, t in zip(chosen, ratings, stamps, strict=True)
        ]
    order = rng.permutation(len(lines))
    flags = rng.random((movies, len(ML100K_GENRES))) < 0.12
    items = [
        f"{m + 1}|Movie {m + 1} \xe9 (1995)|01-Jan-1995||http://x|"
        + "|".join("1" if f else "0" for f in flags[m])
        for m in range(movies)
    ]
    path = tmp_path_factory.mktemp("ml-100k") / "ml-100k.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ml-100k/u.data", "\n".join(lines[i] for i in order) + "\n")
        archive.writestr("ml-100k/u.item", ("\n".join(items) + "\n").encode("latin-1"))
        archive.writestr(
            "ml-100k/u.genre", "".join(f"{g}|{i}\n" for i, g in enumerate(ML100K_GENRES))
        )
    return path


@pytest.mark.parametrize("fmt", ["ml-100k", "ml-latest-small"])
@pytest.mark.parametrize("split", ["random", "time"])
def test_prepare_reads_an_official_zip(prepare, tmp_path, fmt, split):
    data = fake_ratings()
    write = ml100k_zip if fmt == "ml-100k" else latest_zip
    archive = write(tmp_path / f"{fmt}.zip", data)
    out = tmp_path / "out"
    meta = prepare.main([str(archive), "--out", str(out), "--genres", "--split", split])
    assert meta["split"] == split
    check_prepared(prepare, out, data, meta, split=split)


def check_prepared(prepare, out, data, meta, *, split):
    """Decode every row with the mapping prepare documents, then compare to the input."""
    users, movies, ratings, timestamps, genres = data
    train, valid = pq.read_table(out / "train.parquet"), pq.read_table(out / "valid.parquet")
    assert train.num_rows + valid.num_rows == len(users)
    assert valid.num_rows == round(0.2 * len(users))
    genre_columns = [prepare.genre_column(g) for g in sorted(set(GENRES))]
    assert meta["genres"] == genre_columns
    assert "genre_children_s" in genre_columns
    for table in (train, valid):
        assert str(table.schema.field("userId").type) == "int64"
        assert str(table.schema.field("movieId").type) == "int64"
        for name in ["label", *genre_columns]:
            assert str(table.schema.field(name).type) == "float"

    # Which input rows went to training: the split is reproducible from its definition.
    rows = len(users)
    if split == "time":
        order = np.argsort(timestamps, kind="stable")
    else:
        order = np.random.default_rng(0).permutation(rows)
    train_rows, valid_rows = np.sort(order[: train.num_rows]), np.sort(order[train.num_rows :])
    for name, original in (("userId", users), ("movieId", movies)):
        known = np.unique(original[train_rows])  # sorted: code = position
        assert meta["cardinalities"][name] == len(known) + 1
        np.testing.assert_array_equal(
            train[name].to_numpy(), np.searchsorted(known, original[train_rows])
        )
        expected_valid = np.array(
            [np.searchsorted(known, v) if v in known else len(known) for v in original[valid_rows]]
        )
        np.testing.assert_array_equal(valid[name].to_numpy(), expected_valid)
    for table, picked in ((train, train_rows), (valid, valid_rows)):
        np.testing.assert_array_equal(
            table["label"].to_numpy(), (ratings[picked] > 3).astype(np.float32)
        )
        for genre in sorted(set(GENRES)):
            expected = [float(genre in genres[int(m)]) for m in movies[picked]]
            np.testing.assert_array_equal(table[prepare.genre_column(genre)].to_numpy(), expected)
    if split == "time":
        assert timestamps[valid_rows].min() > timestamps[train_rows].max()
        unseen = meta["cardinalities"]["userId"] - 1
        assert (valid["userId"].to_numpy() == unseen).any()  # the reserved id is used


def test_prepare_without_genres_writes_ids_and_label_only(prepare, tmp_path):
    archive = ml100k_zip(tmp_path / "ml-100k.zip", fake_ratings(rows=300))
    meta = prepare.main([str(archive), "--out", str(tmp_path / "out")])
    assert meta["genres"] == []
    assert pq.read_schema(tmp_path / "out" / "train.parquet").names == [
        "userId",
        "movieId",
        "label",
    ]


def test_prepare_rejects_other_zips(prepare, tmp_path):
    archive = tmp_path / "other.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("ml-1m/ratings.dat", "1::2::3::4\n")
    with pytest.raises(SystemExit, match=r"neither u\.data"):
        prepare.main([str(archive), "--out", str(tmp_path / "out")])


@pytest.mark.tensorflow
def test_train_keras_learns_on_a_small_slice(prepare, tmp_path, capsys):
    data = fake_ratings(rows=2400)
    archive = ml100k_zip(tmp_path / "ml-100k.zip", data)
    out = tmp_path / "out"
    prepare.main([str(archive), "--out", str(out), "--genres"])
    train_keras = load("train_keras")
    history = train_keras.main(
        ["--data", str(out), "--epochs", "2", "--max-rows", "1600", "--batch-size", "64",
         "--lr", "0.01"]
    )  # fmt: skip
    logs = history.history
    assert set(logs) == {"loss", "auc", "val_loss", "val_auc"}
    assert logs["loss"][1] < logs["loss"][0]
    assert logs["val_auc"][1] > 0.6  # liked movies are learnable from the movie id
    printed = capsys.readouterr().out
    assert f"training on your data in {out}" in printed
    assert "1600 training rows in 25 batches" in printed
    genres = len(json.loads((out / "meta.json").read_text())["genre_names"])
    assert genres > 0
    assert f"validation rows, {genres} genres" in printed  # the genres list column, padded
    assert printed.count("val_auc") == 2
    assert "epoch 2: 1,600/1,600 rows in " in printed  # progress, as plain lines off a tty


@pytest.mark.jax
def test_train_jax_learns_on_a_small_slice_and_compares_with_a_constant_predictor(
    prepare, tmp_path, capsys
):
    archive = ml100k_zip(tmp_path / "ml-100k.zip", fake_ratings(rows=2400))
    out = tmp_path / "out"
    prepare.main([str(archive), "--out", str(out), "--genres"])
    history = load("train_jax").main(
        ["--data", str(out), "--epochs", "3", "--batch-size", "64", "--embedding-dim", "8"]
    )
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert history[-1]["valid_auc"] > 0.6  # liked movies are learnable from the movie id
    assert all(h["constant_auc"] == 0.5 for h in history)
    printed = capsys.readouterr().out
    genres = len(json.loads((out / "meta.json").read_text())["genre_names"])
    assert f"1920 training rows in 30 batches, 480 validation rows, {genres} genres" in printed
    assert printed.count("(constant predictor: 0.5000)") == 3


@pytest.mark.jax
@pytest.mark.slow
def test_train_jax_on_ml100k_beats_the_constant_predictor(
    prepare, ml100k_standin, tmp_path, capsys
):
    prepare.main([str(ml100k_standin), "--out", str(tmp_path), "--genres"])
    history = load("train_jax").main(["--data", str(tmp_path), "--epochs", "3"])
    assert "80000 training rows in 79 batches, 20000 validation rows, 19 genres" in (
        capsys.readouterr().out
    )
    assert history[-1]["valid_auc"] > 0.75 > 0.5 == history[-1]["constant_auc"]
    print(f"ml-100k valid AUC after 3 epochs (JAX): {history[-1]['valid_auc']:.4f}")


@pytest.mark.parametrize("script", ["train_torch", "train_keras", "train_jax"])
def test_training_without_data_is_an_error_naming_the_path(tmp_path, script, capsys):
    needs = {"train_torch": "torch", "train_keras": "tensorflow", "train_jax": "jax"}
    pytest.importorskip(needs[script])
    example = load(script)
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--data", str(tmp_path / "absent")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'absent' / 'train.parquet'} does not exist" in err
    assert "examples/movielens/prepare.py writes them), or --synthetic" in err
    assert not (tmp_path / "absent").exists()  # nothing generated behind the user's back


@pytest.mark.torch
@pytest.mark.slow
def test_train_torch_learns_on_synthetic_ratings_and_reuses_them(tmp_path, capsys):
    import torch

    example = load("train_torch")
    before = torch.get_num_threads()
    data = tmp_path / "synthetic"
    args = ["--data", str(data), "--rows", "8000", "--epochs", "2", "--batch-size", "256"]
    try:
        history = example.main(["--synthetic", *args, "--embedding-dim", "8", "--threads", "1"])
        printed = capsys.readouterr().out
        assert f"writing 8,000 rows of generated data to {data}" in printed
        assert "PyTorch threads: 1" in printed
        assert history[1]["train_loss"] < history[0]["train_loss"]
        assert history[1]["valid_auc"] > 0.75  # the hidden user and movie biases
        assert json.loads((data / "meta.json").read_text())["rows"] == {
            "train": 8000,
            "valid": 1600,
        }
        written = (data / "train.parquet").stat().st_mtime_ns
        example.main(["--synthetic", *args, "--epochs", "1", "--threads", "1"])
        assert "writing" not in capsys.readouterr().out
        assert (data / "train.parquet").stat().st_mtime_ns == written
    finally:
        torch.set_num_threads(before)


def test_prepare_reads_a_whole_ml100k_zip(prepare, ml100k_standin, tmp_path, capsys):
    meta = prepare.main([str(ml100k_standin), "--out", str(tmp_path), "--genres"])
    assert meta["rows"] == {"train": 80_000, "valid": 20_000}
    assert meta["cardinalities"]["userId"] == 944  # all 943 users rate in training
    assert 1600 < meta["cardinalities"]["movieId"] <= 1683
    assert len(meta["genres"]) == 19
    valid = pq.read_table(tmp_path / "valid.parquet")
    assert 0.5 < valid["label"].to_numpy().mean() < 0.6


@pytest.mark.torch
@pytest.mark.slow
def test_train_torch_reads_the_genres_as_a_list_column_and_reports_both_aucs(
    prepare, ml100k_standin, tmp_path, capsys
):
    import torch

    prepare.main([str(ml100k_standin), "--out", str(tmp_path), "--genres"])
    assert pq.read_schema(tmp_path / "train.parquet").field("genres").type == pa.list_(pa.int64())
    example = load("train_torch")
    before = torch.get_num_threads()
    args = ["--data", str(tmp_path), "--epochs", "2", "--embedding-dim", "8", "--threads", "1"]
    try:
        with_genres = example.main(args)
        assert "19 genres in an EmbeddingBag" in capsys.readouterr().out
        without = example.main([*args, "--without-genres"])
        assert "0 genre features" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)
    for history in (with_genres, without):
        assert history[-1]["valid_auc"] > 0.7  # a constant predictor scores 0.5
    print(
        f"ml-100k valid AUC after 2 epochs: {with_genres[-1]['valid_auc']:.4f} with the genres, "
        f"{without[-1]['valid_auc']:.4f} without"
    )


def test_prepare_without_a_zip_says_where_to_get_one(prepare, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        prepare.main([str(tmp_path / "ml-100k.zip"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "ml-100k.zip does not exist: download ml-100k.zip" in err
    assert "grouplens.org/datasets/movielens" in err
