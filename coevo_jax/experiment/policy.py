"""The policy side of a run: what both agents share (architecture, tokenizer, mesh, shardings, base
parameters, compiled programs) and the actors that sample from an agent's parameters.

Both agents share one architecture and mesh, so one `PolicySetup` serves them. `build_setup` assembles it
from the pieces: `experiment.model` (architecture, tokenizer, checkpoint parameters) and
`experiment.programs` (train steps and samplers, each compiled once).

Rollouts sample on the rollout mesh: with one process the training mesh itself; with several, the process's
own devices (`sharding.process_mesh_config`), so that each process plays its own episodes without waiting
for the others (`experiment.rollouts`). An actor then samples from a copy of the policy all-gathered to the
host and placed on that mesh: one host copy of the policy per process and one all-gather per rollout.

A policy is always handled whole (a pure dict of all its parameters). Under LoRA both agents and every
reference share one frozen base (`lora_base`, never copied), a policy is that base plus its own adapters,
and only the adapters are trained and saved (`trainable`, `policy`), with the base's fingerprint.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from coevo_jax import checkpoints, sharding
from coevo_jax.data.chat_format import chat_format_for
from coevo_jax.experiment import processes
from coevo_jax.experiment.agent_pairs import resolve_concurrent_agents
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.model import policy_model
from coevo_jax.experiment.programs import Programs
from coevo_jax.models import ModelConfig, abstract_model, combine_trainable, partition_trainable
from coevo_jax.rollout import ModelActor, TurnCodec
from coevo_jax.train import AdamWSettings, make_optimizer
from coevo_jax.train.state import (
    abstract_state,
    init_adapters,
    init_params,
    policy_shardings,
    state_shardings,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class PolicySetup:
    """Everything both agents share (see the module docstring)."""

    cfg: ExperimentConfig
    model_cfg: ModelConfig  # training dtype policy
    graphdef: object
    tokenizer: object
    chat_format: object
    mesh: Mesh
    rules: sharding.ShardingRules
    pretrained: dict | None  # the checkpoint's parameters (both agents start from them), or None

    @functools.cached_property
    def concurrent_agents(self) -> bool:
        """Whether the two agents' independent stages run side by side (`experiment.agent_pairs`)."""
        return resolve_concurrent_agents(
            self.cfg.concurrent_agents,
            platform=self.mesh.devices.flat[0].platform,
            process_count=processes.count(),
            device_count=self.mesh.devices.size,
        )

    @functools.cached_property
    def codec(self) -> TurnCodec:
        return TurnCodec(self.tokenizer, self.chat_format)

    @functools.cached_property
    def _reference_tx(self):
        """Any AdamW: the parameters' shardings and shapes do not depend on the optimizer settings."""
        return make_optimizer(AdamWSettings())

    @functools.cached_property
    def _state_shardings(self):
        return state_shardings(self.model_cfg, self._reference_tx, self.mesh, self.rules)

    @functools.cached_property
    def param_shardings(self) -> dict:
        """Shardings of all the policy's parameters (LoRA: base and adapters)."""
        return policy_shardings(self.model_cfg, self.mesh, self.rules)

    @functools.cached_property
    def abstract_params(self) -> dict:
        """ShapeDtypeStructs with shardings of the trainable parameters: the restore target of saved
        policies."""
        return abstract_state(self.model_cfg, self._reference_tx, self._state_shardings).params

    @functools.cached_property
    def lora_base(self) -> dict:
        """The frozen base every LoRA policy shares: the checkpoint's parameters, or for a scratch model one
        initialisation from the run's seed; {} for full fine-tuning."""
        if not self.model_cfg.lora_rank:
            return {}
        if self.pretrained is not None:
            return self.pretrained
        params = init_params(self.model_cfg, self.param_shardings, jax.random.key(self.cfg.seed))
        return partition_trainable(params, self.model_cfg)[1]

    @functools.cached_property
    def base_fingerprint(self) -> str | None:
        """`checkpoints.base_fingerprint` of `lora_base`, recorded with every saved adapter; None without LoRA."""
        if not self.model_cfg.lora_rank:
            return None
        return checkpoints.base_fingerprint(self.model_cfg, self.lora_base)

    def base_params(self, seed: int) -> dict:
        """The starting parameters of an agent: the checkpoint's (copied), or a fresh init from `seed`;
        under LoRA the shared base plus fresh adapters drawn from `seed`."""
        if self.model_cfg.lora_rank:
            adapters_sh, _ = partition_trainable(self.param_shardings, self.model_cfg)
            return self.policy(init_adapters(self.model_cfg, adapters_sh, jax.random.key(seed)))
        if self.pretrained is not None:
            return jax.tree.map(jnp.copy, self.pretrained)
        return init_params(self.model_cfg, self.param_shardings, jax.random.key(seed))

    def trainable(self, params: dict) -> dict:
        """What of a policy is trained and saved: all of it, or (LoRA) its adapters."""
        return partition_trainable(params, self.model_cfg)[0]

    def policy(self, trainable: dict) -> dict:
        """The whole policy of saved or trained parameters (`trainable`): with LoRA, on the shared base."""
        return combine_trainable(trainable, self.lora_base)

    @functools.cached_property
    def rollout_mesh(self) -> Mesh:
        """The samplers' mesh (see the module docstring)."""
        if processes.count() == 1:
            return self.mesh
        config = sharding.process_mesh_config(sharding.MeshConfig(axes=self.cfg.mesh_axes), self.rules)
        return sharding.make_mesh(config, jax.local_devices())

    @functools.cached_property
    def rollout_param_shardings(self) -> dict:
        if processes.count() == 1:
            return self.param_shardings
        return policy_shardings(self.model_cfg, self.rollout_mesh, self.rules)

    @functools.cached_property
    def programs(self) -> Programs:
        """The train steps and samplers, built once each."""
        return Programs(
            self.cfg,
            self.model_cfg,
            self.graphdef,
            self.mesh,
            self.rules,
            self.param_shardings,
            self.codec.end_of_turn_ids,
            self.rollout_mesh,
            self.rollout_param_shardings,
        )

    def actor(self, params: dict, *, greedy: bool, seed: int, temperature: float | None = None) -> ModelActor:
        """A fresh multi-turn actor sampling from `params` (`Programs.sampler` for `greedy`, `temperature`)."""
        spec = self.cfg.rollout
        if processes.count() > 1:  # a copy on this process's devices (collective: every process calls it)
            params = jax.device_put(processes.to_host(params), self.rollout_param_shardings)
        return ModelActor(
            self.programs.sampler(greedy, temperature),
            params,
            self.codec,
            num_groups=spec.groups,
            stop_strings=spec.stop_strings,
            seed=seed,
            model_name=self.cfg.model.source,
        )


def build_setup(cfg: ExperimentConfig, workdir: str, experts) -> PolicySetup:
    """Mesh over all devices, then the tokenizer and architecture (trained / loaded) for `cfg.model`."""
    spec = cfg.model
    mesh = sharding.make_mesh(sharding.MeshConfig(axes=cfg.mesh_axes))
    processes.connect(mesh)
    rules = sharding.ShardingRules()
    model_cfg, tokenizer, pretrained = policy_model(spec, workdir, experts, mesh, rules)
    graphdef, _ = abstract_model(model_cfg)
    log.info("policy: %s, %d devices, mesh %s", spec.source, len(jax.devices()), dict(mesh.shape))
    return PolicySetup(
        cfg, model_cfg, graphdef, tokenizer, chat_format_for(tokenizer), mesh, rules, pretrained
    )
