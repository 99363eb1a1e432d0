#!/usr/bin/env bash
# GPU training throughput with and without the pre-decoded cache: bakes the
# template, trains on synthetic 500x375 photos for a few epochs with bf16 mixed precision, and
# prints images/s, data_wait_fraction (both logged by the starvation monitor, over the steps after
# each epoch's first) and the mean GPU utilisation that nvidia-smi sampled during each run.
#
#   benchmarks/gpu.sh [OUT_DIR]          e.g. benchmarks/gpu.sh build/gpu
#
# COUNT, EPOCHS, BATCH, WORKERS, ACCELERATOR and PRECISION override the defaults below (the
# script also runs on a CPU, for a dry run: ACCELERATOR=cpu PRECISION=32-true COUNT=64 BATCH=8).
# Where the Python has LitData (the stream extra), a third run trains from shards of the same
# photos (`shard`, outside the timed run). PROJECT=<a baked project> uses that bake instead of
# baking one (for a machine without cookiecutter).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-build/gpu}" && cd "${1:-build/gpu}" && pwd)"
COUNT="${COUNT:-8000}" EPOCHS="${EPOCHS:-4}" BATCH="${BATCH:-256}" WORKERS="${WORKERS:-auto}"
ACCELERATOR="${ACCELERATOR:-gpu}" PRECISION="${PRECISION:-bf16-mixed}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo "$PWD/.venv/bin/python" || echo python3 )}"

[ -d "$OUT/photos" ] || "$PYTHON" benchmarks/make_images.py "$OUT/photos" --count "$COUNT" --size 500x375
if [ -n "${PROJECT:-}" ]; then
    PROJECT="$(cd "$PROJECT" && pwd)"
else
    "$PYTHON" -m cookiecutter . --no-input -f -o "$OUT" project_name="Gpu Proj" shards=yes
    PROJECT="$OUT/gpu-proj"
fi
PACKAGE="$(basename "$(dirname "$(ls "$PROJECT"/src/*/__main__.py)")")"
export PYTHONPATH="$PROJECT/src${PYTHONPATH:+:$PYTHONPATH}"
cd "$PROJECT"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $COUNT images, batch $BATCH, $EPOCHS epochs"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
modes="none memmap"
if "$PYTHON" -c "import litdata" 2>/dev/null; then
    modes="$modes stream"
else
    echo "no LitData in this Python: the shards run is left out"
fi
for cache in $modes; do
    data=(--data.source.root "$OUT/photos" --data.source.cache "$cache")
    if [ "$cache" = memmap ]; then  # built outside the timed run, as a second run would find it
        "$PYTHON" -c "from $PACKAGE.data import ImageDataModule as D; \
from $PACKAGE.data.sources import ClassFolders as F; \
D(F('$OUT/photos', cache='memmap'), image_size=224, cache_dir='$OUT/cache').setup('fit')"
    elif [ "$cache" = stream ]; then  # shards of the same photos, written outside the timed run
        rm -rf "$OUT/shards"
        "$PYTHON" -m "$PACKAGE" shard --data.source.root "$OUT/photos" --output "$OUT/shards" \
            2>&1 | tail -1
        data=(--data.source Shards --data.source.path "$OUT/shards")
    fi
    sampler=""
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 500 \
            > "$OUT/util-$cache.txt" &
        sampler=$!
    fi
    rm -rf "$OUT/runs-$cache" && mkdir -p "$OUT/runs-$cache"
    (cd "$OUT/runs-$cache" && "$PYTHON" -m "$PACKAGE" fit \
        --data.image_size 224 --data.batch_size "$BATCH" \
        --data.num_workers "$WORKERS" "${data[@]}" --data.cache_dir "$OUT/cache" \
        --trainer.accelerator "$ACCELERATOR" --trainer.devices 1 --trainer.precision "$PRECISION" \
        --trainer.max_epochs "$EPOCHS" --trainer.enable_progress_bar false \
        > "$OUT/fit-$cache.log" 2>&1)
    [ -n "$sampler" ] && kill "$sampler"
    "$PYTHON" - "$OUT" "$cache" <<'PY'
import csv, glob, statistics, sys
out, cache = sys.argv[1], sys.argv[2]
(metrics,) = sorted(glob.glob(f"{out}/runs-{cache}/**/metrics.csv", recursive=True))[-1:]
rows = [r for r in csv.DictReader(open(metrics)) if r.get("data_wait_fraction")]
last = rows[1:] or rows  # epoch 0 warms up (cuDNN autotuning, page cache)
rate = statistics.median(float(r["train_images_per_s"]) for r in last)
wait = statistics.median(float(r["data_wait_fraction"]) for r in last)
try:
    samples = [float(v) for v in open(f"{out}/util-{cache}.txt") if v.strip()]
    util = f"{statistics.mean(samples):.0f}%"
except OSError:
    util = "n/a"
print(f"cache={cache:7s} train images/s {rate:8.0f}   data_wait_fraction {wait:.2f}   "
      f"GPU utilisation {util} (mean over the whole run)")
PY
done
