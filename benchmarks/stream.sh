#!/usr/bin/env bash
# Shards against the folder path, behind BENCHMARKS.md "Shards": writes the noisy photo set,
# bakes the template with the stream extra's LitData, times `shard` (the conversion), then runs the
# baked project's benchmark on the folder with the shards made from it: naive baseline, the folder
# loader (decode), the pixel cache (memmap) and the shards (stream) in one run.
#
#   benchmarks/stream.sh [OUT_DIR] [WORKERS]      e.g. benchmarks/stream.sh build/bench "[1,2]"
#
# COUNT=8000 (default 2000) writes a larger set, for longer epochs; use a new OUT_DIR with it.
# Needs a Python with the template's dev requirements and litdata (`pip install litdata`).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$(mkdir -p "${1:-build/bench}" && cd "${1:-build/bench}" && pwd)"
WORKERS="${2:-[1,2]}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo "$PWD/.venv/bin/python" || echo python3 )}"
SET="$OUT/photos-500x375"

[ -d "$SET" ] || "$PYTHON" benchmarks/make_images.py "$SET" --count "${COUNT:-2000}" --size 500x375
"$PYTHON" -m cookiecutter . --no-input -f -o "$OUT" project_name="Bench Proj" shards=yes
cd "$OUT/bench-proj"
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$OUT/shards" "$OUT/shards-256"
PYTHONPATH=src "$PYTHON" -m bench_proj shard --data.source.root "$SET" --data.source.val_fraction 0.2 \
    --output "$OUT/shards" 2>&1 | grep -v "^Progress\|^\s*$" | tail -1
PYTHONPATH=src "$PYTHON" -m bench_proj shard --data.source.root "$SET" --data.source.val_fraction 0.2 \
    --output "$OUT/shards-256" --resize 256 2>&1 | tail -1
du -sh "$SET" "$OUT/shards" "$OUT/shards-256"
PYTHONPATH=src "$PYTHON" -m bench_proj bench \
    --data.source.root "$SET" --shards "$OUT/shards" --data.image_size 224 --data.batch_size 32 \
    --data.source.val_fraction 0.2 --data.source.cache memmap --data.cache_dir "$OUT/cache" \
    --workers "$WORKERS" --epochs 3 --max_images null | tee "$OUT/stream.txt"  # shards: all
