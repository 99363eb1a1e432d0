#!/usr/bin/env bash
# The main job: bake the template with its defaults into a scratch folder, install the project into
# its own virtual environment, and train on the generated demo data. Usage: demo.sh DIR [PYTHON]
set -euo pipefail
dir=${1:-build/demo}
python=${2:-python3}
template=$(cd "$(dirname "$0")/.." && pwd)

rm -rf "$dir" && mkdir -p "$dir"
"$python" -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install --quiet --upgrade pip
"$dir/venv/bin/python" -m pip install --quiet "cookiecutter>=2.6"
"$dir/venv/bin/cookiecutter" "$template" --no-input --output-dir "$dir"
project=$(find "$dir" -mindepth 1 -maxdepth 1 -type d ! -name venv)
cd "$project"
../venv/bin/python -m pip install --quiet -e ".[dev]"
package=$(basename "$(dirname src/*/__main__.py)")
echo "== Baked $project; training $package on the demo data"
../venv/bin/python -m "$package" fit
best=$(ls -t lightning_logs/*/checkpoints/best.ckpt | head -1)
echo "== Validating $best"
../venv/bin/python -m "$package" validate --ckpt_path "$best"
