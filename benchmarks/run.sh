#!/usr/bin/env bash
# The data-loading benchmark behind BENCHMARKS.md: writes the synthetic photo sets (500x375 with
# sensor noise, 500x375 without it, 2000x1500), bakes the template, and runs the baked project's
# benchmark (naive baseline vs its loader, with and without the cache, in one run) on each set.
#
#   benchmarks/run.sh [OUT_DIR] [WORKERS]      e.g. benchmarks/run.sh build/bench "[1,2]"
#
# Needs a Python with the template's dev requirements (`make venv`); PYTHON overrides which one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-build/bench}" && cd "${1:-build/bench}" && pwd)"
WORKERS="${2:-[1,2]}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo "$PWD/.venv/bin/python" || echo python3 )}"

"$PYTHON" benchmarks/make_images.py "$OUT/photos-500x375" --count 2000 --size 500x375
"$PYTHON" benchmarks/make_images.py "$OUT/smooth-500x375" --count 2000 --size 500x375 --noise 0
"$PYTHON" benchmarks/make_images.py "$OUT/photos-2000x1500" --count 200 --size 2000x1500
"$PYTHON" -m cookiecutter . --no-input -f -o "$OUT" project_name="Bench Proj"

cd "$OUT/bench-proj"
for set in photos-500x375 smooth-500x375 photos-2000x1500; do
    echo "== $set ($(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg))"
    PYTHONPATH=src "$PYTHON" -m bench_proj bench \
        --data.source.root "$OUT/$set" --data.image_size 224 --data.batch_size 32 \
        --data.source.val_fraction 0.2 --data.source.cache memmap --data.cache_dir "$OUT/cache" \
        --workers "$WORKERS" --epochs 3 | tee "$OUT/$set.txt"
done
