"""`CoEvolveConfig`: the CoEvolve loop's settings and ablation switches, a frozen dataclass built once from
the run's ConfigDict group (`from_mapping`); the paper's Table 5 ablations (each signal alone, no
verification) and unguided exploration are named settings of it (`ABLATIONS`, `for_method`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from coevo_jax.coevolve.signals import DEFAULT_MIN_SEEN, DEFAULT_THETA, DEFAULT_WINDOW, SIGNAL_KINDS
from coevo_jax.train.mapping import dataclass_from_mapping

SYNTHESIZERS = ("programmatic", "llm")


@dataclasses.dataclass(frozen=True)
class CoEvolveConfig:
    """One CoEvolve run's settings (the signals' defaults are justified in `signals`)."""

    every_steps: int = 10  # F: GRPO steps between rounds (the paper's best BFCL setting)
    signals: tuple[str, ...] = SIGNAL_KINDS  # which signals drive exploration (ablation: one alone)
    window: int = DEFAULT_WINDOW  # W, forgetting
    theta: float = DEFAULT_THETA  # rare: share of rollouts, in percent
    min_seen: int = DEFAULT_MIN_SEEN  # n_min, rare: rollouts seen before any is rare
    max_signals: int = 12  # signals explored a round, the kinds taking turns (the rest are counted only)
    explorations_per_signal: int = 2  # the paper's multi-round exploration: independent runs per signal
    exploration_steps: int = 16  # the paper's multi-step exploration: steps in one run
    min_solution_steps: int = 3  # the paper's abstraction rule: an ActionSequence of at least 3 steps
    verify: bool = True  # ablation: False adds synthesized tasks unverified
    guided: bool = True  # ablation: False explores from random train tasks, favouring nothing
    synthesizer: str = "programmatic"  # or "llm": the paper's LLM roles played by `llm_model`
    llm_model: str = ""  # a checkpoint `load_pretrained` reads; "" is the bundled SmolLM2-135M
    llm_max_new_tokens: int = 192
    llm_temperature: float = 0.7

    def __post_init__(self):
        unknown = set(self.signals) - set(SIGNAL_KINDS)
        if unknown or not self.signals:
            raise ValueError(f"coevolve.signals {list(self.signals)}: each must be one of {SIGNAL_KINDS}")
        if self.synthesizer not in SYNTHESIZERS:
            raise ValueError(f"coevolve.synthesizer {self.synthesizer!r}: one of {SYNTHESIZERS}")
        for name in ("every_steps", "window", "min_seen", "explorations_per_signal", "exploration_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"coevolve.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_signals < 0 or self.min_solution_steps < 1:
            raise ValueError("coevolve.max_signals must be >= 0 and min_solution_steps >= 1")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> CoEvolveConfig:
        """From a ConfigDict or dict (lists become tuples); unknown fields are errors."""
        fields = dict(config.to_dict() if hasattr(config, "to_dict") else config)
        if "signals" in fields:
            fields["signals"] = tuple(fields["signals"])
        return dataclass_from_mapping(cls, fields, "coevolve")

    def for_method(self, method: str) -> CoEvolveConfig:
        """This config under the ablation `method` names (`ABLATIONS`)."""
        if method not in ABLATIONS:
            raise ValueError(f"unknown CoEvolve method {method!r}; methods: {sorted(ABLATIONS)}")
        return dataclasses.replace(self, **ABLATIONS[method])


# The CoEvolve methods: the full loop, each signal alone, no verification, unguided exploration.
ABLATIONS: dict[str, dict[str, Any]] = {
    "coevolve": {},
    "coevolve_forgetting": {"signals": ("forgetting",)},
    "coevolve_boundary": {"signals": ("boundary",)},
    "coevolve_rare": {"signals": ("rare",)},
    "coevolve_no_verify": {"verify": False},
    "coevolve_unguided": {"guided": False},
}
