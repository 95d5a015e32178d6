#!/usr/bin/env bash
# Issue 8's benchmarks in one run on one machine, one after another (never two at once), then the tables.
#   bash bench/run_all.sh                 # makes the peers' venvs if missing, runs everything
#   RESULTS=/tmp/r bash bench/run_all.sh  # results elsewhere (default bench/results)
#   PEERS=0 bash bench/run_all.sh         # coevo_jax only (e.g. on a GPU machine without the peers)
# Each script prints its own table; bench/compare.py prints the side-by-side tables and the targets
# and writes $RESULTS/summary.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RESULTS="${RESULTS:-bench/results}"
PEERS="${PEERS:-1}"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1

python bench/dpo_throughput.py --out "$RESULTS"
python bench/decode_throughput.py --out "$RESULTS"
python bench/rollout_builtin.py --groups 1 --rows 16 --out "$RESULTS/rollout_builtin.json"
if [[ "$PEERS" == 1 ]]; then
  bash bench/peers/make_venvs.sh
  bench/.venvs/trl/bin/python bench/peers/trl_dpo.py --out "$RESULTS"
  bench/.venvs/trl/bin/python bench/peers/hf_generate.py --out "$RESULTS"
  bench/.venvs/tunix/bin/python bench/peers/tunix_dpo.py --out "$RESULTS"
  bench/.venvs/tunix/bin/python bench/peers/tunix_sample.py --out "$RESULTS"
fi
python bench/compare.py --results "$RESULTS" --out "$RESULTS/summary.md"
