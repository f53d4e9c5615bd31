#!/usr/bin/env bash
# The prepared GPU check: every GPU check of the project in one command, on a GPU host.
#
# Run from the repository root on the GPU host, after the RAPIDS wheels are installed and
# on PYTHONPATH (../shared/gpu/README.md):
#     source .gpu-host/bin/install.sh && bash benchmarks/gpu_host_run.sh
# In order, each step under its own time limit, a failing or stopped step never stopping
# the next:
#   env         the GPU, the driver and the versions (seconds)
#   tests       python3 -m pytest -m gpu tests            (the GPU suite on the real GPU)
#   selftest    python3 -m tabloader.cli selftest --device cuda
#   race        benchmarks/gpu_race.py: a consumer slower than the loader (torch.cuda._sleep,
#               a long lax.fori_loop), PyTorch, JAX, Keras on JAX and on PyTorch, TensorFlow
#               where installed; streamed, cache in GPU memory, in pinned memory; every
#               batch's checksum against the CPU backend's (0 mismatches in >= 2000 each)
#   memory      benchmarks/gpu_memory_check.py: after close() PyTorch allocates >= 95% of
#               what was free before; a cache in GPU memory gives way to a growing step
#   bench       benchmarks/throughput.py --device cuda at 4M and 16M rows, every GPU case,
#               the training steps (PyTorch's, JAX's) among them (the data is written in
#               the background from the start, on all cores)
#   frameworks  framework_checks below: Keras on JAX and on torch, the JAX adapter, dask-cudf
#   profile     benchmarks/profile_threads.py: where shuffled GPU epochs spend their time,
#               the first epochs sampled apart
#   cache       benchmarks/profile_gpu_cache.py: cached epochs against the floor of a bare
#               cupy loop, with a py-spy profile when py-spy is staged (its wheel under
#               .gpu-host/py-spy/: pip download py-spy --no-deps -d .gpu-host/py-spy)
# The limits share one budget (GPU_RUN_BUDGET seconds, 500 by default): a step gets its
# cap, or less when the steps after it would otherwise lose their floor.
#
# What comes back ($OUT, 8 files): summary.txt (also printed at the end), race.json and
# memory.json (each case's verdict), gpu.json and gpu.md (the benchmark's report, written
# after every case, so a stopped run keeps what it measured), profile.txt,
# cache-profile.txt, logs.tar.gz (every step's full output, and env.txt).
# logs.tar.gz is refreshed after every step, so a call cut short still brings the logs.
# Then, on the development machine: copy gpu.json to benchmarks/results/gpu.json and run
#     python benchmarks/throughput.py --from-json benchmarks/results/gpu.json \
#         --table benchmarks/results/gpu.md --doc docs/gpu.md
#
# Settings (environment), for smaller runs and for the test that runs this script on the
# emulated device: PYTHON (python3), GPU_RUN_BUDGET (540), GPU_RUN_STEPS (all of the
# above), GPU_RUN_RACE (gpu_race.py's options: --rows 400000 --row-group-size 10000
# --batch-size 200 --min-batches 2000), GPU_RUN_MEMORY (gpu_memory_check.py's options:
# --rows 2000000), GPU_RUN_SIZES (4000000,16000000), GPU_RUN_ROWS_PER_FILE (500000),
# GPU_RUN_ROW_GROUP (131072), GPU_RUN_BATCH (65536), GPU_RUN_CASES (a regular expression:
# the benchmark cases to run), GPU_RUN_TESTS (tests), GPU_RUN_FRAMEWORK_TESTS (the file
# patterns framework_checks runs), GPU_RUN_DATA (/tmp/tabloader-bench-data),
# GPU_RUN_PROFILE_MODES (columns,stacked,torch,cache), GPU_RUN_PROFILE_SECONDS (0),
# GPU_RUN_PY_SPY (py-spy's path; by default the staged wheel's, if any).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
: "${OUT:?set OUT to the folder whose files come back}"
mkdir -p "$OUT"

PY=${PYTHON:-python3}
BUDGET=${GPU_RUN_BUDGET:-540}
STEPS=${GPU_RUN_STEPS:-tests selftest race memory bench frameworks profile cache}
RACE=${GPU_RUN_RACE:---rows 400000 --row-group-size 10000 --batch-size 200 --min-batches 2000}
MEMORY=${GPU_RUN_MEMORY:---rows 2000000}
SIZES=${GPU_RUN_SIZES:-4000000,16000000}
ROWS_PER_FILE=${GPU_RUN_ROWS_PER_FILE:-500000}
ROW_GROUP=${GPU_RUN_ROW_GROUP:-131072}
BATCH=${GPU_RUN_BATCH:-65536}
CASES=${GPU_RUN_CASES:-}
TESTS=${GPU_RUN_TESTS:-tests}
FRAMEWORK_TESTS=${GPU_RUN_FRAMEWORK_TESTS:-tests/test_keras*.py tests/test_jax*.py tests/test_dask*.py}
DATA=${GPU_RUN_DATA:-/tmp/tabloader-bench-data}
PROFILE_MODES=${GPU_RUN_PROFILE_MODES:-columns,stacked,torch,cache}
PROFILE_SECONDS=${GPU_RUN_PROFILE_SECONDS:-0}
LOGS=$(mktemp -d)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# JAX takes 75% of the GPU when it starts unless told otherwise: not beside cudf and torch
export XLA_PYTHON_CLIENT_PREALLOCATE=${XLA_PYTHON_CLIENT_PREALLOCATE:-false}
STARTED=$SECONDS
DATA_SIZES="--sizes $SIZES --rows-per-file $ROWS_PER_FILE --row-group-size $ROW_GROUP"

# step: cap and floor (seconds). A step's limit is its cap, cut so that every later step
# still gets its floor; what is left at the end packs the files.
declare -A CAP=([tests]=150 [selftest]=60 [race]=150 [memory]=60 [bench]=300 [frameworks]=90
  [profile]=60 [cache]=90)
declare -A FLOOR=([tests]=45 [selftest]=20 [race]=60 [memory]=20 [bench]=100 [frameworks]=30
  [profile]=25 [cache]=30)
PACKING=10

limit_for() {  # limit_for STEP: seconds this step may take now
  local step=$1 later=0 seen=0 s
  for s in $STEPS; do
    if [ $seen = 1 ]; then later=$((later + ${FLOOR[$s]:-0})); fi
    [ "$s" = "$step" ] && seen=1
  done
  local left=$((BUDGET - (SECONDS - STARTED) - PACKING - later))
  local cap=${CAP[$step]:-60}
  [ $left -lt $cap ] && cap=$left
  [ $cap -lt 5 ] && cap=5
  echo $cap
}

run_step() {  # run_step NAME FUNCTION: run it under its limit, log it, record the outcome
  local name=$1 fn=$2 limit began rc status
  limit=$(limit_for "$name")
  began=$SECONDS
  echo "== $name (limit ${limit} s, $((SECONDS - STARTED)) s into the run)"
  LIMIT=$limit "$fn" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out" ;;
    *) status="failed (exit $rc)" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - began))" "$limit" >>"$LOGS/steps.tsv"
  echo "   $status after $((SECONDS - began)) s; last lines:"
  tail -n 3 "$LOGS/$name.log" | sed 's/^/   | /'
  tar -C "$LOGS" -czf "$OUT/logs.tar.gz" . 2>/dev/null  # so far, should the call be cut short
}

limited() {  # limited CMD...: CMD under the step's limit; SIGINT first (pytest then
  # prints its summary, the benchmark keeps its report), SIGKILL 10 s later
  timeout -s INT -k 10 "$LIMIT" "$@"
}

# -- the steps -----------------------------------------------------------------------------

step_env() {
  date -u '+%Y-%m-%d %H:%M UTC'
  nproc
  timeout 20 nvidia-smi || echo "nvidia-smi: not available"
  KERAS_BACKEND=${KERAS_BACKEND:-jax} timeout 60 "$PY" - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("tabloader", "cudf", "rmm", "cupy", "dask", "dask_cudf", "torch", "jax", "keras",
             "numpy", "pandas", "pyarrow", "numba"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), getattr(module, "__emulated__", ""))
    except Exception as err:
        print(name, "not importable:", type(err).__name__, err)
PY
  git log -1 --format='commit %h %s' 2>/dev/null || true
}

step_tests() {
  # shellcheck disable=SC2086  # GPU_RUN_TESTS may name several paths
  limited "$PY" -m pytest -m gpu -q -p no:cacheprovider -ra --durations=15 $TESTS
}

step_selftest() {
  limited "$PY" -m tabloader.cli selftest --device cuda
}

step_race() {
  # shellcheck disable=SC2086  # GPU_RUN_RACE holds several options
  limited "$PY" benchmarks/gpu_race.py $RACE --case-timeout "$LIMIT" --out "$OUT/race.json"
}

step_memory() {
  # shellcheck disable=SC2086  # GPU_RUN_MEMORY holds several options
  limited "$PY" benchmarks/gpu_memory_check.py $MEMORY --out "$OUT/memory.json"
}

merlin_folder() {  # the staged merlin-dataloader (benchmarks/stage_merlin.sh), unpacked
  local staged=.gpu-host/merlin/merlin.tar.gz target=/tmp/gpu-host/merlin
  if [ -f "$staged" ] && [ ! -d "$target/site" ]; then
    mkdir -p "$target" && tar -C "$target" -xzf "$staged" || return 1
  fi
  [ -d "$target/site" ] && echo "$target"
}

step_bench() {
  local merlin extra=() waited=$SECONDS
  if [ -n "${DATAGEN_PID:-}" ]; then
    echo "waiting for the data ($(tail -n 1 "$LOGS/datagen.log" 2>/dev/null))"
    wait "$DATAGEN_PID"
  fi
  LIMIT=$((LIMIT - (SECONDS - waited)))  # the wait counts against the step's limit
  [ "$LIMIT" -lt 5 ] && LIMIT=5
  merlin=$(merlin_folder) && extra+=(--merlin-gpu "$merlin") || echo "merlin-dataloader: not staged"
  [ -n "$CASES" ] && extra+=(--cases "$CASES")
  # shellcheck disable=SC2086  # DATA_SIZES holds several options
  limited "$PY" benchmarks/throughput.py --device cuda $DATA_SIZES --batch-size "$BATCH" \
    --data "$DATA" --case-timeout 120 --json "$OUT/gpu.json" --table "$OUT/gpu.md" "${extra[@]}"
}

# framework_checks: the Keras adapter on the JAX and the torch backends, the JAX adapter and
# dask-cudf, on the GPU. The framework tests' owners keep this list; files that do not
# exist (yet) are left out, and no file at all is a pass that says so.
framework_checks() {
  local files=() f backend rc=0 got share
  for f in $FRAMEWORK_TESTS; do [ -f "$f" ] && files+=("$f"); done
  if [ ${#files[@]} = 0 ]; then
    echo "no framework test files match: $FRAMEWORK_TESTS"
    return 0
  fi
  share=$((LIMIT / 2))
  for backend in jax torch; do
    echo "== KERAS_BACKEND=$backend: ${files[*]}"
    got=0
    KERAS_BACKEND=$backend timeout -s INT -k 10 "$share" \
      "$PY" -m pytest -m gpu -q -p no:cacheprovider -ra "${files[@]}" || got=$?
    # pytest's 5: no test in these files is marked gpu (yet), which fails nothing
    [ $got = 5 ] && echo "no GPU test in ${files[*]}" || { [ $got != 0 ] && rc=$got; }
  done
  return $rc
}

step_profile() {
  limited "$PY" benchmarks/profile_threads.py --device cuda --rows "${SIZES%%,*}" \
    --rows-per-file "$ROWS_PER_FILE" --row-group-size "$ROW_GROUP" --batch-size "$BATCH" \
    --data "$DATA" --modes "$PROFILE_MODES" --seconds "$PROFILE_SECONDS" --first \
    --out "$OUT/profile.txt"
}

py_spy() {  # py-spy's path: GPU_RUN_PY_SPY, or the staged wheel's binary, unpacked once
  if [ -n "${GPU_RUN_PY_SPY:-}" ]; then echo "$GPU_RUN_PY_SPY"; return 0; fi
  local wheel target=/tmp/gpu-host/py-spy binary
  wheel=$(ls .gpu-host/py-spy/py_spy-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || return 1
  [ -d "$target" ] || "$PY" -m zipfile -e "$wheel" "$target" || return 1
  binary=$(ls "$target"/py_spy-*.data/scripts/py-spy 2>/dev/null | head -n 1)
  [ -n "$binary" ] && chmod +x "$binary" && echo "$binary"
}

step_cache() {
  local spy extra=()
  spy=$(py_spy) && extra+=(--py-spy "$spy") || echo "py-spy: not staged (.gpu-host/py-spy/)"
  limited "$PY" benchmarks/profile_gpu_cache.py --rows "${SIZES%%,*}" \
    --rows-per-file "$ROWS_PER_FILE" --row-group-size "$ROW_GROUP" --batch-size "$BATCH" \
    --data "$DATA" --out "$OUT/cache-profile.txt" "${extra[@]}"
}

# -- the run -------------------------------------------------------------------------------

echo "GPU run: steps '$STEPS', budget ${BUDGET} s, logs in $LOGS, results in $OUT"
case " $STEPS " in
  *" bench "* | *" profile "* | *" cache "*)
    # shellcheck disable=SC2086
    "$PY" benchmarks/throughput.py --prepare $DATA_SIZES --data "$DATA" >"$LOGS/datagen.log" 2>&1 &
    DATAGEN_PID=$!
    ;;
esac
step_env >"$LOGS/env.txt" 2>&1
head -n 12 "$LOGS/env.txt"
for step in $STEPS; do
  case $step in
    tests) run_step tests step_tests ;;
    selftest) run_step selftest step_selftest ;;
    race) run_step race step_race ;;
    memory) run_step memory step_memory ;;
    bench) run_step bench step_bench ;;
    frameworks) run_step frameworks framework_checks ;;
    profile | cache)
      [ -n "${DATAGEN_PID:-}" ] && wait "$DATAGEN_PID" 2>/dev/null
      run_step "$step" "step_$step"
      ;;
    *) echo "unknown step $step (tests, selftest, race, memory, bench, frameworks, profile, cache)" ;;
  esac
done
[ -n "${DATAGEN_PID:-}" ] && wait "$DATAGEN_PID" 2>/dev/null

"$PY" benchmarks/gpu_run_summary.py --logs "$LOGS" --out "$OUT" --budget "$BUDGET" \
  --seconds $((SECONDS - STARTED)) >"$OUT/summary.txt" 2>&1 ||
  { echo "the summary failed; steps:"; cat "$LOGS/steps.tsv"; } >>"$OUT/summary.txt"
cp "$OUT/summary.txt" "$LOGS/summary.txt"
not_ok=$(cut -f2 "$LOGS/steps.tsv" | grep -cv '^ok$')
# a log over 8 MiB keeps its first 1 MiB and its last 6 MiB (a file comes back under 16 MiB)
for f in "$LOGS"/*.log; do
  if [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 8388608 ]; then
    { head -c 1048576 "$f"; printf '\n[... cut ...]\n'; tail -c 6291456 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
  fi
done
tar -C "$LOGS" -czf "$OUT/logs.tar.gz" .
rm -rf "$LOGS"
cat "$OUT/summary.txt"
[ "$not_ok" = 0 ]
