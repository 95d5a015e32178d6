"""ScienceWorld without a JVM: ETO's splits, step limits and instruction, data-file checks, malformed task ids,
and the gold-path experts' thoughts and shortcuts."""

import json
import shutil

import pytest

from coevo_jax.envs.sciworld import SciWorldEnv
from coevo_jax.envs.sciworld.data import DATA_DIR, load_data, split_task_id
from coevo_jax.envs.sciworld.gold import shortcut_navigation, thought_for

SPLITS = ("train", "test_seen", "test_unseen")


def test_eto_splits_step_limits_and_instruction():
    env = SciWorldEnv()
    assert env.splits() == SPLITS
    assert [len(env.tasks(s)) for s in SPLITS] == [1483, 194, 211]
    train, seen, unseen = (set(env.tasks(s)) for s in SPLITS)
    assert len(train) + len(seen) + len(unseen) == 1888  # no split repeats a task
    assert len(train & seen) == 54 and not unseen & (train | seen)  # as in ETO's files
    assert env.tasks("train")[0] == "task-2a-test-conductivity/412"
    assert split_task_id("task-6-lifespan-(longest-lived-then-shortest-lived)/52") == (
        "task-6-lifespan-(longest-lived-then-shortest-lived)",
        52,
    )
    assert env.max_steps("task-1-boil/4") == 100 and env.max_steps("task-3-find-animal/0") == 15
    with open(DATA_DIR / "sciworld_inst.txt") as f:
        assert env.instruction == f.read() and env.instruction.startswith("You are a helpful assistant")
    assert env.icl_messages()[0].content.startswith("Your task is to use chemistry to create green paint")
    with pytest.raises(ValueError, match="validation"):
        env.tasks("validation")


@pytest.mark.parametrize("bad", ["task-1-boil", "task-1-boil/x", "/3", "task-1-boil/-1"])
def test_malformed_task_ids_are_refused_before_any_jvm_starts(bad):
    env = SciWorldEnv()
    with pytest.raises(ValueError, match="is not 'TASK_NAME/VARIATION'"):
        env.reset(bad)
    with pytest.raises(ValueError, match="no step limit"):
        env.reset("task-8-inclined-plane-determine-angle/0")  # ETO gives it no step limit
    with pytest.raises(ValueError, match="sciworld: a task id must be a string"):
        env.reset(3)
    assert not env.simulator.started


def test_bad_data_files_name_the_file_record_and_field(tmp_path):
    shutil.copytree(DATA_DIR, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "dev_indices.json"
    records = json.loads(path.read_text())
    records[5] = ["task-1-boil", "7"]
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"dev_indices.json: record 5: field variation '7'"):
        load_data(tmp_path)
    records[5] = ["task-99-fly", 7]
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"dev_indices.json: record 5: field task_name 'task-99-fly'"):
        load_data(tmp_path)
    (tmp_path / "max_steps.json").write_text(json.dumps({"task-1-boil": 0}))
    with pytest.raises(ValueError, match=r"max_steps.json: record 'task-1-boil': step limit 0"):
        load_data(tmp_path)


def test_thoughts_are_short_templates_by_verb():
    assert thought_for("go to kitchen") == "I should go to the kitchen."
    assert thought_for("open door to kitchen") == "I need to open the door to the kitchen."
    assert thought_for("pick up thermometer") == "I need to pick up the thermometer."
    assert thought_for("move egg dove egg in inventory to red box") == (
        "I should move the egg dove egg in inventory to the red box."
    )
    assert thought_for("pour jug into flower pot 8") == "I should pour the jug into the flower pot 8."
    assert (
        thought_for("use shovel in inventory on ground")
        == "I will use the shovel in inventory on the ground."
    )
    assert thought_for("focus on substance in metal pot") == (
        "I should focus on the substance in metal pot, as the task asks."
    )
    assert (
        thought_for("wait1") == "I need to wait one step."
        and thought_for("wait") == "I need to wait for a while."
    )
    assert thought_for("0") == "Several things match that, so I choose option 0."
    assert thought_for("sing loudly") == "Next, I will sing loudly."


def test_walks_between_rooms_become_one_teleport():
    gold = [
        "open door to greenhouse",
        "go to greenhouse",
        "open door to outside",
        "go to outside",
        "look around",
    ]
    gold += ["focus on dove", "pick up dove", "open door to kitchen", "go to kitchen", "move dove to red box"]
    gold += ["open door to hallway", "wait1"]
    assert shortcut_navigation(gold) == [
        "teleport to outside",
        "look around",
        "focus on dove",
        "pick up dove",
        "teleport to kitchen",
        "move dove to red box",
        "wait1",
    ]
