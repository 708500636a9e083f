#!/usr/bin/env bash
# The built-in engine and the trainer on a GPU machine that has Python 3.12, torch and
# transformers but no network (benchmarks/gpu_check.py says what it checks). Installs the
# rest from gpu-bundle/ (made beforehand by benchmarks/gpu_bundle.py) into a venv over the
# machine's Python, offline, then runs the check on the model built from SmolLM2-135M's
# config with random weights; stopped after 470 s. PYTHON names the machine's interpreter
# (default python3).
#
#   benchmarks/gpu_check.sh [--out FILE] [gpu_check.py's options]
#   benchmarks/gpu_check.sh --dry-run [--out FILE]   # the same on this CPU, in a venv like
#                                                    # the GPU machine's (REHEARSAL_VENV)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=gpu-bundle
python=${PYTHON:-python3}
options=()
for arg in "$@"; do
  if [ "$arg" = --dry-run ]; then
    rehearsal=${REHEARSAL_VENV:-/opt/gpu-rehearsal-venv}
    python3 benchmarks/gpu_bundle.py --rehearsal "$rehearsal" --python "${REHEARSAL_PYTHON:-python3.12}"
    python=$rehearsal/bin/python
    options+=(--device cpu --quick --layers 2)
  else
    options+=("$arg")
  fi
done
if [ ! -f "$bundle/requirements.txt" ]; then
  echo "gpu_check: no $bundle/: make it with python benchmarks/gpu_bundle.py" >&2
  exit 2
fi

# A venv that sees the machine's packages (its site directories, added by a .pth with their
# own .pth files) and holds, besides, what the bundle adds: pip installs only what the
# machine lacks, with pip run from its wheel.
venv=$(mktemp -d /tmp/gpu-check-venv.XXXXXX)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$python" -c 'import sys
for path in sys.path:
    if path.endswith(("site-packages", "dist-packages")):
        print(f"import site; site.addsitedir({path!r})")' > "$site/machine.pth"
PIP_CONFIG_FILE=/dev/null "$venv/bin/python" "$(echo "$bundle"/pip/pip-*.whl)/pip" install --quiet \
  --no-index --find-links "$bundle/wheels" --report "$venv/installed.json" \
  -r "$bundle/requirements.txt"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
status=0
timeout 470 "$venv/bin/python" benchmarks/gpu_check.py --random-weights "$bundle/smollm2-135m" \
  --installed "$venv/installed.json" "${options[@]}" || status=$?
if [ "$status" -eq 124 ]; then
  echo "gpu_check: stopped after 470 s" >&2
fi
exit "$status"
