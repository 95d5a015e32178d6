"""The compiled programs both agents share: train steps and samplers, each built once per run.

Both agents have one architecture and mesh, so a bundle of train steps is built once per AdamW settings
(one for the whole run unless GRPO's differ from the phases') and each sampler (greedy for evaluation,
sampled for exploration, sampled at GRPO's temperature) once; inside them jit compiles once per bucket
shape. A phase's learning-rate schedule and DPO beta are traced arguments of the steps (`PhaseScalars`), so
phases that differ in them share the compiled programs. The train steps run on the global mesh, the samplers
on the rollout mesh: the same with one process, each process's own devices with several (`PolicySetup`).
"""

from __future__ import annotations

import dataclasses
import threading

from jax.sharding import Mesh

from coevo_jax import sharding
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.models import ModelConfig
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig
from coevo_jax.train import AdamWSettings, GRPOObjective, ObjectiveConfig, build_steps, make_optimizer
from coevo_jax.train.state import state_shardings


def objective_config(cfg: ExperimentConfig) -> ObjectiveConfig:
    """The train steps' static loss settings from a run's config."""
    grpo = cfg.grpo
    return ObjectiveConfig(
        sft_per_token=cfg.sft_per_token,
        keep_logits=cfg.keep_logits,
        grpo=GRPOObjective(
            clip_low=grpo.clip_low,
            clip_high=grpo.clip_high,
            beta=grpo.beta,
            aggregation=grpo.aggregation,
            temperature=grpo.temperature,
        ),
    )


@dataclasses.dataclass(eq=False)
class Programs:
    """Train steps and samplers for one architecture on one mesh, built on first use and kept."""

    cfg: ExperimentConfig
    model_cfg: ModelConfig  # training dtype policy
    graphdef: object
    mesh: Mesh
    rules: sharding.ShardingRules
    param_shardings: dict  # all the policy's parameters (LoRA: base and adapters)
    stop_ids: tuple[int, ...]  # the tokens that end an assistant turn
    rollout_mesh: Mesh  # the samplers'
    rollout_param_shardings: dict  # all the policy's parameters on `rollout_mesh`
    built: dict = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def steps(self, adamw: AdamWSettings):
        """(compiled steps, tx, state shardings) for the AdamW settings `adamw` (a phase's
        `OptimizerConfig.adamw_settings()`); its schedule and beta go to the steps as `PhaseScalars`."""
        key = ("steps", adamw)
        with self.lock:  # both agents' phases may ask at once (`experiment.agent_pairs`)
            if key not in self.built:
                self.built[key] = self._build_steps(adamw)
            return self.built[key]

    def _build_steps(self, adamw: AdamWSettings):
        tx = make_optimizer(adamw)
        shardings = state_shardings(self.model_cfg, tx, self.mesh, self.rules)
        steps = build_steps(
            self.graphdef,
            tx,
            shardings,
            self.mesh,
            self.rules,
            objective_config(self.cfg),
            param_shardings=self.param_shardings,
        )
        return steps, tx, shardings

    def sampler(self, greedy: bool, temperature: float | None = None) -> Sampler:
        """The greedy (evaluation) or sampling (exploration: `rollout.temperature` and `top_p`) sampler, or
        with `temperature` one that samples the untruncated softmax(logits / temperature) (GRPO's rollouts,
        whose log-probs the trainer must reproduce); each compiled once."""
        key = ("sampler", greedy, None if greedy else temperature)
        with self.lock:
            if key not in self.built:
                self.built[key] = self._build_sampler(greedy, temperature)
            return self.built[key]

    def _build_sampler(self, greedy: bool, temperature: float | None) -> Sampler:
        spec = self.cfg.rollout
        if greedy:
            temperature, top_p = 0.0, 1.0
        elif temperature is None:
            temperature, top_p = spec.temperature, spec.top_p
        else:
            top_p = 1.0
        sampling = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=spec.max_new_tokens)
        return Sampler(
            self.model_cfg.replace(dtype=self.cfg.model.sample_dtype),
            batch_size=spec.rows,
            cache_len=spec.cache_len,
            sampling=sampling,
            stops=StopConfig(stop_ids=self.stop_ids),
            mesh=self.rollout_mesh,
            rules=self.rules,
            param_shardings=self.rollout_param_shardings,
            merge_lora=spec.merge_lora,
        )
