"""The host-side rollout loop: many episodes in flight, environments stepped while the device decodes.

Slots (one environment instance each) are split into the actor's G groups. The loop is a pipeline over the
groups: it submits group g's decode (asynchronous), then collects the replies of the previous group and
hands them to a thread pool that parses the actions and steps that group's environments. With G = 2 the
environments of one half step while the device decodes the other half; with G = 1 the two alternate.
A slot whose episode ends takes the next (task, sample) from the queue at once, in the same pool job.

ETO's ReAct semantics (`coevo_jax.react`): a reply without `Action: ` gets the "Invalid format"
observation and still spends a step; an episode ends when the environment says done (reward 1.0 for the
built-in tasks), when it has used the task's step budget, or when the policy's context is full. The
trajectory's reward is the environment's last score, and its `extra["metrics"]` the environment's
`episode_metrics()` (when it has any). Per reply, `extra["step_scores"]` holds the score after it and
`extra["step_states"]` a digest of the state it was written in (`Environment.state_key`, else the
observations since `reset`): what GiGPO's step groups compare. An actor that records its tokens (`ModelActor.trace`) has them
stored with the trajectory (`Trajectory.tokens`). Finished episodes are streamed to a JSONL file;
episodes already in that file are skipped, so a rerun after a crash continues where it stopped.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

from coevo_jax.data.records import ASSISTANT, USER, Message, TokenTrace, Trajectory
from coevo_jax.data.stream import TrajectoryStream
from coevo_jax.envs.base import Environment, prompt_messages
from coevo_jax.react import INVALID_FORMAT_OBSERVATION, format_observation, parse_action
from coevo_jax.rollout.actors import TurnRequest

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """Who is sampling, how often per task, and the host resources of the loop."""

    agent: str = "target"  # expert | target | failure | other
    iteration: int | None = None
    samples_per_task: int = 1  # k: episodes per instruction
    env_workers: int = 4  # threads stepping environments
    max_steps: int | None = None  # overrides every task's own budget when set
    show_progress: bool = True


@dataclasses.dataclass
class RolloutStats:
    """Counts and timings of one `run_rollouts` call (host waits measure the pipeline's balance)."""

    episodes: int = 0
    skipped: int = 0
    steps: int = 0
    reward_sum: float = 0.0
    successes: int = 0
    wall_seconds: float = 0.0
    wait_device_seconds: float = 0.0  # host blocked on replies
    wait_env_seconds: float = 0.0  # host blocked on environment steps
    terminations: dict = dataclasses.field(default_factory=collections.Counter)

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / max(self.episodes, 1)

    @property
    def episodes_per_second(self) -> float:
        return self.episodes / max(self.wall_seconds, 1e-9)


@dataclasses.dataclass
class _Episode:
    task_id: str
    sample: int
    max_steps: int
    messages: list[Message]
    steps: int = 0
    reward: float = 0.0
    invalid_format: int = 0
    reason: str | None = None
    state: str = ""  # digest of the current state (`state_digest`)
    step_scores: list[float] = dataclasses.field(default_factory=list)
    step_states: list[str] = dataclasses.field(default_factory=list)


def state_digest(env: Environment, previous: str, observation: str) -> str:
    """A short digest of the environment's state: of `env.state_key()`, or where that is None of the
    observations since reset (`previous` is the digest before `observation`)."""
    key = env.state_key()
    text = f"state\0{key}" if key is not None else f"history\0{previous}\0{observation}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def trajectory_id(env_name: str, task_id: str, cfg: RolloutConfig, sample: int) -> str:
    iteration = "-" if cfg.iteration is None else cfg.iteration
    return f"{env_name}/{task_id}/{cfg.agent}/it{iteration}/s{sample}"


class _Slots:
    """The environments, episodes and task queue; `advance` runs in the pool (one job per slot at a time).

    `trace(slot)` is the actor's record of the slot's episode tokens (`ModelActor.trace`), or None."""

    def __init__(
        self,
        envs: list[Environment],
        queue: collections.deque,
        cfg: RolloutConfig,
        sampling: dict,
        trace: Callable[[int], TokenTrace | None] = lambda slot: None,
    ):
        self.envs, self.queue, self.cfg, self.sampling, self.trace = envs, queue, cfg, sampling, trace
        self.episodes: list[_Episode | None] = [None] * len(envs)
        self.lock = threading.Lock()

    def _next_task(self) -> tuple[str, int] | None:
        with self.lock:
            return self.queue.popleft() if self.queue else None

    def _start(self, slot: int) -> TurnRequest | None:
        task = self._next_task()
        if task is None:
            return None
        env, (task_id, sample) = self.envs[slot], task
        budget = self.cfg.max_steps or env.max_steps(task_id)
        task_text = env.reset(task_id)
        episode = _Episode(task_id, sample, budget, prompt_messages(env, task_text))
        episode.state = state_digest(env, "", task_text)
        self.episodes[slot] = episode
        return TurnRequest(tuple(episode.messages), new_episode=True, task_id=task_id, sample=sample)

    def _step(self, slot: int, episode: _Episode, reply: str | None) -> None:
        if reply is None:
            episode.reason = "context_limit"
            return
        episode.messages.append(Message(ASSISTANT, reply))
        episode.steps += 1
        episode.step_states.append(episode.state)
        action = parse_action(reply)
        done = False
        if action is None:
            episode.invalid_format += 1
            observation = INVALID_FORMAT_OBSERVATION
        else:
            try:
                text, reward, done, _ = self.envs[slot].step(action)
            except Exception as error:  # a broken environment ends the episode, recorded with the reason
                log.exception("%s task %s: environment step failed", self.envs[slot].name, episode.task_id)
                episode.reason = f"env_error: {type(error).__name__}: {error}"
                return
            episode.reward = float(reward)
            observation = format_observation(text, self.envs[slot].observation_prefix)
        episode.step_scores.append(episode.reward)
        episode.state = state_digest(self.envs[slot], episode.state, observation)
        if done:
            episode.reason = "done"
        elif episode.steps >= episode.max_steps:
            episode.reason = "max_steps"
        else:
            episode.messages.append(Message(USER, observation))

    def advance(self, slot: int, reply: str | None, has_reply: bool):
        """Applies the slot's reply (if any); returns (finished trajectory or None, next request or None)."""
        episode, finished = self.episodes[slot], None
        if episode is not None and has_reply:
            self._step(slot, episode, reply)
            if episode.reason is not None:
                finished = self._trajectory(slot, episode)
                self.episodes[slot] = None
        if self.episodes[slot] is None:
            return finished, self._start(slot)
        episode = self.episodes[slot]
        return finished, TurnRequest(
            tuple(episode.messages), new_episode=False, task_id=episode.task_id, sample=episode.sample
        )

    def _trajectory(self, slot: int, episode: _Episode) -> Trajectory:
        env = self.envs[slot]
        metrics = {} if episode.reason.startswith("env_error") else env.episode_metrics()
        return Trajectory(
            traj_id=trajectory_id(env.name, episode.task_id, self.cfg, episode.sample),
            task_id=episode.task_id,
            messages=tuple(episode.messages),
            reward=episode.reward,
            agent=self.cfg.agent,
            prompt_len=3,
            env=env.name,
            iteration=self.cfg.iteration,
            sampling={**self.sampling, "sample": episode.sample},
            extra={
                "steps": episode.steps,
                "terminate_reason": episode.reason,
                "invalid_format": episode.invalid_format,
                "step_scores": episode.step_scores,
                "step_states": episode.step_states,
                **({"metrics": metrics} if metrics else {}),
            },
            tokens=self.trace(slot) if episode.reason != "context_limit" else None,
        )


def run_rollouts(
    env_factory: Callable[[], Environment],
    actor,
    task_ids: Sequence[str],
    output_path: str,
    cfg: RolloutConfig = RolloutConfig(),
) -> tuple[list[Trajectory], RolloutStats]:
    """Plays `cfg.samples_per_task` episodes of every task with `actor`, streaming them to `output_path`.

    Returns all trajectories of this (tasks, agent, iteration) in the file, earlier runs' included, in task
    and sample order (not the order they finished in, which a resumed run changes), and the stats of this
    call. `env_factory` makes one environment per actor slot.
    """
    stats, start_time = RolloutStats(), time.perf_counter()
    with TrajectoryStream(output_path) as stream:
        envs = [env_factory() for _ in range(actor.num_slots)]
        env_name = envs[0].name
        wanted = [(t, s) for t in task_ids for s in range(cfg.samples_per_task)]
        done_ids = stream.done_ids
        queue = collections.deque(
            w for w in wanted if trajectory_id(env_name, w[0], cfg, w[1]) not in done_ids
        )
        stats.skipped = len(wanted) - len(queue)
        slots = _Slots(envs, queue, cfg, actor.sampling_info(), getattr(actor, "trace", lambda slot: None))
        progress = tqdm(
            total=len(wanted),
            initial=stats.skipped,
            disable=not cfg.show_progress,
            desc=f"{env_name} {cfg.agent} rollouts",
            unit="episode",
        )
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=cfg.env_workers) as pool:
                _pipeline(actor, slots, pool, stream, stats, progress)
        finally:
            progress.close()
            for env in envs:
                env.close()
        by_id = {t.traj_id: t for t in stream.trajectories}
        wanted_ids = [trajectory_id(env_name, t, cfg, s) for t, s in wanted]
        trajectories = [by_id[i] for i in wanted_ids if i in by_id]
    stats.wall_seconds = time.perf_counter() - start_time
    return trajectories, stats


def _pipeline(actor, slots: _Slots, pool, stream: TrajectoryStream, stats: RolloutStats, progress) -> None:
    rows = actor.num_slots // actor.num_groups
    group_slots = [range(g * rows, (g + 1) * rows) for g in range(actor.num_groups)]
    env_jobs = [{s: pool.submit(slots.advance, s, None, False) for s in group} for group in group_slots]
    pending = [None] * actor.num_groups
    while any(env_jobs) or any(p is not None for p in pending):
        for group in range(actor.num_groups):
            requests = {}
            waited = time.perf_counter()
            for slot, job in env_jobs[group].items():
                finished, request = job.result()
                if finished is not None:
                    _record(finished, stream, stats, progress)
                if request is not None:
                    requests[slot] = request
            stats.wait_env_seconds += time.perf_counter() - waited
            env_jobs[group] = {}
            if requests:
                pending[group] = (actor.submit(requests), set(requests))
            previous = (group - 1) % actor.num_groups
            if pending[previous] is not None:
                replies_future, asked = pending[previous]
                waited = time.perf_counter()
                replies = replies_future.result()
                stats.wait_device_seconds += time.perf_counter() - waited
                pending[previous] = None
                env_jobs[previous] = {s: pool.submit(slots.advance, s, replies[s], True) for s in asked}


def _record(trajectory: Trajectory, stream: TrajectoryStream, stats: RolloutStats, progress) -> None:
    stream.write(trajectory)
    stats.episodes += 1
    stats.steps += trajectory.extra["steps"]
    stats.reward_sum += trajectory.reward
    stats.successes += trajectory.reward >= 1.0
    stats.terminations[trajectory.extra["terminate_reason"]] += 1
    progress.update(1)
    progress.set_postfix(
        mean_reward=f"{stats.mean_reward:.3f}", success=f"{stats.successes / stats.episodes:.2f}"
    )
