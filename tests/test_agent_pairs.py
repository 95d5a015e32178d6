"""The two agents' independent stages side by side (`experiment.agent_pairs`): the pairing itself, when it
is on, and a tiny run whose results and policies are the same whether its agents run together or apart."""

import json
import threading

import jax
import numpy as np
import pytest
from test_experiment import tiny_config

from coevo_jax.experiment.agent_pairs import resolve_concurrent_agents, run_pair
from coevo_jax.experiment.run import run
from coevo_jax.experiment.store import RunStore


def test_run_pair_returns_both_results_in_order_whether_concurrent_or_not():
    for concurrent in (False, True):
        assert run_pair(lambda: "a", lambda: 2, concurrent=concurrent) == ("a", 2)


def test_concurrent_pair_runs_both_at_once():
    started = threading.Event()

    def first():  # finishes only once the second has started: one after the other would time out
        assert started.wait(timeout=10), "the second callable did not start while the first ran"
        return 1

    def second():
        started.set()
        return 2

    assert run_pair(first, second, concurrent=True) == (1, 2)


@pytest.mark.parametrize("concurrent", [False, True])
def test_an_error_propagates_after_both_finished(concurrent):
    finished = []

    def failing():
        raise RuntimeError("first failed")

    def slow():
        threading.Event().wait(0.2)
        finished.append("second")
        return 2

    with pytest.raises(RuntimeError, match="first failed"):
        run_pair(failing, slow, concurrent=concurrent)
    assert finished == ([] if not concurrent else ["second"])  # sequential: the first error stops the pair
    with pytest.raises(ValueError, match="second failed"):
        run_pair(lambda: 1, lambda: (_ for _ in ()).throw(ValueError("second failed")), concurrent=concurrent)


def test_concurrent_agents_resolves_to_single_process_cpu_runs():
    assert resolve_concurrent_agents(None, platform="cpu", process_count=1)
    assert not resolve_concurrent_agents(None, platform="gpu", process_count=1)
    assert not resolve_concurrent_agents(None, platform="cpu", process_count=2)
    assert not resolve_concurrent_agents(None, platform="cpu", process_count=1, device_count=8)
    assert resolve_concurrent_agents(True, platform="gpu", process_count=1)
    assert not resolve_concurrent_agents(False, platform="cpu", process_count=1)
    with pytest.raises(ValueError, match="single-process"):
        resolve_concurrent_agents(True, platform="cpu", process_count=2)


def _without_execution(results: dict) -> dict:
    """results.json less the field that differs by design and the speeds (`*_per_second`)."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not k.endswith("_per_second")}
        return [strip(v) for v in value] if isinstance(value, list) else value

    results = strip(json.loads(json.dumps(results)))
    del results["config"]["concurrent_agents"]
    return results


@pytest.mark.slow  # two tiny runs of SFT, ETO and co-evolution
def test_a_run_with_its_agents_side_by_side_equals_the_run_one_stage_at_a_time(tmp_path):
    apart = run(tiny_config(concurrent_agents=False), str(tmp_path / "apart"))
    together = run(tiny_config(concurrent_agents=True), str(tmp_path / "together"))
    assert _without_execution(apart) == _without_execution(together)
    stores = [RunStore(str(tmp_path / name)) for name in ("apart", "together")]
    try:
        for policy in (
            "sft_target",
            "sft_failure",
            "coevo_it1_failure",
            "coevo_it1_target",
            "eto_it1_target",
        ):
            saved = [store._checkpointer.restore(store.policy_dir(policy)) for store in stores]
            leaves = [[np.asarray(x) for x in jax.tree.leaves(params)] for params in saved]
            assert len(leaves[0]) == len(leaves[1]) > 0, policy
            for a, b in zip(*leaves, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=policy)
    finally:
        for store in stores:
            store.close()
    for name in ("sft_target_test_seen", "coevo_it1_target_test_unseen", "sft_failure_it1_explore"):
        texts = [(tmp_path / d / "rollouts" / f"{name}.jsonl").read_text() for d in ("apart", "together")]
        assert sorted(texts[0].splitlines()) == sorted(texts[1].splitlines()), name
