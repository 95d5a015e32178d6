"""Rollout loop: scripted policies on the built-in environment, ETO's ReAct semantics, streaming and resume,
and a tiny real model through the KV-cache actor (greedy results independent of batching and grouping)."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx
from rollout_fixtures import smollm2_actor
from train_fixtures import TINY

from coevo_jax.data.chat_format import chat_format_for
from coevo_jax.data.records import ASSISTANT, USER, Message
from coevo_jax.data.stream import TrajectoryStream
from coevo_jax.envs import make
from coevo_jax.envs.base import Environment
from coevo_jax.models import Decoder
from coevo_jax.react import INVALID_FORMAT_OBSERVATION, format_reply, parse_action
from coevo_jax.rollout import ModelActor, RolloutConfig, ScriptedActor, TurnCodec, run_rollouts
from coevo_jax.rollout.actors import shared_prefix_length
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig
from coevo_jax.tokenization.training import train_tokenizer_for_trajectories

QUIET = dict(show_progress=False)


@pytest.fixture(scope="module")
def env():
    return make("builtin", num_train=40, num_test_seen=10, num_test_unseen=10)


def _factory():
    return make("builtin", num_train=40, num_test_seen=10, num_test_unseen=10)


def _expert_actor(env, **kwargs) -> ScriptedActor:
    def reply(request):
        step = env.expert_steps(request.task_id)[(len(request.messages) - 3) // 2]
        return format_reply(step.thought, step.action)

    return ScriptedActor(reply, **kwargs)


def test_parse_action_follows_eto():
    assert parse_action("Thought: go.\nAction: go to kitchen.") == "go to kitchen"
    assert parse_action("  Action: a\nAction: b!") == "a\nAction: b"  # everything after the first one
    assert parse_action("Thought: I am lost.") is None
    assert parse_action("Action:go") is None  # ETO's pattern needs the space


@pytest.mark.parametrize("num_groups", [1, 2])
def test_scripted_expert_replays_the_expert_trajectories(env, tmp_path, num_groups):
    tasks = env.tasks("test_unseen")
    actor = _expert_actor(env, num_slots=4, num_groups=num_groups)
    cfg = RolloutConfig(agent="target", iteration=1, samples_per_task=2, **QUIET)
    trajectories, stats = run_rollouts(_factory, actor, tasks, str(tmp_path / "t.jsonl"), cfg)
    experts = {t.task_id: t for t in env.expert_trajectories("test_unseen")}
    assert len(trajectories) == 2 * len(tasks) == stats.episodes
    assert len({t.traj_id for t in trajectories}) == len(trajectories)
    for trajectory in trajectories:
        assert trajectory.messages == experts[trajectory.task_id].messages
        assert trajectory.reward == 1.0 and trajectory.agent == "target" and trajectory.iteration == 1
        assert trajectory.extra["terminate_reason"] == "done"
    assert stats.mean_reward == 1.0 and stats.terminations == {"done": 2 * len(tasks)}
    on_disk = TrajectoryStream(tmp_path / "t.jsonl")
    assert sorted(t.traj_id for t in on_disk.trajectories) == sorted(t.traj_id for t in trajectories)
    on_disk.close()


def test_replies_without_an_action_spend_steps_until_the_budget(env, tmp_path):
    tasks = env.tasks("test_seen")[:3]
    actor = ScriptedActor(lambda request: "Thought: I will just think.", num_slots=2)
    trajectories, _ = run_rollouts(_factory, actor, tasks, str(tmp_path / "t.jsonl"), RolloutConfig(**QUIET))
    for trajectory in trajectories:
        budget = env.max_steps(trajectory.task_id)
        assert trajectory.extra["steps"] == budget == trajectory.extra["invalid_format"]
        assert trajectory.extra["terminate_reason"] == "max_steps" and trajectory.reward == 0.0
        assert set(trajectory.observations) == {INVALID_FORMAT_OBSERVATION}
        assert len(trajectory.actions) == budget and trajectory.messages[-1].role == ASSISTANT


def test_partial_rewards_and_fixed_budget(env, tmp_path):
    """Stopping the expert one step short gives a graded reward; `max_steps` overrides the budget."""

    def reply(request):
        steps = env.expert_steps(request.task_id)
        i = (len(request.messages) - 3) // 2
        return format_reply("next", steps[i].action if i < len(steps) - 1 else "look around")

    cfg = RolloutConfig(max_steps=20, **QUIET)
    trajectories, _ = run_rollouts(
        _factory, ScriptedActor(reply), env.tasks("test_seen"), str(tmp_path / "t.jsonl"), cfg
    )
    assert all(t.extra["steps"] == 20 and 0.0 < t.reward < 1.0 for t in trajectories)


class _FlakyEnv(Environment):
    """The built-in env, except that a step on its second task raises."""

    name = "builtin"

    def __init__(self):
        self.inner = _factory()
        self.bad = self.inner.tasks("test_seen")[1]

    instruction = property(lambda self: self.inner.instruction)
    splits = lambda self: self.inner.splits()  # noqa: E731
    tasks = lambda self, split: self.inner.tasks(split)  # noqa: E731
    max_steps = lambda self, task_id: self.inner.max_steps(task_id)  # noqa: E731
    expert_trajectories = lambda self, split, limit=None: self.inner.expert_trajectories(split, limit)  # noqa: E731

    def reset(self, task_id):
        self.task_id = task_id
        return self.inner.reset(task_id)

    def step(self, action):
        if self.task_id == self.bad:
            raise ConnectionError("simulator died")
        return self.inner.step(action)


def test_environment_errors_are_recorded_not_lost(env, tmp_path):
    tasks = env.tasks("test_seen")[:3]
    trajectories, stats = run_rollouts(
        _FlakyEnv, _expert_actor(env, num_slots=2), tasks, str(tmp_path / "t.jsonl"), RolloutConfig(**QUIET)
    )
    reasons = {t.task_id: t.extra["terminate_reason"] for t in trajectories}
    assert reasons[tasks[1]] == "env_error: ConnectionError: simulator died"
    assert reasons[tasks[0]] == reasons[tasks[2]] == "done" and stats.episodes == 3


def test_a_crash_loses_only_episodes_in_flight_and_a_rerun_resumes(env, tmp_path):
    path = str(tmp_path / "t.jsonl")
    tasks = env.tasks("train")[:12]
    calls = {"n": 0}
    expert = _expert_actor(env)

    def crashing(request):
        calls["n"] += 1
        if calls["n"] > 40:
            raise KeyboardInterrupt
        return expert.reply_fn(request)

    cfg = RolloutConfig(samples_per_task=2, **QUIET)
    with pytest.raises(KeyboardInterrupt):
        run_rollouts(_factory, ScriptedActor(crashing, num_slots=3), tasks, path, cfg)
    with open(path) as f:
        first = [json.loads(line) for line in f]
    assert 0 < len(first) < 24
    with open(path, "a") as f:  # a torn line from a crash in the middle of a write
        f.write('{"id": "half')
    trajectories, stats = run_rollouts(_factory, _expert_actor(env, num_slots=3), tasks, path, cfg)
    assert stats.skipped == len(first) and stats.episodes == 24 - len(first)
    assert len(trajectories) == 24 and len({t.traj_id for t in trajectories}) == 24
    with open(path) as f:
        assert len(f.read().splitlines()) == 24


# --- a tiny real model --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(env):
    return train_tokenizer_for_trajectories(env.expert_trajectories("train"), vocab_size=512)


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    cfg = TINY.replace(vocab_size=len(tokenizer))
    return Decoder(cfg, rngs=nnx.Rngs(0))


def test_turn_codec_pieces_equal_tokenizing_the_whole_conversation(env, tokenizer):
    codec = TurnCodec(tokenizer, chat_format_for(tokenizer))
    trajectory = env.expert_trajectories("test_seen")[0]
    messages = list(trajectory.messages) + [Message(USER, "Observation: fine.")]
    tokens = codec.prompt_tokens(messages[:3])
    for end in range(4, len(messages), 2):
        reply = messages[end - 1].content
        closed = end % 4 == 0  # alternate: the model wrote <|im_end|> itself, or the loop adds it
        tokens += codec.encode(reply) + (list(codec.end_of_turn_ids) if closed else [])
        tokens += codec.continuation_tokens(messages[: end + 1], reply_closed=closed)
    whole = codec.encode(codec.chat_format.prompt_text(messages))
    assert tokens == whole


def _model_actor(model, tokenizer, *, rows, groups, cache_len=512, sampling=None, seed=0, share_prefix=True):
    sampling = sampling or SamplingConfig(max_new_tokens=24)
    codec = TurnCodec(tokenizer, chat_format_for(tokenizer))
    stops = StopConfig(stop_ids=codec.end_of_turn_ids)
    sampler, params = Sampler.for_model(
        model, batch_size=rows, cache_len=cache_len, sampling=sampling, stops=stops
    )
    actor = ModelActor(
        sampler,
        params,
        codec,
        num_groups=groups,
        stop_strings=("Observation:",),
        seed=seed,
        model_name="tiny",
        share_prompt_prefix=share_prefix,
    )
    return actor, sampler


def test_tiny_model_greedy_rollouts_do_not_depend_on_batching(env, tokenizer, tiny_model, tmp_path):
    tasks = env.tasks("test_seen")[:6]
    cfg = RolloutConfig(max_steps=4, **QUIET)
    results = []
    for rows, groups in ((4, 2), (3, 1)):
        actor, sampler = _model_actor(tiny_model, tokenizer, rows=rows, groups=groups)
        trajectories, stats = run_rollouts(_factory, actor, tasks, str(tmp_path / f"{rows}.jsonl"), cfg)
        assert sampler.compilations <= 5  # prompt and observation buckets, one decode, the prefix copy
        assert stats.episodes == len(tasks) and actor.generated_tokens > 0
        results.append({t.task_id: t.messages for t in trajectories})
        for trajectory in trajectories:
            assert trajectory.extra["steps"] == 4 and trajectory.extra["terminate_reason"] == "max_steps"
            assert all("Observation:" not in a for a in trajectory.actions)
            assert trajectory.sampling["model"] == "tiny" and trajectory.sampling["temperature"] == 0.0
    assert results[0] == results[1]


def test_a_shared_prompt_prefix_encoded_once_plays_the_same_episodes(env, tokenizer, tiny_model, tmp_path):
    """Sampled episodes are the same whether new episodes copy the shared prompt prefix into the cache
    or prefill their whole prompt; the prefix is the environment's instructions, and the cache is windowed."""
    tasks = env.tasks("test_seen")[:6] + env.tasks("test_unseen")[:4]
    cfg = RolloutConfig(max_steps=4, **QUIET)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=24)
    episodes = {}
    for share in (True, False):
        actor, sampler = _model_actor(
            tiny_model,
            tokenizer,
            rows=3,
            groups=2,
            sampling=sampling,
            seed=4,
            share_prefix=share,
            cache_len=1024,  # windows of 512 and 1,024 slots
        )
        trajectories, _ = run_rollouts(_factory, actor, tasks, str(tmp_path / f"{share}.jsonl"), cfg)
        episodes[share] = [(t.task_id, t.reward, [m.content for m in t.messages]) for t in trajectories]
        if share:
            prompt = actor.codec.prompt_tokens(trajectories[0].messages[:3])
            assert 32 <= len(actor._prefix) < len(prompt) and prompt[: len(actor._prefix)] == actor._prefix
            assert sampler.window_buckets[0] < sampler.cache_len
        else:
            assert actor._prefix == []
    assert episodes[True] == episodes[False]


def test_shared_prefix_length_leaves_a_token_to_prefill():
    assert shared_prefix_length([1, 2, 3, 4], [1, 2, 3, 5]) == 3
    assert shared_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 2  # all of the shorter but its last token
    assert shared_prefix_length([7], [7]) == 0 and shared_prefix_length([], [1]) == 0


def test_tiny_model_cached_replies_equal_greedy_from_the_whole_context(env, tokenizer, tiny_model, tmp_path):
    """Each reply, decoded from the incrementally filled cache, is the greedy continuation of the whole
    context before it encoded at once (the tokens the episode actually saw)."""
    actor, _ = _model_actor(tiny_model, tokenizer, rows=1, groups=1)
    task = env.tasks("test_unseen")[0]
    trajectories, _ = run_rollouts(
        _factory, actor, [task], str(tmp_path / "t.jsonl"), RolloutConfig(max_steps=4, **QUIET)
    )
    tokens, spans = actor.context(0)
    assert len(spans) == 4 == trajectories[0].extra["steps"]
    assert tokens[: spans[0][0]] == actor.codec.prompt_tokens(trajectories[0].messages[:3])
    fresh, fresh_sampler = _model_actor(tiny_model, tokenizer, rows=1, groups=1)
    for start, end in spans:
        expected = fresh_sampler.generate(fresh.params, [tokens[:start]], jax.random.key(0))[0]
        assert tokens[start:end] == expected[: end - start]
    replies = [actor.codec.decode(tokens[s:e]) for s, e in spans]
    assert replies == list(trajectories[0].actions)


def test_context_limit_ends_episodes(env, tokenizer, tiny_model, tmp_path):
    actor, _ = _model_actor(tiny_model, tokenizer, rows=2, groups=1, cache_len=256)
    tasks = env.tasks("test_seen")[:2]
    trajectories, stats = run_rollouts(
        _factory, actor, tasks, str(tmp_path / "t.jsonl"), RolloutConfig(max_steps=50, **QUIET)
    )
    assert stats.terminations == {"context_limit": 2}
    assert all(t.extra["steps"] >= 1 for t in trajectories)


def test_tiny_model_samples_k_per_task_with_temperature(env, tokenizer, tiny_model, tmp_path):
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=16)
    actor, _ = _model_actor(tiny_model, tokenizer, rows=4, groups=2, sampling=sampling, seed=3)
    cfg = RolloutConfig(samples_per_task=3, max_steps=2, agent="failure", iteration=0, **QUIET)
    trajectories, stats = run_rollouts(
        _factory, actor, env.tasks("train")[:2], str(tmp_path / "t.jsonl"), cfg
    )
    assert stats.episodes == 6
    by_task = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t.actions)
    assert all(len(v) == 3 and len({tuple(a) for a in v}) > 1 for v in by_task.values())
    assert os.path.getsize(tmp_path / "t.jsonl") > 0
    assert np.isfinite(stats.mean_reward)


def test_sampled_rollouts_resumed_after_a_crash_equal_uninterrupted_ones(
    env, tokenizer, tiny_model, tmp_path
):
    """Each episode samples with keys of its own (task, sample, turn): a rerun that finishes a crashed
    rollout on other rows, in other batches, plays the remaining episodes as the uninterrupted run did."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)
    cfg = RolloutConfig(samples_per_task=2, max_steps=3, agent="target", iteration=1, **QUIET)
    tasks = env.tasks("train")[:5]
    actor, _ = _model_actor(tiny_model, tokenizer, rows=4, groups=2, sampling=sampling, seed=11)
    whole, _ = run_rollouts(_factory, actor, tasks, str(tmp_path / "whole.jsonl"), cfg)
    with open(tmp_path / "whole.jsonl") as f:
        finished_first = f.readlines()[:3]
    with open(tmp_path / "resumed.jsonl", "w") as f:  # what a crash after three episodes leaves
        f.writelines(finished_first + ['{"id": "torn'])
    actor, _ = _model_actor(tiny_model, tokenizer, rows=3, groups=1, sampling=sampling, seed=11)
    resumed, stats = run_rollouts(_factory, actor, tasks, str(tmp_path / "resumed.jsonl"), cfg)
    assert stats.skipped == 3 and stats.episodes == 7
    assert [t.traj_id for t in resumed] == [t.traj_id for t in whole]  # task, then sample order
    assert [t.messages for t in resumed] == [t.messages for t in whole]
    assert len({t.messages for t in whole}) == len(whole)  # sampled: no two episodes alike


@pytest.mark.slow
def test_smollm2_plays_batched_episodes_with_the_cache(env, smollm2_gguf_path, tmp_path):
    """The real SmolLM2-135M-Instruct (GGUF) through the whole loop: ChatML template, <|im_end|> stops."""
    actor, sampler, codec = smollm2_actor(smollm2_gguf_path, cache_len=1024, max_new_tokens=40)
    assert codec.tokenizer.convert_ids_to_tokens(list(codec.end_of_turn_ids)) == ["<|im_end|>"]
    tasks = env.tasks("test_seen")[:2]
    trajectories, stats = run_rollouts(
        _factory, actor, tasks, str(tmp_path / "t.jsonl"), RolloutConfig(max_steps=3, **QUIET)
    )
    assert (
        stats.episodes == 2 and sampler.compilations <= 8
    )  # prefill per (chunk, window) bucket, decode per window, prefix copy
    for trajectory in trajectories:
        assert trajectory.extra["terminate_reason"] in ("max_steps", "done")
        assert all(len(a) > 0 for a in trajectory.actions)
    replies = sorted(len(actor.context(slot)[1]) for slot in range(2))
    assert replies == sorted(t.extra["steps"] for t in trajectories)


def test_each_reply_records_the_score_after_it_and_the_state_it_was_written_in(env, tmp_path):
    """GiGPO's inputs: a reply without an action leaves the world (and its state digest) as it was; equal
    play from the same task gives equal states; an environment without `state_key` is keyed by its
    observations, so every step moves it on."""

    def reply(request):
        turn = (len(request.messages) - 3) // 2
        if turn == 0:
            return "Thought: I will just think."
        step = env.expert_steps(request.task_id)[turn - 1]
        return format_reply(step.thought, step.action)

    tasks = env.tasks("test_seen")[:3]
    cfg = RolloutConfig(samples_per_task=2, **QUIET)
    trajectories, _ = run_rollouts(_factory, ScriptedActor(reply), tasks, str(tmp_path / "t.jsonl"), cfg)
    replay = _factory()
    for t in trajectories:
        scores, states = t.extra["step_scores"], t.extra["step_states"]
        assert len(scores) == len(states) == t.extra["steps"] and scores[-1] == t.reward == 1.0
        assert states[0] == states[1] != states[2]  # the thought alone changed nothing
        replay.reset(t.task_id)
        expected = [0.0] + [replay.step(step.action)[1] for step in env.expert_steps(t.task_id)][:-1]
        assert scores[:-1] == expected
    by_task = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t.extra["step_states"])
    assert all(a == b for a, b in by_task.values()) and len({a[0] for a, _ in by_task.values()}) == 3

    class Unkeyed(_FlakyEnv):
        bad = None

        def __init__(self):
            self.inner = _factory()

    unkeyed, _ = run_rollouts(Unkeyed, ScriptedActor(reply), tasks[:1], str(tmp_path / "u.jsonl"), cfg)
    states = unkeyed[0].extra["step_states"]
    assert len(set(states)) == len(states)  # the observation history grows every step
    assert states == unkeyed[1].extra["step_states"]
