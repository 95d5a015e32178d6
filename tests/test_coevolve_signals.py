"""CoEvolve's signals on hand-built rollout histories, the expected signals written out; the action patterns
of each environment."""

import pytest

from coevo_jax.coevolve.patterns import (
    bfcl_patterns,
    builtin_pattern,
    patterns_for,
    sql_statement_patterns,
    trajectory_patterns,
)
from coevo_jax.coevolve.signals import (
    SignalMemory,
    boundary_signals,
    detect,
    forgetting_signals,
    rare_signals,
)
from coevo_jax.data.records import ASSISTANT, USER, Message, Trajectory

_count = iter(range(10**6))


def rollout(task, step, reward, actions=("look around",), env="builtin", patterns=()):
    messages = [Message(USER, "the task")]
    for action in actions:
        messages += [Message(ASSISTANT, f"Thought: ok\nAction: {action}"), Message(USER, "Observation: ok")]
    return Trajectory(
        traj_id=f"r{next(_count)}",
        task_id=task,
        messages=tuple(messages[:-1]),
        reward=reward,
        agent="target",
        env=env,
        iteration=step,
        extra={"patterns": list(patterns)},
    )


def history(table: dict[str, list]) -> list[Trajectory]:
    """{task: [step 0 rewards, step 1 rewards, ...]} -> rollouts, a list of rewards (K samples) or one reward."""
    records = []
    for step in range(max(len(v) for v in table.values())):
        for task, scores in table.items():
            if step < len(scores):
                rewards = scores[step] if isinstance(scores[step], list) else [scores[step]]
                records += [rollout(task, step, r) for r in rewards]
    return records


def keys(signals):
    return [(s.kind, s.task_id, s.step) for s in signals]


# -- forgetting -----------------------------------------------------------------------------------------------


def test_forgetting_fires_while_a_success_is_in_the_window():
    records = history(
        {
            "A": [1.0, 0.0, 0.0, 0.0],  # forgotten at 1; the success is still in the window at 2, gone at 3
            "B": [0.0, 0.0, 1.0, 0.25],  # never learnt until step 2, forgotten at 3
            "C": [0.5, 0.4],  # 0.5 counts as a success, 0.4 as a failure
            "D": [0.4, 0.4, 0.4, 0.4],  # never succeeded: never forgotten
            "E": [1.0, 1.0, 0.5, 1.0],  # never failed
        }
    )
    signals, scores = forgetting_signals(records, window=2)
    assert keys(signals) == [
        ("forgetting", "A", 1),
        ("forgetting", "C", 1),
        ("forgetting", "A", 2),
        ("forgetting", "B", 3),
    ]
    assert signals[0].detail == "score 0.00 after 1.00"
    assert scores == {"A": (0.0, 0.0), "B": (1.0, 0.25), "C": (0.5, 0.4), "D": (0.4, 0.4), "E": (0.5, 1.0)}
    assert keys(forgetting_signals(records, window=1)[0]) == [
        ("forgetting", "A", 1),
        ("forgetting", "C", 1),
        ("forgetting", "B", 3),
    ]


def test_forgetting_scores_a_step_by_its_mean_and_marks_its_failed_rollouts():
    records = history({"A": [[1.0, 1.0], [1.0, 0.0, 0.0]], "B": [[1.0, 0.0], [1.0, 0.0]]})
    signals, _ = forgetting_signals(records, window=3)
    assert keys(signals) == [("forgetting", "A", 1)]  # B's mean stays 0.5
    assert [t.reward for t in signals[0].trajectories] == [0.0, 0.0]


def test_forgetting_resumes_from_the_carried_scores():
    records = history({"A": [1.0, 1.0, 0.0, 1.0, 0.0]})
    whole, _ = forgetting_signals(records, window=3)
    first, carried = forgetting_signals([r for r in records if r.iteration < 2], window=3)
    rest, _ = forgetting_signals([r for r in records if r.iteration >= 2], carried, window=3)
    assert keys(first + rest) == keys(whole) == [("forgetting", "A", 2), ("forgetting", "A", 4)]


# -- boundary -------------------------------------------------------------------------------------------------


def test_boundary_fires_on_a_mixed_group_and_marks_all_of_it():
    records = history(
        {
            "A": [[1.0, 0.0, 1.0], [0.0, 0.0]],  # mixed at 0 only
            "B": [[0.5, 1.0], [0.5, 0.0]],  # 0.5 is neither side
            "C": [[0.6, 0.4]],
            "D": [[1.0]],  # one sample cannot disagree
        }
    )
    signals = boundary_signals(records)
    assert keys(signals) == [("boundary", "A", 0), ("boundary", "C", 0)]
    assert [t.reward for t in signals[0].trajectories] == [1.0, 0.0, 1.0]
    assert signals[0].evidence.reward == 0.0


# -- rare -----------------------------------------------------------------------------------------------------


def _patterns(trajectory):
    return frozenset(trajectory.extra["patterns"])


def test_rare_fires_below_theta_percent_once_enough_rollouts_were_seen():
    step0 = [rollout(f"t{i}", 0, 1.0, patterns=["go"]) for i in range(19)]
    step0.append(rollout("mixer", 0, 1.0, patterns=["go", "mix", "slice"]))
    step1 = [rollout("mixer", 1, 0.0, patterns=["mix"]), rollout("t0", 1, 1.0, patterns=["go"])]
    # 20 rollouts at step 0: mix and slice are 1/20 = 5%, not under theta = 5; at theta = 10 they are
    assert rare_signals(step0, _patterns, theta=5, min_seen=20)[0] == []
    signals, counts, seen = rare_signals(step0 + step1, _patterns, theta=10, min_seen=20)
    assert keys(signals) == [("rare", "mixer", 0), ("rare", "mixer", 1)]
    assert signals[0].patterns == ("mix", "slice")  # rarest first, then by name
    assert signals[1].patterns == ("mix",)  # 2/22 = 9.1%: still rare; its rollout shows no slice
    assert (counts, seen) == ({"go": 21, "mix": 2, "slice": 1}, 22)
    # not before n_min rollouts were seen: nothing at step 0 (20 seen), mix at step 1 (22 seen)
    late, _, _ = rare_signals(step0 + step1, _patterns, theta=10, min_seen=21)
    assert keys(late) == [("rare", "mixer", 1)]


def test_rare_counts_carry_over_between_calls():
    step0 = [rollout(f"t{i}", 0, 1.0, patterns=["go"]) for i in range(10)]
    step1 = [rollout("x", 1, 1.0, patterns=["go", "mix"])]
    _, counts, seen = rare_signals(step0, _patterns, theta=10, min_seen=11)
    signals, counts, seen = rare_signals(step1, _patterns, counts, seen, theta=10, min_seen=11)
    assert keys(signals) == [("rare", "x", 1)] and seen == 11 and counts["go"] == 11


# -- detect: all three, with memory ----------------------------------------------------------------------------


def test_detect_keeps_the_asked_kinds_and_always_updates_its_memory():
    records = history({"A": [1.0, [0.0, 1.0]], "B": [0.0, 0.0]})
    memory = SignalMemory()
    everything, memory_all = detect(records, memory, _patterns, window=2, min_seen=1)
    assert keys(everything) == [("boundary", "A", 1)]  # A's mean at step 1 is 0.5: no forgetting
    only_forgetting, memory_some = detect(records, memory, _patterns, kinds=("forgetting",), window=2)
    assert only_forgetting == [] and memory_some.scores == memory_all.scores
    assert SignalMemory.from_json(memory_all.to_json()) == memory_all
    with pytest.raises(ValueError, match="unknown signal kinds"):
        detect(records, memory, _patterns, kinds=("boredom",))
    with pytest.raises(ValueError, match="iteration"):
        detect([rollout("A", None, 1.0)], memory, _patterns)


# -- patterns -------------------------------------------------------------------------------------------------


def test_builtin_patterns_name_the_verb_and_its_fixtures():
    assert builtin_pattern("put apple in stove") == "put THING in stove"
    assert builtin_pattern("Put the apple into the box.") == "put THING in CONTAINER"
    assert builtin_pattern("take knife") == "pick up knife"
    assert builtin_pattern("go to kitchen") == "go to ROOM"
    assert builtin_pattern("use knife on pear") == "use knife on THING"
    assert builtin_pattern("dance") is None


def test_sql_patterns_are_clause_kinds_outside_string_literals():
    query = "SELECT name FROM t WHERE x LIKE 'join%' GROUP BY name HAVING COUNT(*) > 1"
    assert sql_statement_patterns(query) == {"select", "where", "like", "group by", "having", "count"}
    nested = "SELECT a FROM t JOIN u ON t.k = u.k WHERE b NOT IN (SELECT b FROM v) ORDER BY a LIMIT 3"
    assert sql_statement_patterns(nested) == {
        "select",
        "join",
        "where",
        "not",
        "in",
        "subquery",
        "order by",
        "limit",
    }
    assert sql_statement_patterns("SHOW TABLES") == {"show tables"}
    assert sql_statement_patterns("desc singer;") == {"describe"}


def test_bfcl_patterns_are_functions_and_consecutive_pairs():
    actions = ["[cd(folder='a'), mkdir(dir_name='b')]", "[]", "ls()", "not a call ("]
    assert bfcl_patterns(actions) == {"cd", "mkdir", "ls", "cd > mkdir", "mkdir > ls"}


def test_trajectory_patterns_read_the_parsed_actions_of_the_trajectorys_environment():
    trajectory = rollout("A", 0, 1.0, actions=("go to kitchen", "activate stove"))
    assert trajectory_patterns(trajectory) == {"go to ROOM", "activate stove"}
    sql = rollout("A", 0, 1.0, actions=("SELECT COUNT(*) FROM t", "submit"), env="intercode_sql")
    assert trajectory_patterns(sql) == {"select", "count"}
    with pytest.raises(ValueError, match="no action patterns"):
        patterns_for("webshop")
