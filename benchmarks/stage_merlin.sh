#!/usr/bin/env bash
# Stage merlin-dataloader 23.8 for the GPU benchmark on a host that reaches no package
# registry: merlin-core and merlin-dataloader 23.8.0 and the pure-Python packages they
# import that the GPU host lacks, plus dask/distributed 2024.12.1 beside them: merlin-core
# 23.8 imports dask.dataframe.core.new_dd_object, which dask removed in 2025.1, and the
# host's dask (the staged RAPIDS one) is newer. One archive of about 2 MiB.
#
# usage, in the project's root, after ../shared/gpu/stage.sh (which empties .gpu-host/):
#     bash benchmarks/stage_merlin.sh [FOLDER]        # default: .gpu-host/merlin
# Makes FOLDER/merlin.tar.gz holding site/ (on PYTHONPATH for the merlin cases) and
# dask-legacy/ (put first for the second attempt). benchmarks/gpu_host_run.sh unpacks it
# to /tmp/gpu-host/merlin and passes that to throughput.py --merlin-gpu.
set -euo pipefail
[ -f pyproject.toml ] || { echo "run this in the project's root" >&2; exit 2; }
dest=${1:-.gpu-host/merlin}
python=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Keep the staged folder out of git (a worktree's .git is a file: ask git where).
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu-host/' "$exclude" 2>/dev/null || echo '/.gpu-host/' >>"$exclude"

# merlin-dataloader's source release declares a direct-URL dependency in an extra, which
# pip 24 and later refuse to download at all; pip 23.2.1 downloads it.
"$python" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check "pip==23.2.1"
pip=("$tmp/venv/bin/python" -m pip -q --disable-pip-version-check)

# Source-only releases (pure Python), built here.
"${pip[@]}" download --no-deps --no-binary :all: -d "$tmp/sdist" \
    merlin-core==23.8.0 merlin-dataloader==23.8.0 betterproto==1.2.5 stringcase==1.2.0
# Pure-Python wheels the host lacks (it has pandas, pyarrow, numba, numpy, fsspec,
# packaging, tqdm, protobuf, psutil, multidict and nvidia-ml-py; dask and distributed come
# with the RAPIDS wheels).
"${pip[@]}" download --no-deps --only-binary :all: --platform any --python-version 3.12 \
    --implementation py -d "$tmp/wheels" \
    grpclib==0.4.9 h2==4.3.0 hpack==4.1.0 hyperframe==6.1.0 npy-append-array==0.9.19

build="$tmp/merlin"
mkdir -p "$build"
"${pip[@]}" install --no-deps --no-compile --target "$build/site" "$tmp"/sdist/* "$tmp"/wheels/*.whl
"${pip[@]}" install --no-deps --no-compile --only-binary :all: --target "$build/dask-legacy" \
    dask==2024.12.1 distributed==2024.12.1
rm -rf "$build/site/bin" "$build/dask-legacy/bin"
find "$build" \( -name __pycache__ -o -name tests \) -type d -prune -exec rm -rf {} +
printf '%s\n' \
    "merlin-core and merlin-dataloader 23.8.0, betterproto 1.2.5, stringcase, grpclib, h2," \
    "hpack, hyperframe, npy-append-array (site/); dask and distributed 2024.12.1" \
    "(dask-legacy/). Written by benchmarks/stage_merlin.sh for benchmarks/cases_merlin.py." \
    >"$build/README"

rm -rf "$dest" && mkdir -p "$dest"
tar -C "$build" -czf "$dest/merlin.tar.gz" .
echo "staged merlin-dataloader 23.8 in $dest/merlin.tar.gz ($(du -k "$dest/merlin.tar.gz" | cut -f1) KiB);"
echo "carry $dest with the call that runs benchmarks/gpu_host_run.sh, which unpacks it"
