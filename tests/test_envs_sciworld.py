"""ScienceWorld with its JVM: gold-path experts reaching 1.0 on every task type, ETO's reward, determinism
across JVMs, recovery from killed and hung JVMs, no JVM left behind, and the rollout loop with the scripted
expert and with the real SmolLM2-135M-Instruct. What needs no JVM is in `test_envs_sciworld_data.py`."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from rollout_fixtures import smollm2_actor

from coevo_jax.envs.sciworld import SciWorldEnv
from coevo_jax.envs.sciworld.data import split_task_id
from coevo_jax.envs.sciworld.supervisor import ReplayDiverged, SimulatorFailed, SupervisedSimulator
from coevo_jax.react import INVALID_FORMAT_OBSERVATION, format_reply
from coevo_jax.rollout import PendingReplies, RolloutConfig, ScriptedActor, run_rollouts

QUIET = dict(show_progress=False)
FIND_ANIMAL = "task-3-find-animal/0"  # short gold path (10 actions), in the train split


def _task_types(env) -> list[str]:
    """The first train variation of each of the 24 task types in ETO's splits."""
    first = {}
    for task_id in env.tasks("train"):
        first.setdefault(split_task_id(task_id)[0], task_id)
    return list(first.values())


def _play(env, task_id, actions):
    """(observation, reward, done) of each action from a fresh episode."""
    env.reset(task_id)
    return [env.step(action)[:3] for action in actions]


def _scheduler_state(stat_path: str) -> str | None:
    """The state letter of a /proc `stat` file (R, S, T, Z, ...), None once the process or thread is gone."""
    try:
        with open(stat_path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _process_gone(pid: int) -> bool:
    """True when the process no longer runs (exited, or a zombie waiting for its reaper)."""
    return _scheduler_state(f"/proc/{pid}/stat") in (None, "Z", "X")


def _wait_gone(pid: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _process_gone(pid):
            return True
        time.sleep(0.1)
    return False


def _thread_states(pid: int) -> list[str]:
    """The scheduler state letter of each of the process's threads ([] once it is gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    states = (_scheduler_state(f"/proc/{pid}/task/{tid}/stat") for tid in tids)
    return [state for state in states if state is not None]


def _stop(pid: int, seconds: float = 15.0) -> None:
    """SIGSTOPs the process and waits until every thread has stopped: kill() returns before they do, and a
    thread still running can answer one more call (seen in CI: a 'hung' JVM answered a step in 4 ms)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + seconds
    while not all(state in "Tt" for state in _thread_states(pid) or ["R"]):
        assert time.monotonic() < deadline, f"pid {pid} still runs {seconds:g} s after SIGSTOP"
        time.sleep(0.01)


# --- the simulator -----------------------------------------------------------------------------------------


def test_a_missing_java_is_a_clear_error():
    env = SciWorldEnv(java="/nonexistent/java")
    with pytest.raises(
        SimulatorFailed, match="cannot run '/nonexistent/java'.*Java >= 11.*default-jre-headless"
    ):
        env.reset(FIND_ANIMAL)


@pytest.fixture(scope="module")
def envs():
    """Two environments, two JVMs (closed at the end of the module)."""
    pair = (SciWorldEnv(), SciWorldEnv())
    yield pair
    for env in pair:
        env.close()


@pytest.fixture(scope="module")
def gold(envs):
    """Gold-path expert results of one variation of each task type, half made in each JVM, in parallel."""
    tasks = _task_types(envs[0])

    def make(env, part):
        return [env.expert_result(task_id) for task_id in part]

    with ThreadPoolExecutor(2) as pool:
        halves = list(pool.map(make, envs, (tasks[0::2], tasks[1::2])))
    return {r.task_id: (index, r) for index, half in enumerate(halves) for r in half}


@pytest.mark.slow
def test_gold_paths_of_every_task_type_reach_full_reward(gold):
    assert len(gold) == 24
    failures = {task_id: r.reason for task_id, (_, r) in gold.items() if not r.ok}
    assert not failures
    for _, result in gold.values():
        trajectory = result.trajectory
        assert trajectory.reward == 1.0 and trajectory.agent == "expert" and trajectory.env == "sciworld"
        assert trajectory.messages[2].content.startswith("Task Description:\nYour task is to")
        assert len(trajectory.actions) == result.steps > 0
        assert all(a.startswith("Thought: ") and "\nAction: " in a for a in trajectory.actions)
    shortened = [r for _, r in gold.values() if "Action: teleport to" in " ".join(r.trajectory.actions)]
    assert len(shortened) >= 18  # most gold paths still reach 1.0 with their walks made teleports


@pytest.mark.slow
def test_same_actions_give_the_same_observations_in_another_jvm(envs, gold):
    """Each task is replayed in the JVM that did not record it (a different history of loaded tasks)."""

    def replay(env, items):
        mismatches = []
        for task_id, trajectory in items:
            actions = [a.split("\nAction: ", 1)[1] for a in trajectory.actions]
            observed = [o for o, _, _ in _play(env, task_id, actions)]
            if ["Observation: " + o for o in observed[:-1]] != list(trajectory.observations):
                mismatches.append(task_id)
        return mismatches

    parts = [[(t, r.trajectory) for t, (i, r) in gold.items() if i == owner] for owner in (1, 0)]
    with ThreadPoolExecutor(2) as pool:
        assert sum(pool.map(replay, envs, parts), []) == []


@pytest.mark.slow
def test_reward_is_the_best_score_seen_clamped_like_eto(envs):
    """Our rewards against the scores of PyPI scienceworld's own `ScienceWorldEnv` on the same actions."""
    from scienceworld import ScienceWorldEnv

    env = envs[0]
    gold_actions = env.gold_actions(FIND_ANIMAL)
    actions = gold_actions[:5] + ["focus on axe"]  # to the animals outside, then fail the task
    ours = _play(env, FIND_ANIMAL, actions)
    reference = ScienceWorldEnv("", envStepLimit=1000)
    try:
        reference.load("find-animal", 0, "easy")
        reference.reset()
        scores = [reference.step(a)[3]["score"] for a in actions]
    finally:
        reference.close()
        reference._gateway.java_process.kill()
    assert scores[0] > 0 and max(scores) < 100 and scores[-1] == -100 and len(set(scores)) > 2
    best = [max(scores[: i + 1]) for i in range(len(scores))]
    assert [r for _, r, _ in ours] == pytest.approx([min(max(b, 0), 100) / 100 for b in best], abs=0.005)
    assert [d for _, _, d in ours] == [False] * (len(actions) - 1) + [True]  # a failed task ends the episode
    with pytest.raises(RuntimeError, match="is over"):
        env.step("look around")


@pytest.mark.slow
def test_unknown_variations_are_refused_and_ids_outside_the_splits_accepted(envs):
    env = envs[0]
    with pytest.raises(ValueError, match="task-1-boil/999.*30 variations"):
        env.reset("task-1-boil/999")
    known = {t for s in env.splits() for t in env.tasks(s)}
    outside = next(f"task-1-boil/{v}" for v in range(30) if f"task-1-boil/{v}" not in known)
    assert "Your task is to boil" in env.reset(outside)


@pytest.mark.slow
def test_a_killed_jvm_is_replaced_and_the_episode_replayed_transparently(gold):
    task_id = "task-1-boil/4" if "task-1-boil/4" in gold else next(iter(gold))
    trajectory = gold[task_id][1].trajectory
    actions = [a.split("\nAction: ", 1)[1] for a in trajectory.actions]
    env = SciWorldEnv()
    try:
        env.reset(task_id)
        observations = []
        for index, action in enumerate(actions):
            if index in (5, 12):  # twice, to show a replacement JVM is supervised too
                pid = env.simulator.jvm.pid
                os.kill(pid, signal.SIGKILL)
                assert _wait_gone(pid)
            observation, reward, done, _ = env.step(action)
            observations.append("Observation: " + observation)
        assert observations[:-1] == list(trajectory.observations) and reward == 1.0 and done
        assert env.simulator.restarts == 2
    finally:
        env.close()


@pytest.mark.slow
def test_a_replay_that_differs_from_the_episode_is_an_error_not_a_silent_new_state():
    env = SciWorldEnv()
    try:
        env.reset(FIND_ANIMAL)
        for action in ("look around", "teleport to kitchen", "look around"):
            env.step(action)
        episode = env.simulator._episode
        episode.outcomes[1] = dataclasses.replace(
            episode.outcomes[1], observation="You teleport to the moon."
        )
        os.kill(env.simulator.jvm.pid, signal.SIGKILL)
        with pytest.raises(ReplayDiverged, match="at step 2 \\('teleport to kitchen'\\).*the moon"):
            env.step("look around")
        with pytest.raises(RuntimeError, match="step before a task was loaded"):
            env.step("look around")
        assert "find a(n) animal" in env.reset(FIND_ANIMAL)  # a new episode works
    finally:
        env.close()


@pytest.mark.slow
def test_a_hung_jvm_times_out_is_killed_and_the_step_retried():
    env = SciWorldEnv(step_timeout_s=2.0)
    try:
        expected = _play(env, FIND_ANIMAL, ["look around", "teleport to kitchen", "look around"])
        env.reset(FIND_ANIMAL)
        env.step("look around")
        env.step("teleport to kitchen")
        hung = env.simulator.jvm.pid
        _stop(hung)  # the JVM stops answering, its socket stays open
        start = time.monotonic()
        assert env.step("look around")[:3] == expected[2]
        assert 2.0 <= time.monotonic() - start < 30 and env.simulator.restarts == 1
        assert _wait_gone(hung) and env.simulator.jvm.pid != hung
    finally:
        env.close()


class _HangingSimulator(SupervisedSimulator):
    """Once `hang` is set, every JVM it uses is stopped before each call: a JVM that keeps failing."""

    hang = False
    pids: list[int]

    @property
    def jvm(self):
        jvm = super().jvm
        self.pids.append(jvm.pid)
        if self.hang and jvm.alive:
            _stop(jvm.pid)
        return jvm


class _HangingEnv(SciWorldEnv):
    """A ScienceWorld env whose JVMs hang for good once an episode of `BAD` has started."""

    BAD = "task-3-find-plant/70"
    pids: list[int] = []

    def __init__(self):
        super().__init__(step_timeout_s=2.0, load_timeout_s=8.0)
        simulator = self.simulator
        self.simulator = _HangingSimulator(
            simulator.options, load_timeout_s=8.0, step_timeout_s=2.0, label=simulator.label
        )
        self.simulator.pids = _HangingEnv.pids

    def reset(self, task_id):
        self.simulator.hang = False
        description = super().reset(task_id)
        self.simulator.hang = task_id == self.BAD
        return description


@pytest.mark.slow
def test_a_jvm_that_keeps_failing_is_an_env_error_in_the_rollout_loop(envs, tmp_path):
    tasks = [FIND_ANIMAL, _HangingEnv.BAD, "task-6-lifespan-(longest-lived)/2"]
    expert = {task_id: envs[0].expert_steps(task_id) for task_id in tasks}

    def reply(request):
        step = expert[request.task_id][(len(request.messages) - 3) // 2]
        return format_reply(step.thought, step.action)

    trajectories, stats = run_rollouts(
        _HangingEnv,
        ScriptedActor(reply, num_slots=2),
        tasks,
        str(tmp_path / "t.jsonl"),
        RolloutConfig(**QUIET),
    )
    reasons = {t.task_id: t.extra["terminate_reason"] for t in trajectories}
    assert stats.episodes == 3 and reasons[FIND_ANIMAL] == reasons[tasks[2]] == "done"
    bad = reasons[_HangingEnv.BAD]
    assert bad.startswith("env_error: SimulatorFailed: sciworld: step 1 ('") and "failed twice" in bad
    assert "gave no answer in 2 s" in bad and "after a JVM restart" in bad
    assert all(_wait_gone(pid) for pid in set(_HangingEnv.pids))  # closed by run_rollouts, stopped ones too


_CHILD = """
import sys
from coevo_jax.envs.sciworld import SciWorldEnv
env = SciWorldEnv()
env.reset("task-3-find-animal/0")
print(env.simulator.jvm.pid, flush=True)
sys.stdin.read()  # until the test closes stdin (then exits normally, without env.close()) or kills it
"""


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_no_jvm_outlives_close_or_its_python_process(ending):
    if ending == "exit":
        env = SciWorldEnv()
        env.reset(FIND_ANIMAL)
        pid = env.simulator.jvm.pid
        env.close()
        assert _process_gone(pid)  # close() reaps it at once
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pid = int(child.stdout.readline())
    assert not _process_gone(pid)
    if ending == "sigkill":
        child.kill()  # no atexit hooks run: the JVM must notice its stdin closing
    else:
        child.stdin.close()
    child.wait(timeout=60)
    assert _wait_gone(pid)


# --- the rollout loop --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_scripted_expert_reaches_full_reward_through_run_rollouts(envs, gold, tmp_path):
    experts = {task_id: r.trajectory for task_id, (_, r) in gold.items()}
    # Some gold paths are longer than ETO's step limit (e.g. 41 actions where the limit is 30).
    tasks = [t for t in experts if len(experts[t].actions) <= envs[0].max_steps(t)][:4]

    def reply(request):
        return experts[request.task_id].actions[(len(request.messages) - 3) // 2]

    cfg = RolloutConfig(agent="target", iteration=0, **QUIET)
    trajectories, stats = run_rollouts(
        SciWorldEnv, ScriptedActor(reply, num_slots=2), tasks, str(tmp_path / "t"), cfg
    )
    assert stats.episodes == 4 and stats.mean_reward == 1.0 and stats.terminations == {"done": 4}
    for trajectory in trajectories:
        assert trajectory.messages == experts[trajectory.task_id].messages


class _ActingModel:
    """The model's replies, with 'Action: ' put before the first line of a reply that has none.

    SmolLM2-135M-Instruct was never tuned on ETO's format and, zero-shot, writes no 'Action: ' at all; so that
    its own words still reach the simulator (and ScienceWorld's observations its KV cache), such a reply's
    first line is sent as the action.
    """

    def __init__(self, actor):
        self.actor, self.num_slots, self.num_groups = actor, actor.num_slots, actor.num_groups

    def sampling_info(self):
        return self.actor.sampling_info()

    def submit(self, requests):
        pending = self.actor.submit(requests)

        def finish():
            return {
                slot: r if r is None or "Action: " in r else "Action: " + (r.strip().splitlines() or [""])[0]
                for slot, r in pending.result().items()
            }

        return PendingReplies(finish)


@pytest.mark.slow
def test_smollm2_plays_sciworld_episodes_through_run_rollouts(smollm2_gguf_path, tmp_path):
    """The real SmolLM2-135M-Instruct (GGUF) plays ScienceWorld through the whole loop, two slots at once."""
    actor, sampler, _ = smollm2_actor(smollm2_gguf_path, cache_len=2048, max_new_tokens=40)
    envs = []

    def factory():
        envs.append(SciWorldEnv())
        return envs[-1]

    tasks = [FIND_ANIMAL, "task-1-boil/4"]
    trajectories, stats = run_rollouts(
        factory, _ActingModel(actor), tasks, str(tmp_path / "t.jsonl"), RolloutConfig(max_steps=3, **QUIET)
    )
    assert stats.episodes == 2 and actor.generated_tokens > 0
    assert sampler.compilations <= 8  # prefill per (chunk, window) bucket, decode per window, prefix copy
    assert sum(env.timings.steps for env in envs) == stats.steps == 6  # every reply went to ScienceWorld
    for trajectory in trajectories:
        assert trajectory.env == "sciworld" and trajectory.messages[2].content.startswith("Task Description:")
        assert trajectory.extra["terminate_reason"] == "max_steps" and 0.0 <= trajectory.reward <= 1.0
        observations = [m.content for m in trajectory.messages[4::2]]
        assert len(observations) == 2 and all(o.startswith("Observation: ") for o in observations)
        assert INVALID_FORMAT_OBSERVATION not in observations
    replies = sorted(len(actor.context(slot)[1]) for slot in range(2))
    assert replies == [3, 3]  # the observations went into the model's context
