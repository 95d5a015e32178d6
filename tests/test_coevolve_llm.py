"""The LLM path: robust reading of whatever a model writes, the roles end to end with a scripted model, and
(slow) one round with the bundled SmolLM2-135M, of which nothing is expected but that the round completes."""

import json
import re

import pytest
from coevolve_fixtures import fake_history

from coevo_jax import coevolve
from coevo_jax.coevolve.llm import LlmSynthesizer, Reflection, parse_abstraction, parse_reflection
from coevo_jax.coevolve.synthesis import replay_failure
from coevo_jax.envs.builtin import BuiltinEnv

REFLECTION = {
    "summary": "The agent heated the butter before, now it forgets to turn the stove on.",
    "failure_cause": "It never activates the stove.",
    "instability_pattern": "stops after putting food in a device",
    "focus_pattern": ["activate stove"],
    "exploration_objectives": ["heat other food", "cool food"],
    "do_not_repeat": ["stopping before activate"],
}


def test_a_reflection_is_read_from_json_wherever_the_model_puts_it():
    fenced = f"Sure! Here it is:\n```json\n{json.dumps(REFLECTION)}\n```\nHope this helps."
    assert parse_reflection(fenced) == Reflection(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in REFLECTION.items()}
    )
    python_style = "{'summary': 'it failed', 'focus_pattern': 'go to kitchen', 'do_not_repeat': [1, 'x',],}"
    parsed = parse_reflection(python_style)
    assert parsed.summary == "it failed" and parsed.focus_pattern == ("go to kitchen",)
    assert parsed.do_not_repeat == ("1", "x") and "summary: it failed" in parsed.context()


@pytest.mark.parametrize(
    "text, reason",
    [
        ("I think the agent failed because", "reflection is not a JSON object"),
        ('{"summary": "unterminated', "reflection is not a JSON object"),
        ("[1, 2, 3]", "reflection is not a JSON object"),
        ('{"answer": 42}', "reflection JSON lacks the schema's fields"),
        ("{" * 5000, "reflection is not a JSON object"),
        ("", "reflection is not a JSON object"),
    ],
)
def test_a_malformed_reflection_is_a_reason_never_an_exception(text, reason):
    assert parse_reflection(text) == reason


def test_abstraction_blocks_are_read_with_their_numbered_actions():
    text = (
        "Here are the tasks.\nDescription: Heat the pear.\nQuery: Can you heat the pear?\nActionSequence:\n"
        "1. go to kitchen\n2) Action: pick up pear\n- put pear in stove\nStep 4: activate stove\n\n"
        "description: second\nquery: q\naction sequence:\n* look around\n"
    )
    first, second = parse_abstraction(text)
    assert first.query == "Can you heat the pear?" and first.description == "Heat the pear."
    assert first.actions == ("go to kitchen", "pick up pear", "put pear in stove", "activate stove")
    assert second.actions == ("look around",)
    assert (
        parse_abstraction("Task: heat it. Steps: 1. go")
        == "abstraction lacks Description / Query / ActionSequence"
    )


SCRIPT = ["pick up pear", "look at nothing", "go to kitchen", "put pear in stove", "activate stove"]


class ScriptedModel:
    """Replies to each role as a capable model would: JSON, then scripted actions, then one block of the
    actions the environment accepted."""

    def __init__(self):
        self.roles, self.step = [], 0

    def __call__(self, system, user):
        if "Task Abstraction Expert" in user:
            self.roles.append("abstraction")
            accepted = re.findall(r"action: (.*)", user.split("INTERACTION TUPLES")[1])
            steps = "\n".join(f"{i + 1}. {a}" for i, a in enumerate(accepted))
            return f"Description: heat food\nQuery: Please heat the pear.\nActionSequence:\n{steps}"
        if "Return a JSON object" in user:
            self.roles.append("reflection")
            return json.dumps(REFLECTION)
        self.roles.append("exploration")
        assert "Exploration Goal" in user and "# Action Format:" in system
        action = SCRIPT[self.step % len(SCRIPT)]
        self.step += 1
        return f"Thought: this follows the goal.\nAction: {action}"


def make_env():
    # the splits' sizes fix which tasks are train tasks: the scripted model's actions fit these (the pear)
    return BuiltinEnv(num_train=30, num_test_seen=50, num_test_unseen=50, num_dev=50, num_dev_unseen=50)


def test_the_llm_roles_end_to_end_give_a_verified_task_in_the_models_words(tmp_path):
    env = make_env()
    heat = [t for t in env.expert_trajectories("train", limit=14) if t.task_id.startswith("heat/")]
    records = fake_history(heat)  # one heat task, forgotten at step 1
    model = ScriptedModel()
    config = coevolve.CoEvolveConfig(max_signals=1, explorations_per_signal=1, exploration_steps=5)
    pool = coevolve.TaskPool.open(str(tmp_path))
    synthesizer = LlmSynthesizer("builtin", model)
    report = coevolve.round(records, pool, make_env, config, seed=0, synthesizer=synthesizer)
    assert model.roles == ["reflection"] + ["exploration"] * 5 + ["abstraction"]
    assert (report.explored, report.synthesized, report.verified, report.added) == (1, 1, 1, 1)
    (task,) = pool.tasks
    assert task.spec.instruction == "Please heat the pear." and task.signal == "forgetting"
    assert task.spec.solution[-2:] == ("put pear in stove", "activate stove")
    assert replay_failure(make_env(), task.spec) is None


def test_whatever_a_weak_model_writes_the_round_counts_it_and_goes_on(tmp_path):
    env = make_env()
    records = fake_history(env.expert_trajectories("train", limit=12))
    replies = iter(["no json here", '{"summary": "ok"}'] + ["Action: dance"] * 100 + ["Thought: hmm"] * 100)
    config = coevolve.CoEvolveConfig(max_signals=3, explorations_per_signal=1, exploration_steps=3)
    synthesizer = LlmSynthesizer("builtin", lambda system, user: next(replies, "???"))
    report = coevolve.round(records, coevolve.TaskPool(), make_env, config, seed=0, synthesizer=synthesizer)
    assert report.explored == 3 and report.added == 0
    # runs: no JSON; JSON, then three invalid actions; then "Action: dance" where JSON was asked for
    assert report.not_synthesized == {
        "llm: reflection is not a JSON object": 2,
        "llm: no step was accepted": 1,
    }


class ByteTokenizer:
    """Bytes as tokens (0 ends a turn), with a plain chat template: enough to drive `TextGenerator`."""

    eos_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [b % 255 + 1 for b in text.encode()]

    def decode(self, ids, skip_special_tokens):
        return bytes(i - 1 for i in ids if i > 0).decode("latin-1")


def test_the_text_generator_decodes_a_reply_from_a_cut_prompt_with_one_program_per_length():
    from model_fixtures import random_decoder

    from coevo_jax.coevolve.generation import TextGenerator
    from coevo_jax.models import ModelConfig

    cfg = ModelConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
    )
    generator = TextGenerator(random_decoder(cfg), ByteTokenizer(), max_new_tokens=8, max_prompt_tokens=40)
    assert len(generator.prompt_ids("sys", "x" * 500)) == 40
    replies = [
        generator("", "hi"),  # 19 tokens: a 32-token bucket
        generator("", "hi"),
        generator("sys", "a much longer prompt " * 3),  # cut to 40 tokens: a 64-token bucket
    ]
    assert all(isinstance(r, str) and len(r) <= 8 for r in replies)
    assert len(generator._samplers) == 2 and generator.calls == 3


@pytest.mark.slow
def test_smollm2_plays_the_llm_roles_for_one_round(tmp_path):
    """SmolLM2-135M as reflector, explorer and abstractor on the built-in environment: the round must
    complete and account for every exploration; a 135M model is expected to yield few or no tasks."""
    env = make_env()
    records = fake_history(env.expert_trajectories("train", limit=12))
    config = coevolve.CoEvolveConfig(
        synthesizer="llm",
        max_signals=2,
        explorations_per_signal=1,
        exploration_steps=3,
        llm_max_new_tokens=96,
    )
    pool = coevolve.TaskPool.open(str(tmp_path))
    report = coevolve.round(records, pool, make_env, config, seed=0)
    print(json.dumps(report.to_json(), indent=1))
    assert report.explored == 2
    assert report.explored == report.synthesized + sum(report.not_synthesized.values())
    assert not any(reason.startswith("error") for reason in report.not_synthesized)
    assert report.added == len(pool) == report.verified
