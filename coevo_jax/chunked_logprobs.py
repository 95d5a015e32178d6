"""Token log-probs from final hidden states and the unembedding, a chunk of tokens at a time (memory-lean).

`token_logprobs_from_hidden(hidden, unembed, targets)` gives the numbers of
`losses.token_logprobs(hidden @ unembed, targets)` without materialising the [B, T, V] logits at once: the
sequence axis is cut into chunks that are scanned, and the gradient is written by hand (onehot - softmax)
as a custom VJP whose backward either reuses the forward's logits (while they are small) or recomputes each
chunk's. Plain JAX, no Flax: the train steps' objectives and `losses`' memory-lean forms build on it.

Shape legend: B batch, T tokens, C tokens per chunk, K chunks, V vocabulary, D hidden size, N = B*T.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

# Above this many bytes of [N, V] float32 logits, the backward pass recomputes each chunk's logits instead of
# keeping the forward's (for T=4096, V=32k, B=8 they would take 4 GiB). Keeping them saves the backward one
# [N, D] x [D, V] product; `keep_logits=True` keeps them whatever their size (a GPU with memory to spare).
KEEP_LOGITS_MAX_BYTES = 512 << 20


def _chunk_logits(hidden_BxCxD, unembed_DxV, temperature=1.0, softcap=None):
    """Float32 logits / temperature [B, C, V] of one chunk (the forward, and the backward when it
    recomputes them); with `softcap`, soft-capped first (cap * tanh(logits / cap))."""
    logits = jnp.einsum("bcd,dv->bcv", hidden_BxCxD, unembed_DxV, preferred_element_type=jnp.float32)
    if softcap is not None:
        logits = softcap * jnp.tanh(logits / softcap)
    return logits if temperature == 1.0 else logits / temperature


def _chunk_forward(hidden_BxCxD, unembed_DxV, targets_BxC, temperature=1.0, softcap=None):
    """(token log-probs [B, C], log-normaliser [B, C], logits [B, C, V]) of one chunk, float32."""
    logits_BxCxV = _chunk_logits(hidden_BxCxD, unembed_DxV, temperature, softcap)
    log_normaliser_BxC = jax.nn.logsumexp(logits_BxCxV, axis=-1)
    target_BxC = jnp.take_along_axis(logits_BxCxV, targets_BxC[..., None], axis=-1)[..., 0]
    return target_BxC - log_normaliser_BxC, log_normaliser_BxC, logits_BxCxV


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _scan_logprobs(hidden_KxBxCxD, unembed_DxV, targets_KxBxC, keep_logits, temperature, softcap):
    """Token log-probs [K, B, C] of K chunks of C tokens per row (see `token_logprobs_from_hidden`)."""
    return _scan_logprobs_fwd(hidden_KxBxCxD, unembed_DxV, targets_KxBxC, False, temperature, softcap)[0]


def _scan_logprobs_fwd(hidden_KxBxCxD, unembed_DxV, targets_KxBxC, keep_logits, temperature, softcap):
    def body(_, chunk):
        logps, log_normaliser, logits = _chunk_forward(chunk[0], unembed_DxV, chunk[1], temperature, softcap)
        return None, (logps, log_normaliser, logits if keep_logits else None)

    _, (logps, log_normaliser, logits) = jax.lax.scan(body, None, (hidden_KxBxCxD, targets_KxBxC))
    return logps, (hidden_KxBxCxD, unembed_DxV, targets_KxBxC, log_normaliser, logits)


def _scan_logprobs_bwd(keep_logits, temperature, softcap, residuals, d_logps_KxBxC):
    """d logp_t / d logits = (onehot(target_t) - softmax(logits / T)) / T: no scatter; the forward's
    logits if kept, else each chunk's recomputed; times 1 - tanh^2 of the soft cap's argument with one."""
    hidden_KxBxCxD, unembed_DxV, targets_KxBxC, log_normaliser_KxBxC, logits_KxBxCxV = residuals
    vocab = unembed_DxV.shape[1]

    def body(d_unembed_DxV, chunk):
        hidden_BxCxD, targets_BxC, log_normaliser_BxC, d_logps_BxC, logits_BxCxV = chunk
        if logits_BxCxV is None:
            logits_BxCxV = _chunk_logits(hidden_BxCxD, unembed_DxV, temperature, softcap)
        probs_BxCxV = jnp.exp(logits_BxCxV - log_normaliser_BxC[..., None])
        onehot_BxCxV = targets_BxC[..., None] == jnp.arange(vocab, dtype=targets_BxC.dtype)
        d_logps = d_logps_BxC.astype(jnp.float32)
        d_logps = d_logps if temperature == 1.0 else d_logps / temperature
        d_logits = d_logps[..., None] * (onehot_BxCxV.astype(jnp.float32) - probs_BxCxV)
        if softcap is not None:  # d(cap * tanh(z / cap)) / dz = 1 - (capped / cap)^2
            d_logits = d_logits * (1.0 - jnp.square(logits_BxCxV * temperature / softcap))
        d_logits_BxCxV = d_logits.astype(unembed_DxV.dtype)
        d_hidden_BxCxD = jnp.einsum(
            "bcv,dv->bcd", d_logits_BxCxV, unembed_DxV, preferred_element_type=jnp.float32
        )
        d_unembed_DxV = d_unembed_DxV + jnp.einsum(
            "bcd,bcv->dv", hidden_BxCxD, d_logits_BxCxV, preferred_element_type=jnp.float32
        )
        return d_unembed_DxV, d_hidden_BxCxD.astype(hidden_BxCxD.dtype)

    chunks = (hidden_KxBxCxD, targets_KxBxC, log_normaliser_KxBxC, d_logps_KxBxC, logits_KxBxCxV)
    d_unembed, d_hidden = jax.lax.scan(body, jnp.zeros(unembed_DxV.shape, jnp.float32), chunks)
    return d_hidden, d_unembed.astype(unembed_DxV.dtype), None


_scan_logprobs.defvjp(_scan_logprobs_fwd, _scan_logprobs_bwd)


def keeps_logits(num_tokens: int, vocab_size: int) -> bool:
    """Whether the backward pass keeps all [N, V] float32 logits by default (see KEEP_LOGITS_MAX_BYTES)."""
    return num_tokens * vocab_size * 4 <= KEEP_LOGITS_MAX_BYTES


def token_logprobs_from_hidden(
    hidden_BxTxD: jax.Array,
    unembed_DxV: jax.Array,
    targets_BxT: jax.Array,
    chunk_size: int = 1024,
    keep_logits: bool | None = None,
    temperature: float = 1.0,
    softcap: float | None = None,
) -> jax.Array:
    """Same numbers as `token_logprobs(hidden @ unembed / temperature, targets)` without materialising
    [B, T, V] logits. `temperature` (a Python float) gives the log-probs of the tempered distribution a
    sampler draws from (GRPO's importance ratio needs the trainer's and the sampler's to agree); `softcap`
    soft-caps the logits first, as the model does (`ModelConfig.final_logit_softcap`).

    The gradient is written by hand (onehot - softmax). The backward reuses the forward's logits while all
    of them take at most KEEP_LOGITS_MAX_BYTES (`keep_logits=None`; True keeps them at any size, False
    never); those are computed in one chunk. Otherwise the sequence axis is cut into chunks of
    `chunk_size // B` positions (at least one), so a chunk holds at most `chunk_size` tokens, the chunks are
    scanned (rows stay a batch axis of every chunk and keep their sharding) and the backward recomputes each
    chunk's logits: peak memory stays one [chunk, V] float32 block (for T=4096, V=32k, B=8: 128 MiB instead
    of 4 GiB) for one more [N, D] x [D, V] product.
    """
    batch, length, hidden_size = hidden_BxTxD.shape
    if keep_logits is None:
        keep_logits = keeps_logits(batch * length, unembed_DxV.shape[1])
    # Kept logits are computed in one chunk: chunks bound memory only when the backward recomputes them, and
    # a scan would copy each chunk's logits into a stacked buffer (on a GPU, 2x their bytes).
    chunk_len = length if keep_logits else max(1, min(length, chunk_size // batch))
    num_chunks = -(-length // chunk_len)
    padded = num_chunks * chunk_len
    pad = padded - length
    hidden = jnp.pad(hidden_BxTxD, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets_BxT.astype(jnp.int32), ((0, 0), (0, pad)))
    hidden_KxBxCxD = hidden.reshape(batch, num_chunks, chunk_len, hidden_size).swapaxes(0, 1)
    targets_KxBxC = targets.reshape(batch, num_chunks, chunk_len).swapaxes(0, 1)
    logps_KxBxC = _scan_logprobs(
        hidden_KxBxCxD,
        unembed_DxV,
        targets_KxBxC,
        bool(keep_logits),
        float(temperature),
        None if softcap is None else float(softcap),
    )
    return logps_KxBxC.swapaxes(0, 1).reshape(batch, padded)[:, :length]
