#!/usr/bin/env bash
# Runs coevo_jax on every worker of a Cloud TPU pod slice (one process per TPU VM host).
#
#   launch/tpu_pod.sh TPU_NAME ZONE CONFIG [--config.x=y ...]     # train
#   SETUP=1 launch/tpu_pod.sh TPU_NAME ZONE CONFIG                # first install the repo on all workers
#
# JAX reads the pod topology from the TPU metadata server, so COEVO_DISTRIBUTED=1 is all
# `jax.distributed.initialize()` needs. SETUP=1 needs REPO_URL (your clone's URL); REPO_DIR and PROJECT
# may be overridden.
# Pass --workdir=DIR on a file system every host mounts: all processes run the main job on it (each plays
# its share of the rollouts; process 0 writes the records; Orbax saves collectively), see launch/README.md.
set -euo pipefail

TPU_NAME=${1:?usage: tpu_pod.sh TPU_NAME ZONE CONFIG [flags...]}
ZONE=${2:?zone, e.g. us-east5-b}
CONFIG=${3:?config file, e.g. configs/quickstart.py}
shift 3
REPO_DIR=${REPO_DIR:-coevo_jax}
PROJECT_FLAG=${PROJECT:+--project=${PROJECT}}

ssh_all() {
  # shellcheck disable=SC2086
  gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${ZONE}" ${PROJECT_FLAG} --worker=all --command="$1"
}

if [[ "${SETUP:-0}" == "1" ]]; then
  REPO_URL=${REPO_URL:?SETUP=1 needs REPO_URL: the git URL every worker clones}
  ssh_all "set -e; [ -d ${REPO_DIR} ] || git clone ${REPO_URL} ${REPO_DIR};
           cd ${REPO_DIR} && git pull --ff-only && pip install -q -e '.[tpu]'"
fi

# Quote the extra flags once for the remote shell.
EXTRA=""
if (($#)); then EXTRA=$(printf ' %q' "$@"); fi
ssh_all "cd ${REPO_DIR} && COEVO_DISTRIBUTED=1 python -m coevo_jax.main --config=${CONFIG}${EXTRA} \
         2>&1 | tee -a coevo_\$(hostname).log"
