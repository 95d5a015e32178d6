"""Hard negatives counted at several thresholds: the pure count against a direct one on random pairs, and the
command over a run's workdir against the pairs its phases trained on."""

import subprocess
import sys

import numpy as np
from seeds import fresh_seed
from test_data_export import episode, write_run

from coevo_jax.analysis import hard_negatives
from coevo_jax.data.pair_pool import EXPERT_VS_TARGET, FAILURE_VS_FAILURE, PreferencePair


def _pairs(rng, n):
    out = []
    for i in range(n):
        low, high = sorted(rng.choice(np.round(np.linspace(0, 1, 11), 1), size=2, replace=False))
        high = 1.0 if rng.random() < 0.5 else high  # an expert or a success on the chosen side
        kind = FAILURE_VS_FAILURE if high < 1 else EXPERT_VS_TARGET
        chosen, rejected = (
            episode(f"{side}_{i}_0", "t0", r, "target", 1) for side, r in (("c", high), ("r", low))
        )
        out.append(PreferencePair("t0", chosen, rejected, kind, 1.0, 0.0))
    return out


def test_counts_are_those_of_a_direct_count_at_every_threshold():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    pairs = _pairs(rng, 200)
    thresholds = (0.6, 0.7, 0.8)
    counts = hard_negatives.threshold_counts(pairs, thresholds)
    rejected = np.array([p.rejected.reward for p in pairs])
    failure = np.array([p.chosen.reward < 1 for p in pairs])
    assert counts["pairs"] == 200 and counts["failure_pairs"] == failure.sum(), seed
    for t in thresholds:
        assert counts["hard"][t] == (rejected >= t).sum(), (seed, t)
        assert counts["hard_failure_pairs"][t] == (failure & (rejected >= t)).sum(), (seed, t)
    assert counts["hard"][0.6] >= counts["hard"][0.7] >= counts["hard"][0.8]


def test_a_run_is_counted_from_the_pairs_its_phases_trained_on(tmp_path):
    run = write_run(tmp_path / "run")
    counts = hard_negatives.run_counts(str(tmp_path / "run"), (0.6, 0.7))
    assert set(counts) == {"ETO target", "CoEvolving failure agent", "CoEvolving target"}
    eto = [p for name in ("eto_it1_target", "eto_it2_target") for p in run["pairs"][name]]
    assert counts["ETO target"] == hard_negatives.threshold_counts(eto, (0.6, 0.7))
    target = run["pairs"]["coevo_it1_target"]
    assert counts["CoEvolving target"]["hard"][0.7] == sum(p.rejected.reward >= 0.7 for p in target)
    text = hard_negatives.table([counts, counts], (0.6, 0.7))
    assert "| ETO target | 2 |" in text and "± 0.0" in text


def test_the_command_prints_the_table_and_refuses_a_missing_workdir(tmp_path):
    write_run(tmp_path / "run")
    command = [sys.executable, "-m", "coevo_jax.analysis", "hard_negatives"]
    done = subprocess.run(
        [*command, str(tmp_path / "run"), "--thresholds", "0.7"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "rejected ≥ 0.7" in done.stdout and "CoEvolving target" in done.stdout
    missing = subprocess.run([*command, str(tmp_path / "nothing")], capture_output=True, text=True)
    assert missing.returncode == 1 and str(tmp_path / "nothing") in missing.stderr
