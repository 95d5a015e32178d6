"""`TrainConfig`: the per-phase training knobs (precision, rematerialisation, micro-batches, DPO beta).

Built once from a ConfigDict at the entry point; the library only sees the frozen dataclass and what it
derives: the model's dtype policy (`model_config`) and the loss settings (`objective`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from coevo_jax.models import ModelConfig
from coevo_jax.train.mapping import dataclass_from_mapping
from coevo_jax.train.objectives import ObjectiveConfig


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Precision and memory policy plus loss settings of a training phase.

    Default: bfloat16 compute with float32 master weights (and float32 Adam moments, which follow the
    parameters), no rematerialisation, one micro-batch, beta = 0.1 (the DPO/ETO default).
    """

    compute_dtype: str = "bfloat16"
    param_dtype: str = "float32"
    remat: bool = False
    num_microbatches: int = 1
    beta: float = 0.1
    sft_per_token: bool = True
    logprob_chunk_size: int = 1024

    def __post_init__(self):
        for name in ("compute_dtype", "param_dtype"):
            jnp.dtype(getattr(self, name))  # fails loudly on a typo
        if self.num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {self.num_microbatches}")

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> TrainConfig:
        """From a ConfigDict/dict with (a subset of) the field names; unknown names are an error."""
        return dataclass_from_mapping(cls, config, "train")

    def model_config(self, model_cfg: ModelConfig) -> ModelConfig:
        """`model_cfg` with this dtype policy and rematerialisation setting."""
        return model_cfg.replace(dtype=self.compute_dtype, param_dtype=self.param_dtype, remat=self.remat)

    def objective(self) -> ObjectiveConfig:
        """The static loss settings of the steps."""
        return ObjectiveConfig(
            beta=self.beta, sft_per_token=self.sft_per_token, logprob_chunk_size=self.logprob_chunk_size
        )
