"""GRPO's data path: the sampler's log-probs of the tokens it draws, the actor's token trace stored with each
trajectory (records round trip), and GRPO batches built from exactly those ids with a loss mask over exactly
the sampled tokens, whose log-probs the trainer reproduces (ratio 1 before any update)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from seeds import fresh_seed
from train_fixtures import TINY

from coevo_jax.data.chat_format import chat_format_for
from coevo_jax.data.grpo_rows import collate_grpo, sampled_sequence
from coevo_jax.data.json_files import DataFormatError
from coevo_jax.data.record_reader import parse_record, read_trajectories
from coevo_jax.data.records import Message, TokenTrace, Trajectory
from coevo_jax.envs import make
from coevo_jax.models import Decoder
from coevo_jax.rollout import ModelActor, RolloutConfig, ScriptedActor, TurnCodec, run_rollouts
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig, sample_with_logprobs
from coevo_jax.tokenization.training import train_tokenizer_for_trajectories
from coevo_jax.train.objectives import token_logprobs

TEMPERATURE = 0.9


def _factory():
    return make("builtin", num_train=12, num_test_seen=2, num_test_unseen=2)


def ref_log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=TEMPERATURE),
        SamplingConfig(temperature=1.3, top_k=5),
        SamplingConfig(temperature=0.8, top_p=0.7),
        SamplingConfig(),  # greedy: the log-prob under softmax(logits)
    ],
    ids=["temperature", "top_k", "top_p", "greedy"],
)
def test_sampled_log_probs_are_of_the_distribution_sampled_from(cfg):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((64, 40)) * 3).astype(np.float32)
    keys = jax.random.split(jax.random.key(seed % (1 << 30)), 64)
    tokens, logps = (np.asarray(x) for x in sample_with_logprobs(jnp.asarray(logits), keys, cfg))
    z = logits.astype(np.float64) / (cfg.temperature or 1.0)
    kept = np.ones_like(z, bool)
    if cfg.top_k:
        kept = z >= np.sort(z, -1)[:, -cfg.top_k][:, None]
    if cfg.top_p < 1.0:
        order = np.argsort(-z, -1)
        probs = np.exp(ref_log_softmax(np.take_along_axis(z, order, -1)))
        before = np.cumsum(probs, -1) - probs
        np.put_along_axis(kept, order, before < cfg.top_p, -1)
    expected = ref_log_softmax(np.where(kept, z, -np.inf))[np.arange(64), tokens]
    assert kept[np.arange(64), tokens].all(), f"seed={seed}"
    np.testing.assert_allclose(logps, expected, rtol=1e-5, atol=1e-5, err_msg=f"seed={seed}")
    if cfg.greedy:
        assert (tokens == logits.argmax(-1)).all()


# --- a tiny model through the rollout loop ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer_for_trajectories(_factory().expert_trajectories("train"), vocab_size=512)


@pytest.fixture(scope="module")
def model(tokenizer):
    return Decoder(TINY.replace(vocab_size=len(tokenizer)), rngs=nnx.Rngs(0))


def _actor(model, tokenizer, *, seed, max_new_tokens=24, temperature=TEMPERATURE):
    codec = TurnCodec(tokenizer, chat_format_for(tokenizer))
    sampler, params = Sampler.for_model(
        model,
        batch_size=3,
        cache_len=512,
        sampling=SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens),
        stops=StopConfig(stop_ids=codec.end_of_turn_ids),
    )
    # "e" as a stop string cuts most replies in the middle of the tokens the model sampled.
    return ModelActor(sampler, params, codec, stop_strings=("Observation:", "e"), seed=seed), codec


@pytest.fixture(scope="module")
def rollouts(model, tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("grpo") / "t.jsonl"
    actor, codec = _actor(model, tokenizer, seed=fresh_seed() % 1000)
    cfg = RolloutConfig(samples_per_task=2, max_steps=3, agent="target", iteration=1, show_progress=False)
    trajectories, _ = run_rollouts(_factory, actor, _factory().tasks("train")[:3], str(path), cfg)
    return trajectories, path, codec


def test_every_reply_keeps_its_sampled_tokens_and_log_probs(rollouts):
    trajectories, path, codec = rollouts
    assert len(trajectories) == 6
    cut = 0
    for t in trajectories:
        trace = t.tokens
        assert trace is not None and len(trace.reply_spans) == len(t.actions) == t.extra["steps"]
        assert list(trace.ids[: trace.reply_spans[0][0]]) == codec.prompt_tokens(t.messages[: t.prompt_len])
        for (start, end), action in zip(trace.reply_spans, t.actions, strict=True):
            assert codec.decode(trace.ids[start:end]) == action  # the reply text is exactly these tokens
            closed = end > start and trace.ids[end - 1] in codec.end_of_turn_ids
            cut += not closed
        assert len(trace.logprobs) == trace.num_reply_tokens and all(lp <= 0.0 for lp in trace.logprobs)
    assert cut > 0  # replies cut at a stop string or at max_new_tokens: no sampled end-of-turn token
    by_id = lambda items: sorted(items, key=lambda t: t.traj_id)
    assert by_id(read_trajectories(path)) == by_id(trajectories)  # token traces included


def test_grpo_batches_hold_the_sampled_ids_and_mask_exactly_the_sampled_tokens(rollouts, model, tokenizer):
    trajectories, _, _ = rollouts
    examples = [sampled_sequence(t, advantage=0.5, max_length=512) for t in trajectories]
    batch = collate_grpo(examples, length=512, batch_size=8, pad_id=tokenizer.pad_token_id)
    for row, t in enumerate(trajectories):
        trace, n = t.tokens, len(t.tokens.ids)
        assert batch["input_ids"][row, :n].tolist() == list(trace.ids)  # no re-tokenisation
        # a trajectory whose replies the stop string "e" all cut to nothing has no sampled positions
        sampled_positions = [p for start, end in trace.reply_spans for p in range(start, end)]
        targets_at = np.array(sampled_positions, np.int64) - 1
        # loss_mask[t] marks targets[t] = ids[t + 1]: exactly the sampled tokens, nothing else
        assert (np.flatnonzero(batch["loss_mask"][row]) + 1).tolist() == sampled_positions
        assert batch["targets"][row, targets_at].tolist() == [trace.ids[p] for p in sampled_positions]
        old = batch["old_logps"][row, targets_at]
        np.testing.assert_array_equal(old, np.asarray(trace.logprobs, np.float32))
    # the episode's advantage on exactly its action tokens, 0 elsewhere and on the padding rows
    np.testing.assert_array_equal(batch["advantages"], 0.5 * batch["loss_mask"])
    assert batch["loss_mask"][:6].sum() > 0
    assert batch["loss_mask"][6:].sum() == 0 and batch["example_mask"].tolist() == [1.0] * 6 + [0.0] * 2

    # Per-reply advantages (GiGPO) go to each reply's own sampled tokens.
    per_reply = [
        sampled_sequence(t, np.arange(len(t.tokens.reply_spans)) + 1.0, max_length=512) for t in trajectories
    ]
    by_reply = collate_grpo(per_reply, length=512, batch_size=8, pad_id=tokenizer.pad_token_id)
    for row, t in enumerate(trajectories):
        for reply, (start, end) in enumerate(t.tokens.reply_spans):
            assert by_reply["advantages"][row, start - 1 : end - 1].tolist() == [reply + 1.0] * (end - start)
        assert by_reply["advantages"][row][batch["loss_mask"][row] == 0].tolist() == [0.0] * int(
            (batch["loss_mask"][row] == 0).sum()
        )
    with pytest.raises(ValueError, match="reply advantages for"):
        sampled_sequence(
            trajectories[0], [1.0] * (len(trajectories[0].tokens.reply_spans) + 1), max_length=512
        )

    # The trainer's log-probs of the same ids at the same temperature: the ratio starts at 1.
    trainer = np.asarray(token_logprobs(model, batch, chunk_size=64, temperature=TEMPERATURE))
    mask = batch["loss_mask"] > 0
    gap = np.abs(trainer - batch["old_logps"])[mask]
    print(f"float32 sampler vs float32 trainer |log-prob gap|: mean {gap.mean():.2e}, max {gap.max():.2e}")
    assert gap.max() < 1e-4
    untempered = np.asarray(token_logprobs(model, batch, chunk_size=64))
    assert np.abs(untempered - batch["old_logps"])[mask].max() > 1e-3  # the temperature matters


def test_over_long_episodes_are_cut_at_a_reply_end_with_their_log_probs(rollouts):
    trajectories, _, _ = rollouts
    t = max(trajectories, key=lambda t: len(t.tokens.ids))
    spans = t.tokens.reply_spans
    limit = spans[1][1]  # room for the first two replies only
    example = sampled_sequence(t, 1.0, max_length=limit + 2)
    # The cut falls after the last reply that has tokens: a reply a stop string emptied adds no loss token.
    kept = max((e for s, e in spans[:2] if e > s), default=None)
    if kept is None:  # both replies emptied: nothing to train on
        assert example is None
        return
    count = sum(e - s for s, e in spans[:2])
    assert len(example) == kept and example.tokens.num_action_tokens == count
    np.testing.assert_array_equal(
        example.sampled_logps[example.tokens.action_mask], np.asarray(t.tokens.logprobs[:count], np.float32)
    )
    assert sampled_sequence(t, 1.0, max_length=spans[0][1] - 1) is None


def test_scripted_episodes_have_no_token_trace_and_are_refused(tmp_path):
    actor = ScriptedActor(lambda request: "Thought: hm.\nAction: look around", num_slots=2)
    cfg = RolloutConfig(max_steps=2, show_progress=False)
    trajectories, _ = run_rollouts(
        _factory, actor, _factory().tasks("train")[:1], str(tmp_path / "t.jsonl"), cfg
    )
    assert trajectories[0].tokens is None
    with pytest.raises(ValueError, match="no token trace"):
        sampled_sequence(trajectories[0], 1.0, max_length=512)


def _record(**tokens):
    base = {"ids": [5, 6, 7, 8, 9], "reply_spans": [[2, 4]], "logprobs": [-0.5, -0.25]}
    return {
        "id": "x",
        "reward": 1.0,
        "conversations": [{"from": "human", "value": "u"}, {"from": "gpt", "value": "a"}],
        "tokens": {**base, **tokens},
    }


def test_token_traces_round_trip_and_bad_ones_name_the_field():
    trajectory = parse_record(_record())
    assert trajectory.tokens == TokenTrace((5, 6, 7, 8, 9), ((2, 4),), (-0.5, -0.25))
    from coevo_jax.data.records import trajectory_to_record

    assert parse_record(json.loads(json.dumps(trajectory_to_record(trajectory)))) == trajectory
    for bad in (
        {"reply_spans": [[2, 6]]},  # past the ids
        {"logprobs": [-0.5]},  # one log-prob for two tokens
        {"logprobs": [-0.5, 0.5]},  # a log-prob above 0
        {"reply_spans": [[1, 2], [3, 4]], "logprobs": [-1.0, -1.0]},  # two spans, one action
        {"ids": [5, "6"]},
    ):
        with pytest.raises(DataFormatError, match="tokens"):
            parse_record(_record(**bad))
    with pytest.raises(ValueError, match="reply spans"):
        Trajectory(
            "x", "x", (Message("user", "u"), Message("assistant", "a")), 1.0, tokens=TokenTrace((1,), (), ())
        )
