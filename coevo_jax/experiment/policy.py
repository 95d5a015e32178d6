"""The policy side of a run: tokenizer, architecture, mesh, base parameters, compiled steps and samplers.

Both agents share one architecture and mesh, so one `PolicySetup` serves them: its train steps are
compiled once per (optimizer, beta) and bucket shape, its two samplers (greedy for evaluation, sampled for
exploration) once per prompt bucket.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from transformers import AutoTokenizer

from coevo_jax import sharding
from coevo_jax.data.chat_format import chat_format_for
from coevo_jax.experiment.atomic import atomic_path
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.models import ModelConfig
from coevo_jax.models.bundled import smollm2_gguf_path
from coevo_jax.models.tokenizer_training import train_tokenizer_for_trajectories
from coevo_jax.rollout import ModelActor, TurnCodec
from coevo_jax.sampling import Sampler, SamplingConfig, StopConfig
from coevo_jax.train import ObjectiveConfig, OptimizerConfig, build_steps, make_optimizer, make_schedule
from coevo_jax.train.state import (
    abstract_model,
    abstract_state,
    init_params,
    load_sharded,
    state_shardings,
)

log = logging.getLogger(__name__)

TOKENIZER_DIR = "tokenizer"


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

    compiled: dict = dataclasses.field(default_factory=dict)  # steps and samplers, built once each

    def steps(self, optimizer: OptimizerConfig, beta: float):
        """(compiled steps, tx, state shardings) for one optimizer config and DPO beta."""
        key = ("steps", optimizer, beta)
        if key not in self.compiled:
            self.compiled[key] = self._build_steps(optimizer, beta)
        return self.compiled[key]

    def _build_steps(self, optimizer: OptimizerConfig, beta: float):
        tx = make_optimizer(optimizer)
        shardings = state_shardings(self.model_cfg, tx, self.mesh, self.rules)
        objective = ObjectiveConfig(beta=beta, sft_per_token=self.cfg.sft_per_token)
        steps = build_steps(
            self.graphdef, tx, make_schedule(optimizer), shardings, self.mesh, self.rules, objective
        )
        return steps, tx, shardings

    def sampler(self, greedy: bool) -> Sampler:
        """The greedy (evaluation) or sampling (exploration) sampler, compiled once."""
        if ("sampler", greedy) not in self.compiled:
            self.compiled[("sampler", greedy)] = self._build_sampler(greedy)
        return self.compiled[("sampler", greedy)]

    def _build_sampler(self, greedy: bool) -> Sampler:
        spec = self.cfg.rollout
        sampling = SamplingConfig(
            temperature=0.0 if greedy else spec.temperature,
            top_p=1.0 if greedy else spec.top_p,
            max_new_tokens=spec.max_new_tokens,
        )
        return Sampler(
            self.model_cfg.replace(dtype=self.cfg.model.sample_dtype),
            batch_size=spec.rows,
            cache_len=spec.cache_len,
            sampling=sampling,
            stops=StopConfig(stop_ids=self.codec.end_of_turn_ids),
            mesh=self.mesh,
            rules=self.rules,
            param_shardings=self.param_shardings,
        )

    def actor(self, params: dict, *, greedy: bool, seed: int) -> ModelActor:
        """A fresh multi-turn actor sampling from `params`."""
        spec = self.cfg.rollout
        return ModelActor(
            self.sampler(greedy),
            params,
            self.codec,
            num_groups=spec.groups,
            stop_strings=spec.stop_strings,
            seed=seed,
            model_name=self.cfg.model.source,
        )


def _tokenizer_for_scratch(workdir: str, experts, vocab_size: int):
    """The tokenizer trained on the experts' text, saved in the workdir once and reloaded on resume."""
    path = os.path.join(workdir, TOKENIZER_DIR)
    if os.path.isdir(path):
        return AutoTokenizer.from_pretrained(path)
    tokenizer = train_tokenizer_for_trajectories(experts, vocab_size=vocab_size)
    with atomic_path(path) as tmp:
        tokenizer.save_pretrained(tmp)
    return tokenizer


def checkpoint_path(source: str) -> str:
    """The file or directory behind `model.source` ('smollm2' is the bundled GGUF)."""
    return smollm2_gguf_path() if source == "smollm2" else os.path.expanduser(source)


def build_setup(cfg: ExperimentConfig, workdir: str, experts) -> PolicySetup:
    """Mesh over all devices, then the tokenizer and architecture (trained / loaded) for `cfg.model`."""
    spec = cfg.model
    mesh = sharding.make_mesh(sharding.MeshConfig(axes=cfg.mesh_axes))
    rules = sharding.ShardingRules()
    pretrained = None
    if spec.source == "scratch":
        tokenizer = _tokenizer_for_scratch(workdir, experts, spec.vocab_size)
        model_cfg = ModelConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            token_shift=spec.token_shift,
        )
    else:
        if spec.token_shift:
            raise ValueError(f"model.token_shift={spec.token_shift}: only a scratch model can have one")
        model_cfg, _, pretrained, tokenizer = load_sharded(checkpoint_path(spec.source), mesh, rules)
        if tokenizer is None:
            raise ValueError(f"{spec.source}: the checkpoint has no tokenizer")
    model_cfg = model_cfg.replace(dtype=spec.compute_dtype, param_dtype=spec.param_dtype, remat=spec.remat)
    if pretrained is not None:
        pretrained = jax.tree.map(lambda p: p.astype(model_cfg.param_dtype), pretrained)
    graphdef, _ = abstract_model(model_cfg)
    log.info("policy: %s, %d devices, mesh %s", spec.source, len(jax.devices()), dict(mesh.shape))
    return PolicySetup(
        cfg, model_cfg, graphdef, tokenizer, chat_format_for(tokenizer), mesh, rules, pretrained
    )
