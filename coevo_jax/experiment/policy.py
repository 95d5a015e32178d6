"""The policy side of a run: what both agents share (architecture, tokenizer, mesh, shardings, base
parameters, compiled programs) and the actors that sample from an agent's parameters.

Both agents share one architecture and mesh, so one `PolicySetup` serves them. `build_setup` assembles it
from the pieces: `experiment.model` (architecture, tokenizer, checkpoint parameters) and
`experiment.programs` (train steps and samplers, each compiled once).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from coevo_jax import sharding
from coevo_jax.data.chat_format import chat_format_for
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.model import policy_model
from coevo_jax.experiment.programs import Programs
from coevo_jax.models import ModelConfig, abstract_model
from coevo_jax.rollout import ModelActor, TurnCodec
from coevo_jax.train import OptimizerConfig, make_optimizer
from coevo_jax.train.state import abstract_state, init_params, state_shardings

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
    def codec(self) -> TurnCodec:
        return TurnCodec(self.tokenizer, self.chat_format)

    @functools.cached_property
    def _reference_tx(self):
        """Any AdamW: the parameters' shardings and shapes do not depend on the optimizer settings."""
        return make_optimizer(OptimizerConfig(1e-6))

    @functools.cached_property
    def _state_shardings(self):
        return state_shardings(self.model_cfg, self._reference_tx, self.mesh, self.rules)

    @functools.cached_property
    def param_shardings(self) -> dict:
        return self._state_shardings.params

    @functools.cached_property
    def abstract_params(self) -> dict:
        """ShapeDtypeStructs with shardings: the restore target of saved policies."""
        return abstract_state(self.model_cfg, self._reference_tx, self._state_shardings).params

    def base_params(self, seed: int) -> dict:
        """The starting parameters of an agent: the checkpoint's (copied), or a fresh init from `seed`."""
        if self.pretrained is not None:
            return jax.tree.map(jnp.copy, self.pretrained)
        return init_params(self.model_cfg, self.param_shardings, jax.random.key(seed))

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
        )

    def actor(self, params: dict, *, greedy: bool, seed: int) -> ModelActor:
        """A fresh multi-turn actor sampling from `params`."""
        spec = self.cfg.rollout
        return ModelActor(
            self.programs.sampler(greedy),
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
    rules = sharding.ShardingRules()
    model_cfg, tokenizer, pretrained = policy_model(spec, workdir, experts, mesh, rules)
    graphdef, _ = abstract_model(model_cfg)
    log.info("policy: %s, %d devices, mesh %s", spec.source, len(jax.devices()), dict(mesh.shape))
    return PolicySetup(
        cfg, model_cfg, graphdef, tokenizer, chat_format_for(tokenizer), mesh, rules, pretrained
    )
