#!/usr/bin/env bash
# The main job as N JAX processes on this machine (CPU devices), e.g. to check a multi-process run:
#
#   launch/local_processes.sh N CONFIG WORKDIR [--config.x=y ...]
#   DEVICES=2 launch/local_processes.sh 4 configs/tiny.py /tmp/w4      # 4 processes x 2 devices
#
# Each process gets COEVO_DISTRIBUTED=1 with a coordinator on localhost, the process count and its id
# (`coevo_jax.sharding.maybe_initialize_distributed`), DEVICES fake CPU devices (default 4) and gloo CPU
# collectives. Process 0 prints to the terminal, process r > 0 to WORKDIR/logs/process<r>.log. When one
# process exits with an error the others are killed (they would wait at the next barrier forever), and the
# script exits with the first failure's status. MAIN replaces the entry command (default
# `python -m coevo_jax.main`; e.g. MAIN="python launch/kill_at.py dpo 3 NOTE" plants a kill in every process).
set -euo pipefail

N=${1:?usage: local_processes.sh N CONFIG WORKDIR [flags...]}
CONFIG=${2:?config file, e.g. configs/tiny.py}
WORKDIR=${3:?workdir}
shift 3
DEVICES=${DEVICES:-4}
PYTHON=${PYTHON:-python}
MAIN=${MAIN:-${PYTHON} -m coevo_jax.main}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${PORT:-$("${PYTHON}" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')}
mkdir -p "${WORKDIR}/logs"

export COEVO_DISTRIBUTED=1 JAX_PLATFORMS=cpu
export JAX_COORDINATOR_ADDRESS="localhost:${PORT}" JAX_NUM_PROCESSES="${N}"
FLAGS=$(echo "${XLA_FLAGS:-}" | sed 's/--xla_force_host_platform_device_count=[0-9]*//g')
export XLA_FLAGS="${FLAGS} --xla_force_host_platform_device_count=${DEVICES}"
export PYTHONPATH="${ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

pids=()
for ((rank = 0; rank < N; rank++)); do
  if ((rank == 0)); then
    # shellcheck disable=SC2086
    JAX_PROCESS_ID=${rank} ${MAIN} --config="${CONFIG}" --workdir="${WORKDIR}" "$@" &
  else
    # shellcheck disable=SC2086
    JAX_PROCESS_ID=${rank} ${MAIN} --config="${CONFIG}" --workdir="${WORKDIR}" "$@" \
      >"${WORKDIR}/logs/process${rank}.log" 2>&1 &
  fi
  pids+=($!)
done

status=0
for ((left = N; left > 0; left--)); do
  code=0
  wait -n "${pids[@]}" 2>/dev/null || code=$?
  if ((code != 0)); then
    status=${code}
    for pid in "${pids[@]}"; do kill -9 "${pid}" 2>/dev/null || true; done
    wait "${pids[@]}" 2>/dev/null || true
    break
  fi
done
exit "${status}"
