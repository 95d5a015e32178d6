"""The anchor model for the tunix peers: tunix's own Llama3 module at the anchor shape, random init.

Imported by `tunix_dpo.py` and `tunix_sample.py`, which run in bench/.venvs/tunix. Two things in tunix
0.1.7's `tunix.models.llama3.model` are set right here, neither changing the cost of a step:
- `Attention.block` calls `apply_rope` without the config's `rope_theta`, so RoPE always ran at theta
  1e6; the module's `apply_rope` is rebound to the anchor's theta (1e4).
- the MLP kernels are zero-initialized (meant to be overwritten by a checkpoint); they are redrawn
  from a normal distribution like the rest, so the model really is random-init.
tunix's Llama3 has no dtype setting: a bfloat16 model is the float32 one with every parameter cast.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
if str(BENCH) not in sys.path:  # bench/common.py, the anchor shared with our own scripts
    sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from tunix.models.llama3 import model as llama3  # noqa: E402

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

if not isinstance(llama3.apply_rope, functools.partial):
    llama3.apply_rope = functools.partial(llama3.apply_rope, rope_theta=common.MODEL["rope_theta"])


def check_device(device: str) -> None:
    """Fails unless JAX's default backend is the one asked for (cpu, or gpu/cuda)."""
    backend = jax.default_backend()
    wanted = "gpu" if device in ("gpu", "cuda") else device
    if backend != wanted:
        raise SystemExit(f"--device {device}: JAX's default backend is {backend}")


def llama_config() -> llama3.ModelConfig:
    """`common.MODEL`, the anchor shape."""
    m = common.MODEL
    return llama3.ModelConfig(
        num_layers=m["num_layers"],
        vocab_size=m["vocab_size"],
        embed_dim=m["hidden_size"],
        hidden_dim=m["intermediate_size"],
        num_heads=m["num_heads"],
        head_dim=m["head_dim"],
        num_kv_heads=m["num_kv_heads"],
        rope_theta=int(m["rope_theta"]),
        norm_eps=m["rms_norm_eps"],
        weight_tying=m["tie_word_embeddings"],
    )


def build_model(dtype: str = "float32", seed: int = 0) -> llama3.Llama3:
    """Random-init Llama3 (the same weights for the same seed), parameters cast to `dtype`."""
    model = llama3.Llama3(llama_config(), rngs=nnx.Rngs(seed))
    init = nnx.initializers.normal()
    keys = iter(jax.random.split(jax.random.key(seed + 1), 3 * len(model.layers)))
    for layer in model.layers:
        for proj in (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            proj.kernel.value = init(next(keys), proj.kernel.value.shape, jnp.float32)
    if dtype != "float32":
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda x: x.astype(DTYPES[dtype]), params))
    return model


def block(model: nnx.Module) -> None:
    """Waits until every parameter of `model` has been computed."""
    jax.block_until_ready(nnx.state(model))
