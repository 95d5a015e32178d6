"""`studies.coevolve.coevolve_round`: its fake rollout history, and the rare shares `coevolve.signals` quotes."""

import json

from coevo_jax import envs
from studies.coevolve import coevolve_round


def test_the_history_fails_every_third_task_then_adds_a_failure_to_every_fourth():
    experts = envs.make("builtin").expert_trajectories("train")[:12]
    records = coevolve_round.history(experts, offset=3)
    by_step = {step: [r for r in records if r.iteration == step] for step in (3, 4, 5)}
    assert [len(by_step[step]) for step in (3, 4, 5)] == [12, 12, 12 + 3]
    assert all(r.reward == e.reward for r, e in zip(by_step[3], experts, strict=True))
    failed = [i for i, r in enumerate(by_step[4]) if r.traj_id.endswith("_f_s4")]
    assert failed == [0, 3, 6, 9] and all(by_step[4][i].reward == 0.0 for i in failed)
    cut = by_step[4][3]
    assert len(cut.actions) == max(1, len(experts[3].actions) // 2)
    assert sum(r.traj_id.endswith("b") for r in by_step[5]) == 3
    assert len({r.traj_id for r in records}) == len(records)


def test_rounds_on_the_builtin_and_bfcl_experts(tmp_path):
    out = tmp_path / "rounds.json"
    results = coevolve_round.main(["--envs", "builtin", "bfcl", "--rounds", "2", "--out", str(out)])
    assert json.loads(out.read_text())["envs"].keys() == {"builtin", "bfcl"}
    for name, env in results["envs"].items():
        rounds = env["rounds"]
        assert [r["round"] for r in rounds] == [0, 1], name
        assert all(r["verified"] <= r["synthesized"] <= r["explored"] for r in rounds), name
        assert rounds[-1]["pool_size"] == sum(r["verified"] for r in rounds) > 0, name
    # the shares `coevolve.signals` quotes for its defaults (theta 5, n_min 200): none on the built-in
    # environment, whose families are balanced; 95 % of BFCL's, whose 150 functions have a long tail
    assert results["envs"]["builtin"]["rare_share"]["with_rare_pattern"] == 0
    bfcl = results["envs"]["bfcl"]["rare_share"]
    assert (bfcl["rollouts"], bfcl["with_rare_pattern"]) == (150, 142)
