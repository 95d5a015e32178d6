"""Analytic FLOP counts of the anchor model (a multiply-add is 2 FLOPs), and what "useful" means.

Useful FLOPs of one forward pass over a sequence of T tokens:
- weight matmuls: 2 * T * (params of q/k/v/o, gate/up/down in every layer + the unembedding [D, V]);
  the embedding lookup is a gather (0 FLOPs), norms, RoPE, softmax and other elementwise work are not
  counted (they are not matmuls, so the matmul ceiling says nothing about them);
- attention: q.k^T and p.v over the causal triangle only, 2 * 2 * H * E * T(T+1)/2: the masked upper
  half is not useful work, whatever an implementation spends on it.
A train step is forward + backward = 3x the forward (the backward has two matmuls per forward matmul);
recomputation (rematerialisation, FlashAttention-style recompute) is never counted as useful.

Decoding one token per row is not limited by FLOPs but by memory traffic: every step reads all matmul
weights once (shared by the batch's rows) and every row's whole KV cache (the sampler's shapes are
static, so all `cache_len` slots are read whether filled or not). `decode_step_bytes` counts that
traffic; over the measured memory bandwidth (`bench/ceiling.py`) it gives a floor on the time per step.
"""

from __future__ import annotations

MODEL_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_dim",
)


def model_fields(cfg) -> dict:
    """The fields the counts here read (`MODEL_FIELDS`), from a `ModelConfig` or any object that has them."""
    return {name: getattr(cfg, name) for name in MODEL_FIELDS}


def matmul_params(model: dict) -> int:
    """Weights that take part in matmuls, per token (the unembedding included, the embedding not)."""
    d, f, v = model["hidden_size"], model["intermediate_size"], model["vocab_size"]
    h, k, e = model["num_heads"], model["num_kv_heads"], model["head_dim"]
    per_layer = d * h * e + 2 * d * k * e + h * e * d + 3 * d * f
    return model["num_layers"] * per_layer + d * v


def forward_flops(model: dict, length: int) -> float:
    """Useful FLOPs of one forward pass over one sequence of `length` tokens."""
    weights = 2.0 * length * matmul_params(model)
    causal_pairs = length * (length + 1) / 2
    attention = model["num_layers"] * 2 * 2.0 * model["num_heads"] * model["head_dim"] * causal_pairs
    return weights + attention


def prefill_flops(model: dict, length: int) -> float:
    """Useful FLOPs of a generation prefill over a `length`-token prompt: the forward pass of every token
    through the layers, but the unembedding of the last token only (generating needs that one's logits)."""
    unembedding_of_the_rest = 2.0 * (length - 1) * model["hidden_size"] * model["vocab_size"]
    return forward_flops(model, length) - unembedding_of_the_rest


def dpo_step_flops(model: dict, pairs: int, length: int, reference_forward: bool) -> float:
    """Useful FLOPs of one DPO step: policy forward+backward on 2*pairs sequences (+ a reference forward)."""
    sequences = 2 * pairs
    per_sequence = forward_flops(model, length)
    return sequences * per_sequence * (3 + (1 if reference_forward else 0))


def decode_step_bytes(model: dict, batch: int, cache_len: int, bytes_per_value: int = 4) -> float:
    """Bytes one decode step must read: the matmul weights once, and every row's keys and values."""
    kv = model["num_layers"] * 2 * batch * model["num_kv_heads"] * cache_len * model["head_dim"]
    return float(bytes_per_value * (matmul_params(model) + kv))
