"""WebShop adapter: ETO's splits and step semantics over a `WebAgentTextEnv`, and the error without WebShop.

WebShop itself cannot be installed here (its catalogue is not obtainable offline), so these tests drive the
adapter with a small stand-in that has `WebAgentTextEnv`'s interface; they check our side of the contract,
not WebShop's behaviour.
"""

import sys
import types

import pytest

from coevo_jax.envs import make
from coevo_jax.envs.webshop import INVALID_ACTION, MAX_STEPS, WebShopEnv
from coevo_jax.react import format_reply
from coevo_jax.rollout import RolloutConfig, ScriptedActor, run_rollouts


class FakeTextEnv:
    """WebAgentTextEnv's surface: reset(session=...), .observation, step(action) -> (obs, reward, done, info)."""

    def __init__(self, observation_mode="html", human_goals=False, **kwargs):
        self.options = dict(observation_mode=observation_mode, human_goals=human_goals, **kwargs)
        self.sessions, self.observation = [], None

    def reset(self, session=None, instruction_text=None):
        self.sessions.append(session)
        self.observation = f"WebShop [SEP] Instruction: [SEP] goal {session} [SEP] Search"
        return self.observation, None

    def step(self, action):
        assert action.startswith(("search[", "click[")), "invalid action"
        if action == "click[Buy Now]":
            return "Thank you for shopping with us!", 0.75, True, None
        self.observation = f"results for {action}"
        return self.observation, 0.0, False, None


@pytest.fixture
def fake_webshop(monkeypatch):
    package = types.ModuleType("web_agent_site")
    envs = types.ModuleType("web_agent_site.envs")
    envs.WebAgentTextEnv = FakeTextEnv
    package.envs = envs
    monkeypatch.setitem(sys.modules, "web_agent_site", package)
    monkeypatch.setitem(sys.modules, "web_agent_site.envs", envs)


def test_without_webshop_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "web_agent_site", None)
    with pytest.raises(ImportError, match="WebShop is not installed.*princeton-nlp/WebShop"):
        make("webshop")


def test_eto_splits_and_text_env_options(fake_webshop):
    env = make("webshop")
    assert env._env.options == {"observation_mode": "text", "human_goals": True}
    assert {s: len(env.tasks(s)) for s in env.splits()} == {"train": 1824, "test": 200, "test_500": 500}
    assert env.tasks("test")[:3] == ["2853", "5934", "1642"]
    assert env.instruction.startswith("You are web shopping.")
    assert env.max_steps("2853") == MAX_STEPS == 10
    with pytest.raises(ValueError, match="not a session index"):
        env.reset("abc")
    with pytest.raises(ValueError, match="webshop: a task id must be a string"):
        env.reset(2853)


def test_no_expert_trajectories_of_its_own(fake_webshop):
    env = WebShopEnv()
    with pytest.raises(ValueError, match="webshop: no built-in expert trajectories .*env.experts_path"):
        env.expert_trajectories("train")
    with pytest.raises(ValueError, match="unknown webshop split"):
        env.expert_trajectories("dev")


def test_steps_follow_eto(fake_webshop):
    env = WebShopEnv()
    assert env.reset("2853") == "WebShop [SEP] Instruction: [SEP] goal 2853 [SEP] Search"
    assert env._env.sessions == [2853]
    assert env.step("jump") == (INVALID_ACTION, 0.0, False, {"invalid_action": True})
    assert env.step("search[shoes]")[:3] == ("results for search[shoes]", 0.0, False)
    assert env.step("click[Buy Now]")[1:3] == (0.75, True)
    with pytest.raises(RuntimeError, match="without an episode"):
        env.step("search[x]")


def test_through_the_rollout_loop_observations_read_like_etos(fake_webshop, tmp_path):
    script = ["search[red shoes]", "click[Buy Now]"]

    def reply(request):
        return format_reply("I think I should act.", script[(len(request.messages) - 3) // 2])

    trajectories, stats = run_rollouts(
        WebShopEnv,
        ScriptedActor(reply, num_slots=2),
        ["2853", "5934"],
        str(tmp_path / "webshop.jsonl"),
        RolloutConfig(show_progress=False),
    )
    assert stats.episodes == 2 and all(t.reward == 0.75 for t in trajectories)
    observation = trajectories[0].messages[4].content
    assert observation == "Observation:\nresults for search[red shoes]"
