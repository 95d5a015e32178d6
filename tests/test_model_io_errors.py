"""Checkpoint I/O edge cases: bad inputs fail loudly (naming file and tensor), saving is all-or-nothing,
sharded and bfloat16 checkpoints, tokenizers, the GGUF route and the placement callback."""

import json
import os
import shutil
import sys
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from model_fixtures import KITCHEN_SINK, random_decoder
from safetensors.numpy import load_file, save_file

from coevo_jax.checkpoint_formats import CheckpointError, load_pretrained, save_pretrained
from coevo_jax.checkpoint_formats import loading as loading_module
from coevo_jax.models import Decoder, ModelConfig

TINY = KITCHEN_SINK.replace(
    model_type="llama", qk_norm=False, num_layers=1, rope_scaling=None, vocab_size=64, token_shift=0
)
IDS = jnp.asarray(np.arange(12, dtype=np.int32).reshape(2, 6) % 64)
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def tiny_model():
    return random_decoder(TINY, seed=3)


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_pretrained(tiny_model, path)
    return path


@pytest.fixture
def checkpoint_copy(tiny_checkpoint, tmp_path):
    """A private, writable copy of the tiny checkpoint."""
    return shutil.copytree(tiny_checkpoint, tmp_path / "copy")


def _rewrite_weights(checkpoint_dir, edit):
    weights_path = os.path.join(checkpoint_dir, "model.safetensors")
    tensors = load_file(weights_path)
    edit(tensors)
    save_file(tensors, weights_path, metadata={"format": "pt"})
    return weights_path


def test_roundtrip_is_exact(tiny_model, tiny_checkpoint):
    loaded, tokenizer = load_pretrained(tiny_checkpoint)
    assert tokenizer is None and loaded.config == tiny_model.config  # TINY, resolved where it was built
    np.testing.assert_array_equal(loaded(IDS), tiny_model(IDS))


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_pretrained(tmp_path / "nowhere")


def test_missing_config_and_missing_weights(checkpoint_copy):
    os.remove(checkpoint_copy / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_pretrained(checkpoint_copy)
    os.remove(checkpoint_copy / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_pretrained(checkpoint_copy)


def test_unknown_architecture_names_file_and_type(checkpoint_copy):
    config_path = checkpoint_copy / "config.json"
    config = json.loads(config_path.read_text())
    config.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*'gpt2'.*GPT2LMHeadModel"):
        load_pretrained(checkpoint_copy)


def test_shape_mismatch_names_file_and_tensor(checkpoint_copy):
    weights = _rewrite_weights(checkpoint_copy, lambda t: t.update({Q_PROJ: t[Q_PROJ][:-1]}))
    with pytest.raises(CheckpointError, match=rf"{weights}: tensor '{Q_PROJ}' has shape \(63, 64\)"):
        load_pretrained(checkpoint_copy)


def test_missing_tensor_names_file_and_tensor(checkpoint_copy):
    weights = _rewrite_weights(checkpoint_copy, lambda t: t.pop(Q_PROJ))
    with pytest.raises(CheckpointError, match=rf"{weights}: missing tensor '{Q_PROJ}'"):
        load_pretrained(checkpoint_copy)


def test_unexpected_tensor_names_file_and_tensor(checkpoint_copy):
    extra = "model.layers.0.mystery.weight"
    weights = _rewrite_weights(checkpoint_copy, lambda t: t.update({extra: np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=rf"{weights}: unexpected tensor '{extra}'"):
        load_pretrained(checkpoint_copy)


def test_sharded_checkpoint_loads_and_missing_shard_is_named(tiny_model, checkpoint_copy):
    tensors = load_file(checkpoint_copy / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, checkpoint_copy / shard, metadata={"format": "pt"})
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (checkpoint_copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    os.remove(checkpoint_copy / "model.safetensors")
    loaded, _ = load_pretrained(checkpoint_copy)
    np.testing.assert_array_equal(loaded(IDS), tiny_model(IDS))

    os.remove(checkpoint_copy / "model-00002-of-00002.safetensors")
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_pretrained(checkpoint_copy)


def test_bfloat16_checkpoint(tiny_model, tmp_path):
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(tiny_model))
    bf16_graph = nnx.graphdef(
        nnx.eval_shape(lambda: Decoder(TINY.replace(param_dtype=jnp.bfloat16), rngs=nnx.Rngs(0)))
    )
    save_pretrained(nnx.merge(bf16_graph, bf16_params), tmp_path / "bf16")
    assert load_file(tmp_path / "bf16" / "model.safetensors")[Q_PROJ].dtype == ml_dtypes.bfloat16
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"

    as_f32, _ = load_pretrained(tmp_path / "bf16")
    as_bf16, _ = load_pretrained(tmp_path / "bf16", param_dtype=jnp.bfloat16, dtype=jnp.bfloat16)
    assert as_f32.embed[...].dtype == jnp.float32 and as_bf16.embed[...].dtype == jnp.bfloat16
    reference = np.asarray(tiny_model(IDS))
    scale = np.abs(reference).max()
    assert np.abs(np.asarray(as_f32(IDS)) - reference).max() < 0.05 * scale
    assert np.abs(np.asarray(as_bf16(IDS)) - reference).max() < 0.05 * scale


def test_failed_save_leaves_nothing_and_keeps_old_checkpoint(tiny_model, tmp_path, monkeypatch):
    def exploding_writer(path, tensors, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(loading_module, "write_safetensors", exploding_writer)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(tiny_model, tmp_path / "out")
    assert os.listdir(tmp_path) == []

    monkeypatch.undo()
    save_pretrained(tiny_model, tmp_path / "out")
    before = (tmp_path / "out" / "model.safetensors").read_bytes()
    monkeypatch.setattr(loading_module, "write_safetensors", exploding_writer)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(tiny_model, tmp_path / "out")
    assert os.listdir(tmp_path) == ["out"]
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == before


def test_save_overwrites_existing_checkpoint(tiny_model, tiny_checkpoint, tmp_path):
    target = shutil.copytree(tiny_checkpoint, tmp_path / "out")
    other = random_decoder(TINY, seed=7)
    save_pretrained(other, target)
    assert sorted(os.listdir(tmp_path)) == ["out"]
    loaded, _ = load_pretrained(target)
    np.testing.assert_array_equal(loaded(IDS), other(IDS))


def test_tokenizer_is_saved_and_loaded(tiny_model, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
    save_pretrained(tiny_model, tmp_path / "with_tok", tokenizer=tokenizer)
    _, loaded_tokenizer = load_pretrained(tmp_path / "with_tok")
    assert loaded_tokenizer("hello world")["input_ids"] == [3, 4]
    assert loaded_tokenizer.eos_token == "</s>"


def test_gguf_route_and_placement_callback(tiny_model, tiny_checkpoint, tmp_path, monkeypatch):
    """`.gguf` files go through `checkpoint_formats.gguf.read_gguf` (faked here) and the same tensor mapping."""
    hf_config = json.loads((tiny_checkpoint / "config.json").read_text())
    tensors = load_file(tiny_checkpoint / "model.safetensors")
    fake = types.ModuleType("coevo_jax.checkpoint_formats.gguf")
    fake.read_gguf = lambda path: types.SimpleNamespace(
        hf_config=hf_config, tensors=dict(tensors), tokenizer="tok"
    )
    monkeypatch.setitem(sys.modules, "coevo_jax.checkpoint_formats.gguf", fake)
    gguf_path = tmp_path / "tiny.gguf"
    gguf_path.write_bytes(b"")

    placed = {}

    def place(name, value, logical_axes):
        placed[name] = logical_axes
        return jnp.asarray(value)

    loaded, tokenizer = load_pretrained(gguf_path, place=place)
    assert tokenizer == "tok"
    np.testing.assert_array_equal(loaded(IDS), tiny_model(IDS))
    stacked_q_proj = Q_PROJ.replace(".0.", ".*.")  # every layer's q_proj, placed as one stacked weight
    assert placed[stacked_q_proj] == ("layers", "embed", "q_heads", "head_dim")
    assert len(placed) == len(nnx.to_flat_state(nnx.state(loaded)))

    del tensors["model.norm.weight"]
    with pytest.raises(CheckpointError, match=rf"{gguf_path}: missing tensor 'model.norm.weight'"):
        load_pretrained(gguf_path)


def test_other_files_are_rejected(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="weights.bin"):
        load_pretrained(path)


def test_inexpressible_config_is_rejected_before_writing(tmp_path):
    bad = random_decoder(TINY.replace(model_type="qwen2", attention_out_bias=True), seed=0)
    with pytest.raises(ValueError, match="qwen2"):
        save_pretrained(bad, tmp_path / "bad")
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig(**{**TINY.__dict__, "model_type": "gpt2"})


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.pop("hidden_size"), r"config\.json: missing field 'hidden_size'"),
        (
            lambda c: c.update(num_attention_heads="two"),
            r"config\.json: field 'num_attention_heads' must be a positive integer, got 'two'",
        ),
        (
            lambda c: c.update(num_attention_heads=0),
            r"field 'num_attention_heads' must be a positive integer, got 0",
        ),
        (lambda c: c.update(vocab_size=64.5), r"field 'vocab_size' must be a positive integer, got 64.5"),
    ],
)
def test_bad_config_fields_are_named(checkpoint_copy, edit, message):
    config_path = checkpoint_copy / "config.json"
    config = json.loads(config_path.read_text())
    edit(config)
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        load_pretrained(checkpoint_copy)


def test_a_config_that_is_not_an_object_is_named(checkpoint_copy):
    config_path = checkpoint_copy / "config.json"
    config_path.write_text(json.dumps([json.loads(config_path.read_text())]))
    with pytest.raises(ValueError, match=r"config\.json: expected a JSON object, got list"):
        load_pretrained(checkpoint_copy)
    with pytest.raises(ValueError, match=r"<dict>: expected a JSON object, got list"):
        ModelConfig.from_hf([], source="<dict>")


@pytest.mark.parametrize("damage", ["truncated", "random"])
def test_a_corrupt_safetensors_file_is_named(checkpoint_copy, damage):
    weights = checkpoint_copy / "model.safetensors"
    data = weights.read_bytes()
    damaged = data[: len(data) // 2] if damage == "truncated" else np.random.default_rng(0).bytes(len(data))
    weights.write_bytes(damaged)
    with pytest.raises(ValueError, match=rf"{weights}: not a readable safetensors file"):
        load_pretrained(checkpoint_copy)


def test_a_token_shift_model_is_refused_by_the_hf_export_before_anything_is_written(tmp_path):
    model = random_decoder(TINY.replace(token_shift=2))
    with pytest.raises(ValueError, match="token_shift=2"):
        save_pretrained(model, tmp_path / "out")
    assert not os.listdir(tmp_path)
