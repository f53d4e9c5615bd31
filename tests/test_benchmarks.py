"""The benchmark script runs end to end on tiny datasets and reports what it promises."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path, PurePath

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _forget_benchmark_modules() -> None:
    """Drop every module loaded from benchmarks/: the next test imports fresh ones (the
    cases keep references to ``common``, whose facts a run clears)."""
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]


@pytest.fixture
def throughput(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget_benchmark_modules()
    import throughput

    yield throughput
    _forget_benchmark_modules()


@pytest.mark.slow
def test_every_case_runs_in_its_own_process_against_the_limit(throughput, tmp_path):
    out, table, doc = tmp_path / "report.json", tmp_path / "report.md", tmp_path / "doc.md"
    doc.write_text(f"# Before\n\n{throughput.DOC_BEGIN}\nold\n{throughput.DOC_END}\n\nAfter\n")
    report = throughput.main(
        [
            *("--sizes", "20000,40000"),
            *("--rows-per-file", "10000"),
            *("--row-group-size", "2500"),
            *("--batch-size", "2048"),
            *("--epochs", "2"),
            *("--soak-epochs", "4"),
            # the core cases, the shuffled disk caches, and one of each adapter's when its
            # framework is installed
            *(
                "--cases",
                "^Loader|ceiling|pandas \\+ permute|disk cache, shuffle|^TorchAsync.*, shuffle",
            ),
            *("--data", str(tmp_path / "data")),
            *("--json", str(out)),
            *("--table", str(table)),
            *("--doc", str(doc)),
        ]
    )
    assert json.loads(out.read_text())["config"]["sizes"] == "20000,40000"
    assert [s["rows"] for s in report["sizes"]] == [20000, 40000]
    assert [s["files"] for s in report["sizes"]] == [2, 4]
    for section in report["sizes"]:
        results = {r["name"]: r for r in section["results"]}
        limit = section["results"][0]
        assert limit["group"] == "limit" and limit["first_ratio"] == 1.0
        assert len(limit["runs"]) == 2  # before and after the cases
        for name in ("Loader, shuffle", "Loader, no shuffle", "Loader, shuffle, stacked [B, k]"):
            result = results[name]
            (run,) = result["runs"]
            assert run["rows"] == [section["rows"]] * 2  # whole epochs, each timed
            assert result["first_ratio"] > 0 and result["later_ratio"] > 0
            assert result["peak_rss"] >= max(run["rss_after_epoch"]) > 0
    first = {r["name"]: r for r in report["sizes"][0]["results"]}
    assert first["numpy.copyto of the decoded arrays (copy ceiling)"]["group"] == "ceiling"
    machine = report["machine"]
    assert machine["cpus"] >= 1 and len(machine["load_before"]) == 3
    assert len(report["soak"]["rss_after_epoch"]) == 4
    text = table.read_text()
    assert "| Loader, shuffle |" in text and "load average" in text
    assert "RSS over 4 epochs" in text
    # the cache goals, derived from the cases at both sizes
    assert re.search(r"\| Loader disk cache, shuffle, cached epochs \| >= 1.5 \| \d.* \| \d", text)
    writes = (
        r"\| Loader cache-writing epoch / streaming first epoch, shuffle \(time\) \| <= 1.3 \| \d"
    )
    assert re.search(writes, text)
    assert doc.read_text().startswith("# Before") and "| Loader, shuffle |" in doc.read_text()
    assert "old" not in doc.read_text() and doc.read_text().endswith("After\n")

    pytest.importorskip("matplotlib")
    import plot

    png = tmp_path / "report.png"
    plot.main([str(out), str(png)])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_derived_figures_of_a_report_written_midway_leave_unmeasured_cells_blank(throughput):
    """The report is saved after every case: a pair whose reference is not measured yet
    (or has no first epoch) is left blank, never a KeyError that stops the run."""
    what, name, reference = throughput.PAIRS[0]
    limit = {"name": "the limit", "group": "limit"}
    measured = {
        "name": name,
        "group": "tabloader",
        "first_rows_per_second": 2.0,
        "later_rows_per_second": 4.0,
    }
    for other in ({"name": reference, "group": "tabloader"}, None):
        results = [limit, measured] + ([other] if other else [])
        lines = throughput.goals({"sizes": [{"rows": 1000, "results": results}]})
        (line,) = [line for line in lines if line.startswith(f"| {what} |")]
        assert line.endswith("| - |")
    done = {**measured, "name": reference, "first_rows_per_second": 1.0}
    done["later_rows_per_second"] = 1.0
    lines = throughput.goals({"sizes": [{"rows": 1000, "results": [limit, measured, done]}]})
    assert any(
        line.startswith(f"| {what} |") and "2.00 first, 4.00 later" in line for line in lines
    )


@pytest.mark.parametrize(
    ("device", "gpu", "expected"),
    [("cpu", "", "Loader, shuffle"), ("cuda", "real", "Loader(device='cuda') (shuffle)")],
)
def test_case_names_are_unique_and_modules_cheap_to_list(throughput, device, gpu, expected):
    ctx = throughput.Context(["x.parquet"], ["c"], ["x"], ["y"], 8, 8, device, gpu)
    before = set(sys.modules)
    names = [c.name for c in throughput.collect_cases(ctx)]
    assert len(names) == len(set(names)) and expected in names
    # every case's process lists them all: a host-only case must not pay for cudf or torch
    heavy = {"torch", "tensorflow", "pandas", "cudf", "cupy"} & (set(sys.modules) - before)
    assert not heavy, f"listing cases imported {heavy}"


# -- the GPU benchmark, on the emulated device ---------------------------------------------

SIZES = (20_000, 40_000)
TINY = (
    *("--rows-per-file", "10000"),
    *("--row-group-size", "2500"),
    *("--batch-size", "2048"),
    *("--epochs", "3"),
)


@pytest.fixture
def emulated_gpu():
    """The emulated cupy, cudf and rmm imported for this test alone."""
    from emulated_gpu.paths import emulated_modules
    from tabloader.backends.gpu import gpu_usable

    gpu_usable.cache_clear()
    with emulated_modules() as modules:
        yield modules
    gpu_usable.cache_clear()


def _cache_refusal() -> str | None:
    """The error a GPU loader with a cache raises today (its type and first words), or
    None once the GPU backend has a cache."""
    import pyarrow as pa

    import tabloader

    try:
        tabloader.Loader(
            pa.table({"x": [1.0]}), conts=["x"], batch_size=1, device="cuda", cache="memory"
        )
    except tabloader.TabloaderError as err:
        return f"{type(err).__name__}: cache="
    return None


def test_every_gpu_case_runs_on_the_emulated_device(
    throughput, emulated_gpu, tmp_path, quiet_loader_warnings
):
    cupy = emulated_gpu[0]
    out, table, doc = tmp_path / "gpu.json", tmp_path / "gpu.md", tmp_path / "doc.md"
    report = throughput.main(
        [
            *("--device", "cuda", "--in-process"),
            *("--sizes", ",".join(map(str, SIZES))),
            *TINY,
            *("--data", str(tmp_path / "data")),
            *("--json", str(out), "--table", str(table)),
        ]
    )
    machine = report["machine"]
    assert machine["emulated"] and machine["in_process"]
    assert "EMULATED" in machine["gpu"] and machine["versions"]["cudf"].endswith("emulated")
    first, second = ({r["name"]: r for r in s["results"]} for s in report["sizes"])
    import cases_gpu
    import cases_gpu_cache
    import cases_training

    # streaming GPU loaders, the adapters, the host-side cases: every row, every epoch
    streaming = [
        cases_gpu.loader_name(shuffle, stacked)
        for shuffle in (True, False)
        for stacked in (True, False)
    ]
    everywhere = [
        cases_gpu.LIMIT,
        *streaming,
        cases_gpu.torch_name(True),
        cases_gpu.torch_name(False),
    ]
    smallest = [
        cases_gpu.TORCH_DIRECT,
        cases_gpu.PINNED,
        cases_gpu.CPU_REFERENCE,
        cases_gpu.CPU_TORCH,
        cases_gpu.cpu_loader_name(True),
        cases_gpu.cpu_loader_name(False),
        cases_training.TRAIN_GPU,
        cases_training.TRAIN_CPU,
    ]
    for rows, results, names in (
        (SIZES[0], first, everywhere + smallest),
        (SIZES[1], second, everywhere),
    ):
        for name in names:
            assert "error" not in results[name], results[name]["error"]
            (run,) = results[name]["runs"][-1:]
            assert run["rows"] == [rows] * 3, name
    assert not set(smallest) & set(second)  # the smallest size only
    assert len(first[cases_gpu.LIMIT]["runs"]) == 2  # before and after the cases
    for name in streaming:  # the loader's counters after each epoch, and device memory
        result = first[name]
        assert [s["rows"] for s in result["facts"]["stats_after_epoch"]] == [
            SIZES[0] * k for k in (1, 2, 3)
        ]
        assert len(result["device_used_after_epoch"]) == 3
    training = [cases_training.TRAIN_GPU, cases_training.TRAIN_GPU_CACHED]
    training += [cases_training.TRAIN_CPU, cases_training.TRAIN_JAX]
    for name in training:
        facts = first[name]["facts"]
        assert facts["step_ms_alone"] > 0 and facts["depth"] >= 1
        assert facts["steps_per_epoch"] == -(-SIZES[0] // 2048)

    # the hand-written loop needs cupy.random, which the stand-in may not have (yet)
    hand = first[cases_gpu.HANDLOOP]
    if hasattr(cupy, "random"):
        assert hand["runs"][0]["rows"] == [SIZES[0]] * 3
    else:
        assert "has no attribute 'random'" in hand["error"]
    # the GPU cache cases: refused until the GPU backend has a cache, then served from it
    refusal = _cache_refusal()
    for name in (
        cases_gpu_cache.MEMORY_SHUFFLE,
        cases_gpu_cache.MEMORY_GLOBAL,
        cases_gpu_cache.DISK_SHUFFLE,
    ):
        result = first[name]
        if refusal is None:
            assert "error" not in result, result["error"]
            # filling, placing, then steady cached epochs (the median of the later ones)
            served = [s["from_cache"] for s in result["facts"]["stats_after_epoch"]]
            assert served == [False] + [True] * (cases_gpu_cache.CACHE_EPOCHS - 1)
            assert len(result["runs"][0]["seconds"]) == cases_gpu_cache.CACHE_EPOCHS
        else:
            assert refusal in result["error"], result["error"]
    pinned = first[cases_gpu_cache.PINNED_SHUFFLE]
    if "error" in pinned:  # the knob's name is the placeholder of cases_gpu_cache.PINNED_HOST
        knob = next(iter(cases_gpu_cache.PINNED_HOST))
        assert refusal is not None or knob in pinned["error"], pinned["error"]

    # the report: never mistaken for GPU figures, the goals derived, written after each case
    text = table.read_text()
    assert text.startswith("**Not benchmark figures: measured on the EMULATED GPU")
    assert "**GPU goals**" in text and "| Loader shuffle (columns), later epochs | >= 0.8x" in text
    assert re.search(r"the epoch placing the cache, then a cached one \| \| [\d.]+ s, then ", text)
    assert re.search(
        r"\| TorchAsyncItr \+ DLDataLoader / Loader stacked, shuffle \| >= 0.9 \| \d", text
    )
    assert re.search(
        r"training step fed by TorchAsyncItr\(device='cuda'\): step time \| <= 1.15x alone \| "
        r"[\d.]+ ms alone",
        text,
    )
    assert re.search(r"fed by JaxLoader\(device='cuda'\): step time \|\s+\| [\d.]+ ms alone", text)
    assert json.loads(out.read_text())["sizes"][1]["rows"] == SIZES[1]
    doc.write_text(f"# GPU\n\n{throughput.DOC_BEGIN}\nold\n{throughput.DOC_END}\n")
    with pytest.raises(SystemExit, match="never written into the docs"):
        throughput.main(["--from-json", str(out), "--doc", str(doc)])
    assert "old" in doc.read_text()

    # docs/gpu.md's section is generated from the JSON a GPU run brings back
    brought = json.loads(out.read_text())
    brought["machine"].update(
        emulated=False, in_process=False, gpu="NVIDIA H100 80GB HBM3 (cudf 26.10.02)"
    )
    gpu_json = tmp_path / "brought.json"
    gpu_json.write_text(json.dumps(brought))
    throughput.main(
        ["--from-json", str(gpu_json), "--table", str(tmp_path / "t.md"), "--doc", str(doc)]
    )
    written = doc.read_text()
    assert (
        "old" not in written and "NVIDIA H100 80GB HBM3" in written and "**GPU goals**" in written
    )
    assert "Not benchmark figures" not in written


def test_merlin_on_the_gpu_is_listed_from_a_staged_folder(throughput, tmp_path, monkeypatch):
    staged = tmp_path / "merlin"
    (staged / "site").mkdir(parents=True)
    ctx = throughput.Context(["x.parquet"], ["c"], ["x"], ["y"], 8, 8, "cuda", "real")
    import cases_merlin

    assert cases_merlin.cases(ctx) == []  # nothing staged, nothing listed
    monkeypatch.setenv("MERLIN_GPU", str(staged))
    (case,) = cases_merlin.cases(ctx)
    assert case.name == cases_merlin.MERLIN_GPU and case.pythonpath == (str(staged / "site"),)
    (staged / "dask-legacy").mkdir()
    first, legacy = cases_merlin.cases(ctx)
    assert legacy.pythonpath == (str(staged / "dask-legacy"), str(staged / "site"))
    assert not first.every_size and not legacy.every_size


def test_the_sampler_tells_busy_threads_from_waiting_ones(monkeypatch):
    import threading
    import time

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from sampler import Sampler

    stop = threading.Event()
    spinning = [True]  # not stop.is_set(): that is a function of threading.py, a "wait"

    def spin() -> None:
        while spinning[0]:
            sum(range(1000))

    threads = [
        threading.Thread(target=spin, name="tabloader-busy"),
        threading.Thread(target=stop.wait, name="tabloader-idle"),
    ]
    with Sampler(interval=0.002) as sampler:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while min(sum(sampler.samples.get(t.name, {}).values()) for t in threads) < 20:
            assert time.monotonic() < deadline, "the sampler took no samples"
            time.sleep(0.01)
        stop.set()
        spinning[0] = False
        for thread in threads:
            thread.join()
    report = sampler.report(threads=("tabloader",))
    assert re.search(r"== thread tabloader-idle: \d+ samples .*waiting 100%", report)
    assert re.search(r"== thread tabloader-busy: \d+ samples .*waiting 0%", report)
    assert "test_benchmarks.py" in report.split("== thread tabloader-busy")[1]
    assert "MainThread" not in report  # only the threads asked for


def test_the_profile_reports_the_loader_threads_on_the_emulated_device(
    emulated_gpu, tmp_path, monkeypatch, quiet_loader_warnings
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget_benchmark_modules()
    import profile_threads

    out = tmp_path / "profile.txt"
    profile_threads.main(
        [
            *("--device", "cuda", "--rows", "20000", "--rows-per-file", "10000"),
            *("--row-group-size", "2500", "--batch-size", "2048", "--epochs", "2"),
            *("--seconds", "0.3", "--modes", "columns,torch,cache"),
            *("--data", str(tmp_path / "data"), "--out", str(out)),
        ]
    )
    _forget_benchmark_modules()
    text = out.read_text()
    columns, torch_mode, cache = text.split("######## ")[1:]
    for section in (columns, torch_mode):
        assert "loader.stats(): 20,000 rows" not in section  # cumulative: more than one epoch
        assert re.search(r"== thread tabloader-reader: \d+ samples", section)
        assert re.search(r"== thread tabloader-batcher: \d+ samples", section)
        assert "busiest lines" in section and "functions on the stack" in section
    refusal = _cache_refusal()
    assert cache.startswith("cache\nfailed:") == (refusal is not None)  # reported, not raised


def test_the_cache_profile_runs_on_the_emulated_device_beside_its_floor(
    emulated_gpu, tmp_path, monkeypatch, quiet_loader_warnings
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget_benchmark_modules()
    import profile_gpu_cache

    out = tmp_path / "cache.txt"
    profile_gpu_cache.main(
        [
            *("--rows", "20000", "--rows-per-file", "10000", "--row-group-size", "2500"),
            *("--batch-size", "2048", "--epochs", "1", "--data", str(tmp_path / "data")),
            *("--out", str(out)),
        ]
    )
    _forget_benchmark_modules()
    rows = out.read_text().splitlines()[2:]
    names = [r[:50].strip() for r in rows]
    assert names == [
        "Loader cache='memory' shuffle=True columns",
        "Loader cache='memory' shuffle=True stacked",
        "Loader cache='memory' shuffle='global' columns",
        "Loader cache='memory' shuffle='global' stacked",
        "floor: cupy loop, columns",
        "floor: cupy loop, stacked",
    ]
    for r in rows:
        rate, first, p50, p90, epoch = (float(x.replace(",", "")) for x in r[50:].split())
        assert rate > 0 and epoch > 0 and 0 <= p50 <= p90 and first >= 0


def test_the_cache_profile_tells_the_gil_from_queues_and_leaves_the_filling_epoch_out(
    monkeypatch,
):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget_benchmark_modules()
    import profile_gpu_cache

    reader = (
        "thread (11): tabloader-reader;thread_run (libpython3.12.so);"
        "_produce (tabloader/stages.py:120);_read_chunks (tabloader/stages.py:401)"
    )
    raw = "\n".join(
        [
            # waiting for the GIL: a condition variable straight under interpreted code
            f"{reader};network (tabloader/plan.py:270);pthread_cond_timedwait (libc.so.6);"
            "0x7f (libc.so.6) 30",
            f"{reader};network (tabloader/plan.py:271) 10",  # running (a line merged)
            f"{reader};cumsum (cupy/_math/sumprod.py:80);cuLaunchKernel (libcuda.so.1) 20",
            # a queue: the interpreter's lock, whatever the libc frames below it
            "thread (12): tabloader-batcher;_produce (tabloader/stages.py:120);batch_stream "
            "(tabloader/stages.py:460);Prefetcher.__next__ (tabloader/stages.py:216);"
            "PyThread_acquire_lock_timed (libpython3.12.so);pthread_cond_timedwait (libc.so.6) 40",
            # the cache-filling epoch's reader, left out by its thread id
            "thread (9): tabloader-reader;_produce (tabloader/stages.py:120);_read_chunks "
            "(tabloader/stages.py:401);decode (tabloader/backends/gpu.py:900) 500",
            "thread (1): MainThread;<module> (<string>:3);import_module (importlib:1) 99",  # no
        ]
    )
    text = profile_gpu_cache.summarise(raw, top=5, skip=frozenset({9}))
    _forget_benchmark_modules()
    assert "decode" not in text and "import_module" not in text
    reader_part, batcher_part = text.split("== batcher")
    assert reader_part.startswith("== reader: 60 samples")
    assert "50.0%  waiting for the GIL" in reader_part
    assert "33.3%  in the CUDA driver" in reader_part and "16.7%  running" in reader_part
    assert re.search(r"50.0%  waiting for the GIL +network \(tabloader/plan.py\)", reader_part)
    assert batcher_part.startswith(": 40 samples") and "100.0%  waiting on a queue" in batcher_part


@pytest.mark.slow
def test_the_gpu_host_script_runs_every_step_on_the_emulated_device(tmp_path):
    """benchmarks/gpu_host_run.sh end to end with tiny data: what comes back fits the
    transfer's rules, a failing step stops nothing, and the summary says what happened."""
    import os
    import subprocess

    from emulated_gpu.paths import FULL

    root = BENCHMARKS.parent
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TABLOADER_DEVICE"}
    env.update(
        OUT=str(out),
        PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([*FULL, env.get("PYTHONPATH", "")]),
        GPU_RUN_SIZES="20000",
        GPU_RUN_ROWS_PER_FILE="10000",
        GPU_RUN_ROW_GROUP="2500",
        GPU_RUN_BATCH="2048",
        GPU_RUN_DATA=str(tmp_path / "data"),
        GPU_RUN_CASES=r"^Loader\(device='cuda'\) \(shuffle\)$|^training step fed by .*'cuda'\)",
        GPU_RUN_TESTS="tests/test_gpu.py::test_cpu_and_gpu_agree_on_an_in_memory_table",
        GPU_RUN_FRAMEWORK_TESTS="tests/test_no_such_framework*.py",
        GPU_RUN_PROFILE_MODES="columns,no-such-mode",  # fails: the summary says so
        GPU_RUN_PROFILE_SECONDS="0.2",
        GPU_RUN_RACE="--rows 3000 --row-group-size 250 --batch-size 100 --min-batches 30 "
        "--frameworks torch,jax --placements streamed",
        GPU_RUN_MEMORY="--rows 100000 --row-group-size 10000 --batch-size 4096",
    )
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_host_run.sh")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output  # the profile step failed, nothing else did
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "cache-profile.txt",
        "gpu.json",
        "gpu.md",
        "logs.tar.gz",
        "memory.json",
        "race.json",
        "summary.txt",
    ]
    assert all(
        re.fullmatch(r"[A-Za-z0-9._-]+", f) and (out / f).stat().st_size < 16 << 20 for f in files
    )
    summary = (out / "summary.txt").read_text()
    assert summary in output  # printed at the end
    steps = dict(
        re.findall(
            r"^(tests|selftest|race|memory|bench|frameworks|profile|cache) +"
            r"(ok|failed \(exit \d+\)|timed out)",
            summary,
            re.M,
        )
    )
    assert steps == {
        "tests": "ok",
        "selftest": "ok",
        "race": "ok",
        "memory": "ok",
        "bench": "ok",
        "frameworks": "ok",
        "profile": "failed (exit 1)",
        "cache": "ok",
    }, summary
    assert re.search(r"^floor: cupy loop, columns +[\d,.]+ ", summary, re.M)  # the cache step
    assert "unknown modes ['no-such-mode']" in summary
    assert re.search(r"^tests .* 1 passed", summary, re.M)
    assert re.search(r"^selftest .* 0 failed, \d+ passed", summary, re.M)
    assert re.search(r"^race .* 2 of 2 cases passed", summary, re.M)
    assert re.search(r"^memory .* 3 of 3 passed", summary, re.M)
    assert "no framework test files match" in summary
    assert "NOT GPU figures" in summary and "**GPU goals**" in summary
    report = json.loads((out / "gpu.json").read_text())
    assert report["machine"]["emulated"] and not report["machine"]["in_process"]
    (section,) = report["sizes"]
    measured = {r["name"]: r["runs"][-1]["rows"] for r in section["results"] if "runs" in r}
    assert measured["Loader(device='cuda') (shuffle)"] == [20000] * 3
    import tarfile

    with tarfile.open(out / "logs.tar.gz") as logs:
        names = {PurePath(n).name for n in logs.getnames()}
    assert {
        "env.txt",
        "tests.log",
        "selftest.log",
        "race.log",
        "memory.log",
        "bench.log",
        "profile.log",
        "cache.log",
        "summary.txt",
    } <= names


def test_the_cpu_profile_puts_each_sample_down_to_its_threads_role(monkeypatch, tmp_path):
    """py-spy names threads by their id, which a later epoch's threads reuse: the role
    comes from the stack, and what a thread does from its innermost frames."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    _forget_benchmark_modules()
    import profile_stages

    start = "thread_run (libpython3.11.so);_produce (tabloader/stages.py:124)"
    raw = tmp_path / "profile.raw"
    raw.write_text(
        "\n".join(
            [
                # a layout helper named after the decoder whose thread id it took over
                "thread (7): tabloader-decoder;_worker (concurrent/futures/thread.py:83);"
                "_run_all (tabloader/stages.py:330);mapiter_trivial_set "
                "(numpy/_core/_multiarray_umath.so) 30",
                f"thread (8): tabloader-reader;{start};_read_chunks (tabloader/stages.py:403);"
                "SplitWork.run (tabloader/stages.py:260);_run_all (tabloader/stages.py:330);"
                "mapiter_trivial_set (numpy/_core/_multiarray_umath.so) 10",
                f"thread (8): tabloader-reader;{start};_read_chunks (tabloader/stages.py:403);"
                "Prefetcher.__next__ (tabloader/stages.py:216);"
                "PyThread_acquire_lock_timed (libpython3.11.so) 30",
                f"thread (9): tabloader-decoder;{start};decode_pieces (tabloader/backends/cpu.py:"
                "600);read_row_group (pyarrow/parquet/core.py:480);parquet::arrow::"
                "FileReaderImpl::ReadRowGroups (libparquet.so);std::condition_variable::wait "
                "(libstdc++.so);pthread_cond_wait (libc.so.6) 20",
                f"thread (10): tabloader-order;{start};<genexpr> (tabloader/stages.py:370);"
                "CachedRows.delivery_rows (tabloader/cache/serve.py:140);take "
                "(numpy/_core/fromnumeric.py:200);PyArray_TakeFrom "
                "(numpy/_core/_multiarray_umath.so) 5",
            ]
        )
    )
    text = profile_stages.summarise(raw)
    _forget_benchmark_modules()
    sections = {s.split(":")[0]: s for s in text.split("\n") if not s.startswith(" ")}
    assert set(sections) == {"helper", "reader", "decoder", "order"}
    assert sections["helper"] == "helper: 30 samples, busy 100%"
    assert sections["reader"] == "reader: 40 samples, busy 25%"
    assert "75.0%  waiting\n" in text and "25.0%  numpy (_run_all)" in text
    assert sections["decoder"] == "decoder: 20 samples, busy 0%"
    assert "100.0%  waiting (arrow)" in text
    assert "100.0%  numpy (take)" in text
