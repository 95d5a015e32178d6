"""Decoder hyper-parameters (`ModelConfig`) and their translation from/to Hugging Face `config.json`.

One frozen, hashable dataclass describes every supported family (Llama-2, Llama-3, Qwen2/2.5, Qwen3,
SmolLM2, Gemma 4, Qwen3.5); the family differences reduce to a few flags (q/k/v bias, per-head q/k RMSNorm,
tied embeddings, Llama-3 RoPE scaling, Gemma's and Qwen3.5's: `layer_types` and the rest). Each family's
`config.json` is read and written by a module of its own (`llama_config`, `gemma4_config`,
`qwen3_5_config`), which knows no `ModelConfig`: it maps dicts to fields and a config's fields back. The
LoRA fields say whether the policy trains low-rank adapters on a frozen base (`coevo_jax.models.lora`).
Being hashable, a config can live as static data inside an NNX module and be a static argument of `jax.jit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from coevo_jax.models import gemma4_config, llama_config, qwen3_5_config
from coevo_jax.models.llama_config import Llama3RopeScaling

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma4_text", "qwen3_5_text")
# `ModelConfig.layer_types`: how each layer mixes tokens (Gemma 4 interleaves full and sliding attention,
# Qwen3.5 full attention and the gated delta rule, `models.linear_attention`).
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
# A layer whose keys and values are another layer's (Gemma 4's KV sharing): its kind is its type plus this.
SHARED_KV = "_shared_kv"
ACTIVATIONS = ("silu", "gelu_tanh")
# The projections a LoRA adapter can sit on (attention q/k/v/o, SwiGLU gate/up/down), in a fixed order.
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# `ModelConfig.attention`: how full-sequence passes attend (see `coevo_jax.models.fused_attention`).
ATTENTION_CHOICES = ("auto", "blocked", "cudnn")
# `ModelConfig.platform` and `ModelConfig.kernels`: what the programs are compiled for and which kernel set
# computes them; 'auto' is resolved where the decoder is built (`coevo_jax.models.kernels.resolve`).
PLATFORM_CHOICES = ("auto", "cpu", "gpu", "tpu")
KERNEL_CHOICES = ("auto", "xla", "cpu")
# The module that reads and writes each family's `config.json`, by the model types it reads.
_FAMILIES = {
    "llama": llama_config,
    "qwen2": llama_config,
    "qwen3": llama_config,
    "gemma4": gemma4_config,
    "gemma4_text": gemma4_config,
    "qwen3_5": qwen3_5_config,
    "qwen3_5_text": qwen3_5_config,
    "qwen3_5_moe": qwen3_5_config,
    "qwen3_5_moe_text": qwen3_5_config,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture plus dtype policy of a decoder-only transformer.

    `dtype` is the compute dtype (activations, matmul inputs); `param_dtype` the storage dtype of
    parameters. Attention scores, softmax and RMSNorm statistics are always computed in float32.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections
    attention_out_bias: bool = False  # bias on the output projection
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on queries and keys before RoPE
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    model_type: str = "llama"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    remat: bool = False
    # Full-sequence passes run the layer scan unrolled (`lax.scan(unroll=num_layers)`): XLA then writes each
    # layer's residuals where the backward pass reads them instead of stacking them into [L, ...] buffers and
    # slicing them out again. For GPUs without remat (SmolLM2's DPO step compiled for an H100: 249 -> 130 GB
    # of memory-bound traffic, `bench/gpu_aot.py`); compile time grows with depth. Sampling ignores it.
    unroll_layers: bool = False
    # Full-sequence passes may take every row's attention mask as a prefix (right padding, as `data.batching`
    # collates every batch): cuDNN's fused attention then runs without its on-device check and block-wise
    # fallback (`fused_attention.fused_causal_attention`). The main job checks each batch on the host.
    right_padded: bool = False
    # How full-sequence passes (training, scoring) attend: 'auto' takes cuDNN's fused kernel on a GPU where it
    # fits and the block-wise one elsewhere; 'blocked' and 'cudnn' force one (`models.fused_attention`).
    attention: str = "auto"
    # The backend the programs are compiled for ('auto': the default backend where the decoder is built; a
    # GPU program compiles on a CPU-only machine with 'gpu') and the kernel set that computes them: 'xla', or
    # 'cpu' for XLA:CPU with the hand-written C++ kernels where they serve ('auto': those on a CPU when they
    # build, unless COEVO_JAX_CPU_KERNELS=0). Both are resolved once, when the decoder is built
    # (`models.kernels.resolve`); nothing reads the backend while tracing.
    platform: str = "auto"
    kernels: str = "auto"
    token_shift: int = 0  # previous tokens mixed into each input embedding (`token_shift`); 0 in checkpoints
    # LoRA (`coevo_jax.models.lora`): rank 0 is full fine-tuning; rank r > 0 adds rank-r adapters to the
    # `lora_targets` projections, scaled by lora_alpha / lora_rank, and only they are trained.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0  # on each adapter's input, in the train steps only
    lora_targets: tuple[str, ...] = LORA_TARGETS
    # Gemma-style options (all off for Llama / Qwen). `layer_types` empty: every layer full attention, one
    # stack of blocks; given: one stack per kind of layer (`layer_kinds`), each kind's blocks built from
    # `kind_config(kind)`. The 'global_*' fields describe the full-attention layers of such a stack.
    hidden_act: str = "silu"  # the MLP's gate activation ('gelu_tanh': GELU, tanh approximation)
    layer_types: tuple[str, ...] = ()
    sliding_window: int = 0  # sliding layers: query t attends positions (t - window, t]
    global_head_dim: int | None = None
    global_kv_heads: int | None = None
    global_rope_theta: float | None = None
    partial_rotary_factor: float = 1.0  # fraction of the rotary pairs that turn (the rest stay at angle 0)
    global_partial_rotary_factor: float = 1.0
    attention_k_eq_v: bool = False  # full-attention layers: values are the key projection's output
    num_kv_shared_layers: int = (
        0  # the last n layers reuse the keys / values of the last earlier one of their type
    )
    double_wide_mlp: bool = False  # the KV-sharing layers' MLP is twice as wide
    query_scale: float | None = None  # attention score scale (None: head_dim ** -0.5)
    value_norm: bool = False  # unscaled RMSNorm over head_dim on values
    sandwich_norm: bool = False  # RMSNorm on the attention and MLP outputs too, before the residual add
    layer_scalar: bool = False  # each block's output multiplied by a learned scalar
    embed_scale: bool = False  # input embeddings multiplied by sqrt(hidden_size)
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    # Qwen3.5's options (all off elsewhere); the 'linear_*' fields describe its `linear_attention` layers.
    zero_centered_norm: bool = False  # every RMSNorm scales by 1 + its stored weight
    rotary_dim: int = 0  # RoPE turns a head's first rotary_dim features as a head of that size (0: all)
    attention_output_gate: bool = False  # attention output times sigmoid of a second query projection
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_width: int = 0  # the causal depthwise convolution over their queries, keys and values
    block_kind: str = ""  # set in `kind_config`'s view of one kind of layer; empty in a model's config

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} not in {SUPPORTED_MODEL_TYPES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        for name, choices in [
            ("attention", ATTENTION_CHOICES),
            ("platform", PLATFORM_CHOICES),
            ("kernels", KERNEL_CHOICES),
        ]:
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} not in {choices}")
        if self.token_shift < 0:
            raise ValueError(f"token_shift={self.token_shift} must be >= 0")
        self._check_layer_types()
        self._check_lora()
        # Canonicalise dtypes so that equal configs hash equally ("bfloat16" == jnp.bfloat16).
        object.__setattr__(self, "dtype", jnp.dtype(self.dtype))
        object.__setattr__(self, "param_dtype", jnp.dtype(self.param_dtype))
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    def _check_lora(self) -> None:
        """Validates the LoRA fields and puts the targets in `LORA_TARGETS` order (equal configs hash equally)."""
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"lora_rank={self.lora_rank!r} must be an integer >= 0")
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha={self.lora_alpha!r} must be > 0")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout!r} must be in [0, 1)")
        targets = (self.lora_targets,) if isinstance(self.lora_targets, str) else tuple(self.lora_targets)
        unknown = sorted(set(targets) - set(LORA_TARGETS))
        if unknown or not targets:
            raise ValueError(f"lora_targets={targets}: each must be one of {LORA_TARGETS} (at least one)")
        object.__setattr__(self, "lora_targets", tuple(t for t in LORA_TARGETS if t in targets))
        object.__setattr__(self, "lora_alpha", float(self.lora_alpha))
        object.__setattr__(self, "lora_dropout", float(self.lora_dropout))

    def _check_layer_types(self) -> None:
        """Validates the per-layer fields (`layer_types` as a tuple, so that equal configs hash equally)."""
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act={self.hidden_act!r} not in {ACTIVATIONS}")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer_types for {self.num_layers} layers")
        unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"layer_types {unknown} not among {LAYER_TYPES}")
        if "linear_attention" in self.layer_types:
            sizes = ("key_heads", "value_heads", "key_head_dim", "value_head_dim", "conv_width")
            if any(getattr(self, f"linear_{n}") < 1 for n in sizes):
                raise ValueError(f"linear_attention layers need linear_{{{', '.join(sizes)}}} >= 1")
            if self.linear_value_heads % self.linear_key_heads:
                raise ValueError("linear_value_heads must be a multiple of linear_key_heads")
        if self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"rotary_dim={self.rotary_dim} must be even and at most head_dim={self.head_dim}"
            )
        if "sliding_attention" in self.layer_types and self.sliding_window < 1:
            raise ValueError(f"sliding layers need sliding_window >= 1, got {self.sliding_window}")
        if not 0 <= self.num_kv_shared_layers < max(self.num_layers, 1):
            raise ValueError(
                f"num_kv_shared_layers={self.num_kv_shared_layers} must leave a layer of its own"
            )
        if self.num_kv_shared_layers and not self.layer_types:
            raise ValueError("KV sharing needs layer_types")
        for i in range(self.num_layers - self.num_kv_shared_layers, self.num_layers):
            if self.kv_source(i) is None:
                raise ValueError(
                    f"layer {i} shares keys / values but no earlier {self.layer_types[i]} layer has them"
                )

    def layer_kind(self, layer: int) -> str:
        """The kind of block layer `layer` is: its type, plus `SHARED_KV` when it reuses another's keys."""
        kind = self.layer_types[layer] if self.layer_types else "full_attention"
        return kind + SHARED_KV if layer >= self.num_layers - self.num_kv_shared_layers else kind

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """The distinct kinds of block, in order of first appearance."""
        return tuple(dict.fromkeys(self.layer_kind(i) for i in range(self.num_layers)))

    def layer_site(self, layer: int) -> tuple[tuple[str, ...], int]:
        """(path of the stacked blocks that hold layer `layer`, its index on their leading axis): the one
        stack ('layers',) without `layer_types`, else ('layers', kind)."""
        if not self.layer_types:
            return ("layers",), layer
        kind = self.layer_kind(layer)
        return ("layers", kind), sum(self.layer_kind(i) == kind for i in range(layer))

    def kv_source(self, layer: int) -> int | None:
        """The layer whose keys / values layer `layer` attends: its own (`layer`) unless it shares them, then
        the last layer before the shared ones of its type (None when there is none)."""
        first_shared = self.num_layers - self.num_kv_shared_layers
        if layer < first_shared:
            return layer
        same = [i for i in range(first_shared) if self.layer_types[i] == self.layer_types[layer]]
        return same[-1] if same else None

    def kind_config(self, kind: str) -> ModelConfig:
        """The config one kind of block is built from: head size, key/value heads, RoPE and window of its
        type; the model's `layer_types` dropped (so it has one stack), `block_kind` set."""
        full = kind.startswith("full_attention")
        shared = kind.endswith(SHARED_KV)
        changes: dict[str, Any] = dict(layer_types=(), num_kv_shared_layers=0, block_kind=kind)
        if full:
            changes.update(sliding_window=0, partial_rotary_factor=self.global_partial_rotary_factor)
            if self.global_head_dim is not None:
                changes["head_dim"] = self.global_head_dim
            if self.global_kv_heads is not None:
                changes["num_kv_heads"] = self.global_kv_heads
            if self.global_rope_theta is not None:
                changes["rope_theta"] = self.global_rope_theta
        else:
            changes["attention_k_eq_v"] = False
        if shared and self.double_wide_mlp:
            changes["intermediate_size"] = 2 * self.intermediate_size
        return self.replace(**changes)

    @property
    def shares_kv(self) -> bool:
        """A `kind_config` view of blocks without key / value projections of their own."""
        return self.block_kind.endswith(SHARED_KV)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (e.g. `dtype=jnp.bfloat16`)."""
        return dataclasses.replace(self, **changes)

    @property
    def lora_scale(self) -> float:
        """alpha / r (rank > 0): the factor of every adapter's output (PEFT's `scaling`, without rsLoRA)."""
        return self.lora_alpha / self.lora_rank

    def without_lora(self) -> ModelConfig:
        """The base architecture: this config with the LoRA fields at their defaults (no adapters)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self) if f.name.startswith("lora_")}
        return self.replace(**defaults)

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any], *, source: str = "config.json", **overrides: Any):
        """Builds a config from a Hugging Face `config.json` dict (transformers 4.x or 5.x layout).

        `source` only serves error messages (the file the dict came from); `overrides` replace fields
        afterwards (typically `dtype`/`param_dtype`). Raises ValueError for unsupported architectures.
        """
        if not isinstance(hf_config, Mapping):
            raise ValueError(f"{source}: expected a JSON object, got {type(hf_config).__name__}")
        model_type = hf_config.get("model_type")
        if model_type not in _FAMILIES:
            raise ValueError(
                f"{source}: unsupported architecture model_type={model_type!r} "
                f"(architectures={hf_config.get('architectures')}); supported model types: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return cls(**{**_FAMILIES[model_type].fields_from_hf(hf_config, source), **overrides})

    def to_hf(self) -> dict[str, Any]:
        """A `config.json` dict that transformers (4.x and 5.x) loads as the matching *ForCausalLM.

        It describes the base architecture: LoRA adapters are exported merged into it (`save_pretrained`)
        or as a PEFT adapter directory (`save_adapter`)."""
        if self.token_shift:
            raise ValueError(
                f"token_shift={self.token_shift}: no Hugging Face architecture has a token shift"
            )
        family = _FAMILIES[self.model_type]
        out = family.to_hf(self)
        back = self.replace(**family.fields_from_hf(out, "to_hf"))
        differs = sorted(
            f.name for f in dataclasses.fields(self) if getattr(back, f.name) != getattr(self, f.name)
        )
        if differs:
            raise ValueError(f"{self.model_type} does not express these fields as they are set: {differs}")
        return out


def text_stack_prefix(hf_config: Mapping[str, Any]) -> str | None:
    """The name prefix of a multimodal checkpoint's language-model tensors (which are read as the text
    model's `model.` ones); None for a text-only checkpoint."""
    family = _FAMILIES.get(hf_config.get("model_type"))
    return None if family is None else family.text_stack_prefix(hf_config)
