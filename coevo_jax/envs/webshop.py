"""WebShop through its own text environment (`web_agent_site`'s `WebAgentTextEnv`), as ETO drives it.

WebShop needs its product catalogue and search index, which cannot be obtained on the machines this
project is developed on, so this adapter is written against WebShop's documented interface and ETO's
`WebShopEnv` but has not been run against a real WebShop install (the README says so). What it does:

- builds `WebAgentTextEnv(observation_mode="text", human_goals=True)` (or takes one you built);
- task ids are ETO's session ids (indices of WebShop's human goals): `train` (1,824), `test` (the 200
  of the paper's Table 1) and `test_500`, from ETO's `eval_agent/data/webshop/*.json`;
- `reset` starts session `int(task_id)` and returns the page text, which holds the instruction;
- `step` passes `search[...]`/`click[...]` through; an action WebShop rejects (AssertionError) gets ETO's
  "Invalid action!" observation; the score is 0 until the episode ends (a purchase), then WebShop's
  reward, as in ETO; ETO's step limit is 10 and observations read "Observation:\\n<page>".

Without WebShop installed, creating the environment raises ImportError saying how to install it. It has no
expert trajectories of its own (`expert_trajectories` says so): a run reads them from `env.experts_path`.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

from coevo_jax.data.records import Trajectory
from coevo_jax.envs.base import Environment, StepResult, check_task_id

DATA_DIR = Path(__file__).parent / "data" / "webshop"
SPLIT_FILES = {
    "train": "train_indices.json",
    "test": "test_indices.json",
    "test_500": "test_indices_500.json",
}
MAX_STEPS = 10  # ETO's configs/task/webshop.json
INVALID_ACTION = "Invalid action!"
INSTALL_HINT = (
    "WebShop is not installed: the 'webshop' environment needs princeton-nlp/WebShop's `web_agent_site` "
    "package importable, with its product data and search index set up (see "
    "https://github.com/princeton-nlp/WebShop, setup.sh). It is not on PyPI and is not installed by this "
    "project."
)


def _text_env_class():
    try:
        from web_agent_site.envs import WebAgentTextEnv
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} (import failed: {error})") from error
    return WebAgentTextEnv


class WebShopEnv(Environment):
    """ETO's WebShop set-up over a `WebAgentTextEnv` (see the module docstring)."""

    name = "webshop"
    observation_prefix = "Observation:\n"

    def __init__(self, *, text_env=None, data_dir: str | Path = DATA_DIR, **text_env_kwargs):
        if text_env is None:
            options = {"observation_mode": "text", "human_goals": True, **text_env_kwargs}
            text_env = _text_env_class()(**options)
        self._env = text_env
        self.data_dir = Path(data_dir)
        self._in_episode = False

    @cached_property
    def instruction(self) -> str:
        return (self.data_dir / "webshop_inst.txt").read_text().strip()

    def splits(self) -> tuple[str, ...]:
        return tuple(SPLIT_FILES)

    @cached_property
    def _split_ids(self) -> dict[str, list[str]]:
        splits = {}
        for split, filename in SPLIT_FILES.items():
            path = self.data_dir / filename
            ids = json.loads(path.read_text())
            if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise ValueError(f"{path}: expected a list of non-negative session ids")
            splits[split] = [str(i) for i in ids]
        return splits

    def tasks(self, split: str) -> list[str]:
        if split not in SPLIT_FILES:
            raise ValueError(f"unknown {self.name} split {split!r}; splits: {', '.join(SPLIT_FILES)}")
        return list(self._split_ids[split])

    def max_steps(self, task_id: str) -> int:
        self._session(task_id)
        return MAX_STEPS

    @staticmethod
    def _session(task_id: str) -> int:
        if not check_task_id("webshop", task_id).isdigit():
            raise ValueError(f"webshop task id {task_id!r} is not a session index")
        return int(task_id)

    def reset(self, task_id: str) -> str:
        self._env.reset(session=self._session(task_id))
        self._in_episode = True
        return self._env.observation

    def step(self, action: str) -> StepResult:
        if not self._in_episode:
            raise RuntimeError("webshop: step() called without an episode in progress (call reset)")
        try:
            observation, reward, done, info = self._env.step(action)
        except AssertionError:
            return INVALID_ACTION, 0.0, False, {"invalid_action": True}
        if done:
            self._in_episode = False
        return observation, float(reward) if done else 0.0, bool(done), info or {}

    def expert_trajectories(self, split: str, limit: int | None = None) -> list[Trajectory]:
        """Raises ValueError (after checking `split`): this adapter has no expert source of its own.

        ETO's WebShop demonstrations are not shipped here and replaying any needs WebShop's catalogue, so a
        run reads them from `env.experts_path` instead.
        """
        self.tasks(split)
        raise ValueError(
            f"webshop: no built-in expert trajectories for split {split!r}: ETO's WebShop demonstrations are "
            "not shipped with this project and building them needs WebShop's product catalogue; set "
            "env.experts_path to a trajectory file of WebShop demonstrations"
        )

    def close(self) -> None:
        close = getattr(self._env, "close", None)
        if callable(close):
            close()
