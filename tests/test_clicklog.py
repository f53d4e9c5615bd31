"""examples/clicklog: a raw click log (text ids, times, empty cells) to a trained PyTorch
model with tabloader's command line, and a second day converted with the first day's
vocabulary, its ids unchanged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tabloader.vocabulary import read_vocabulary

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "examples" / "clicklog" / "run.sh"


@pytest.mark.torch
@pytest.mark.slow
def test_the_click_log_example_runs_from_csv_to_a_model_and_keeps_ids(tmp_path):
    env = {
        **os.environ,
        "OUT": str(tmp_path),
        "ROWS": "20000",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT / "src"),
    }
    result = subprocess.run(
        ["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "ok: nothing here would make training fail" in out
    epochs = re.findall(r"epoch \d: train loss ([\d.]+), valid AUC ([\d.]+)", out)
    assert len(epochs) == 2 and float(epochs[1][0]) < float(epochs[0][0])
    day2_auc = float(re.search(r"AUC on .*day2: ([\d.]+)", out).group(1))
    assert day2_auc > 0.53  # the clicks depend on user, item, hour and price
    assert (tmp_path / "model.pt").is_file()
    # day 2's ids are day 1's: each known user keeps its id, a new one gets 0
    vocabulary = read_vocabulary(tmp_path / "day1" / "_vocabulary", "user_id")
    ids = {v: 2 + k for k, v in enumerate(vocabulary.column("value").to_pylist())}
    raw = pacsv.read_csv(tmp_path / "raw" / "day2.csv").column("user_id").to_pylist()
    written = pq.read_table(tmp_path / "day2").column("user_id").to_pylist()
    assert written == [ids.get(user, 0) for user in raw]
    assert 0 in written and any(i >= 2 for i in written)
    day1 = pq.read_table(tmp_path / "day1" / "train")
    assert day1.schema.field("event_time_hour").type == day1.schema.field("user_id").type
    assert "event_time" not in day1.column_names and "price" in day1.column_names
