#!/usr/bin/env bash
# One GPU (or CPU), one process: no distributed initialisation.
#
#   launch/single_gpu.sh CONFIG [--config.x=y ...]
#   GPU=1 launch/single_gpu.sh configs/smoke.py        # pick another GPU
#   JAX_PLATFORMS=cpu launch/single_gpu.sh configs/smoke.py
#
# Two full 7B policies do not fit one 80 GB GPU (docs/memory_plan.md): fine-tune models up to ~1.5B here,
# or 7B ones with LoRA (--config.model.lora_rank=16 ...: the command in docs/memory_plan.md).
set -euo pipefail

CONFIG=${1:?usage: single_gpu.sh CONFIG [flags...]}
shift
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-${GPU:-0}}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
export COEVO_DISTRIBUTED=0
exec python -m coevo_jax.main --config="${CONFIG}" "$@"
