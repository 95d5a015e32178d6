"""The CoEvolve task pool (provenance, dedup, atomic save, resume) and `CoEvolveConfig` (fields, ablations)."""

import json
import os

import ml_collections
import pytest

from coevo_jax.coevolve.config import ABLATIONS, CoEvolveConfig
from coevo_jax.coevolve.pool import POOL_FILE, PoolTask, TaskPool
from coevo_jax.coevolve.signals import SignalMemory
from coevo_jax.envs.base import TaskSpec


def task(name: str, digest: str | None = None, signal="boundary", round_index=0) -> PoolTask:
    spec = TaskSpec(f"coevolve_{name}", f"do {name}", {"db": "x", "gold": name}, ("submit",), "intercode_sql")
    return PoolTask(spec, signal, "12", round_index, 7, True, digest or name)


def test_the_pool_keeps_provenance_and_resumes_from_its_file(tmp_path):
    pool = TaskPool.open(str(tmp_path))
    assert (len(pool), pool.num_rounds) == (0, 0) and not os.path.exists(tmp_path / POOL_FILE)
    memory = SignalMemory({"12": (1.0, 0.0)}, {"join": 3}, 40)
    assert pool.finish_round({"round": 0, "added": 2}, [task("a"), task("b", signal="rare")], memory) == 2
    assert (
        pool.finish_round({"round": 1, "added": 1}, [task("c", signal="forgetting", round_index=1)], memory)
        == 1
    )
    resumed = TaskPool.open(str(tmp_path))
    assert [t.to_json() for t in resumed.tasks] == [t.to_json() for t in pool.tasks]
    assert resumed.memory == memory and resumed.num_rounds == 2 and resumed.rounds[1]["added"] == 1
    assert resumed.tasks[1].signal == "rare" and resumed.tasks[1].parent_task == "12"
    assert resumed.tasks[2].round == 1 and resumed.tasks[2].step == 7
    assert [s.task_id for s in resumed.specs("intercode_sql")] == ["coevolve_a", "coevolve_b", "coevolve_c"]
    assert resumed.specs("builtin") == []
    assert resumed.makeup() == [
        {"round": 0, "forgetting": 0, "boundary": 1, "rare": 1, "unguided": 0},
        {"round": 1, "forgetting": 1, "boundary": 1, "rare": 1, "unguided": 0},
    ]


def test_the_pool_drops_a_task_it_holds_by_content_or_by_id(tmp_path):
    pool = TaskPool.open(str(tmp_path))
    assert pool.add([task("a", digest="d1"), task("b", digest="d1"), task("a", digest="d2")]) == 1
    assert "d1" in pool and "d2" not in pool and len(pool) == 1
    with pytest.raises(ValueError, match="provenance"):
        pool.add([task("z", signal="curiosity")])


def test_the_pool_file_is_replaced_whole(tmp_path, monkeypatch):
    pool = TaskPool.open(str(tmp_path))
    pool.finish_round({"round": 0}, [task("a")], SignalMemory())
    before = (tmp_path / POOL_FILE).read_text()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", broken_dump)
    with pytest.raises(OSError):
        pool.finish_round({"round": 1}, [task("b")], SignalMemory())
    assert (tmp_path / POOL_FILE).read_text() == before
    assert sorted(os.listdir(tmp_path)) == [POOL_FILE]  # no temporary left behind
    monkeypatch.undo()
    with pytest.raises(ValueError, match="format"):
        (tmp_path / POOL_FILE).write_text(json.dumps({"format": 99}))
        TaskPool.open(str(tmp_path))


def test_config_from_a_configdict_and_the_ablation_methods():
    config = CoEvolveConfig.from_mapping(
        ml_collections.ConfigDict({"signals": ["rare", "boundary"], "max_signals": 4})
    )
    assert config.signals == ("rare", "boundary") and config.max_signals == 4 and config.every_steps == 10
    with pytest.raises(ValueError, match="unknown coevolve options"):
        CoEvolveConfig.from_mapping({"windw": 3})
    with pytest.raises(ValueError, match="signals"):
        CoEvolveConfig(signals=("curiosity",))
    base = CoEvolveConfig()
    assert base.for_method("coevolve") == base
    assert base.for_method("coevolve_forgetting").signals == ("forgetting",)
    assert base.for_method("coevolve_no_verify").verify is False
    assert base.for_method("coevolve_unguided").guided is False
    assert set(ABLATIONS) == {
        "coevolve",
        "coevolve_forgetting",
        "coevolve_boundary",
        "coevolve_rare",
        "coevolve_no_verify",
        "coevolve_unguided",
    }
    with pytest.raises(ValueError, match="unknown CoEvolve method"):
        base.for_method("coevolve_everything")
