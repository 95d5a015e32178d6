#!/usr/bin/env bash
# Makes the peers' virtual environments (issue 8) under bench/.venvs/, never touching the project's own:
#   bench/.venvs/trl    torch 2.13.0 (CPU wheel), trl 1.16.x, transformers, datasets, accelerate, numpy
#   bench/.venvs/tunix  google-tunix 0.1.7 with the jax/flax/transformers it resolves to (jax CPU)
# Idempotent: an environment whose packages already import at the wanted versions is left as it is.
# Usage, from the repo root:  bash bench/peers/make_venvs.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENVS="$ROOT/bench/.venvs"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION=2.13.0
TRL_SPEC='trl==1.16.*'
TUNIX_SPEC='google-tunix==0.1.7'
export PIP_DISABLE_PIP_VERSION_CHECK=1

pip_install() {  # pip_install PYTHON SPEC...: quiet, without the notes on index folders lacking a package
  local py="$1"
  shift
  "$py" -m pip install -q "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
  return "${PIPESTATUS[0]}"
}

new_venv() {  # new_venv DIR: creates DIR unless it already holds a working python
  if [[ ! -x "$1/bin/python" ]]; then
    "$PYTHON" -m venv "$1"
    pip_install "$1/bin/python" --upgrade pip
  fi
}

check_cpu_torch() {  # check_cpu_torch PYTHON: fails unless torch is 2.13.0 built without CUDA
  "$1" - "$TORCH_VERSION" <<'PY'
import sys

import torch

want = sys.argv[1]
assert torch.__version__.startswith(want), f"torch {torch.__version__}, wanted {want}"
assert torch.version.cuda is None, f"a CUDA torch was installed ({torch.version.cuda})"
PY
}

make_trl() {
  local venv="$VENVS/trl" py="$VENVS/trl/bin/python"
  new_venv "$venv"
  # torch first, on its own, so that nothing later can pull a CUDA build; then pin it for the rest.
  if ! check_cpu_torch "$py" 2>/dev/null; then
    pip_install "$py" "torch==$TORCH_VERSION" numpy
  fi
  check_cpu_torch "$py"
  local tv
  tv="$("$py" -c 'import torch; print(torch.__version__)')"
  pip_install "$py" "$TRL_SPEC" transformers datasets accelerate numpy "torch==$tv"
  check_cpu_torch "$py"
}

make_tunix() {
  local venv="$VENVS/tunix" py="$VENVS/tunix/bin/python"
  new_venv "$venv"
  # jax without extras is the CPU build; tunix's own requirements choose flax, transformers and the rest.
  pip_install "$py" "$TUNIX_SPEC" jax
}

versions() {  # versions PYTHON DIST...: one "name version" line per distribution
  local py="$1"
  shift
  "$py" - "$@" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in sys.argv[1:]:
    try:
        print(f"  {name:<14} {version(name)}")
    except PackageNotFoundError:
        print(f"  {name:<14} (not installed)")
PY
}

mkdir -p "$VENVS"
start=$SECONDS
make_trl
make_tunix
echo "bench/.venvs/trl:"
versions "$VENVS/trl/bin/python" trl transformers torch accelerate datasets numpy
"$VENVS/trl/bin/python" -c 'import torch; print(f"  torch.version.cuda {torch.version.cuda}")'
echo "bench/.venvs/tunix:"
versions "$VENVS/tunix/bin/python" google-tunix jax jaxlib flax optax transformers qwix numpy
echo "done in $((SECONDS - start)) s"
