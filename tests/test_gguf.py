"""Tests for reading GGUF checkpoints: tokenizer rebuild, dequantised tensors, config, errors.

References are independent of our code: transformers' own GGUF loaders (tokenizer and torch model,
test-only) and a torch `LlamaForCausalLM` greedy decode built from our config and tensors.
"""

import os

import gguf
import numpy as np
import pytest

from coevo_jax.checkpoint_formats.gguf import read_gguf, unpermute_rotary_rows
from coevo_jax.tokenization.gguf import load_gguf_tokenizer

# Texts where a run of whitespace never precedes a digit: there transformers' GGUF tokenizer (plain GPT-2
# split) and llama.cpp's "smollm" split (digits first) agree, so ids must be equal as they are.
VARIED_TEXTS = [
    "Hello, world!",
    "The capital of France is",
    "  leading spaces and trailing spaces   ",
    "multiple   spaces\there\t\ttabs\nnew line\n\n\nthree newlines\r\nwindows",
    "digits 0123456789, 3.14159, 1e-10, -42 and 1,000,000",
    "punctuation: !?.,;:'\"()[]{}<>@#$%^&*-_=+~`|\\/",
    "contractions: I'm, you're, it's, we've, they'll, he'd, don't",
    "unicode: café naïve Zürich Ελληνικά русский 中文 日本語 한국어 العربية",
    "emoji: 🙂🚀👩‍💻 and flags 🇫🇷",
    "def f(x):\n    return [i**2 for i in range(x) if i % 2 == 0]  # comment\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    'json: {"key": [1, 2, {"nested": null}], "ok": true}',
    "",
    " ",
    "\n",
    "a",
]
# Whitespace runs before digits: llama.cpp splits digits off first, so `"a  5"` -> `a|ĠĠ|5`, whereas
# transformers' GGUF tokenizer gives `a|Ġ|Ġ|5`. We follow llama.cpp (and SmolLM2's own tokenizer.json).
SPACES_BEFORE_DIGITS_TEXTS = [
    "a  5",
    "x\n\n  7",
    "total:   12 items\n\n2024",
    "indent\n    42\n\t\t3",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf_path):
    return load_gguf_tokenizer(smollm2_gguf_path)


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2_gguf_path):
    """transformers' own GGUF tokenizer conversion, loaded offline from the file's folder."""
    from transformers import AutoTokenizer

    folder, name = os.path.split(smollm2_gguf_path)
    return AutoTokenizer.from_pretrained(folder, gguf_file=name)


def split_digits_off(text: str) -> list[str]:
    """Cut `text` before and after every numeric character, as llama.cpp's `\\p{N}` first pass does."""
    pieces, current = [], ""
    for char in text:
        if char.isnumeric():
            pieces += [current, char] if current else [char]
            current = ""
        else:
            current += char
    return pieces + [current] if current else pieces


def llama_cpp_style_ids(reference_tokenizer, text: str) -> list[int]:
    """Ids llama.cpp gives for a "smollm" vocabulary: digits split off, then GPT-2 BPE on each piece."""
    return [i for piece in split_digits_off(text) for i in reference_tokenizer.encode(piece)]


@pytest.mark.parametrize("text", VARIED_TEXTS + SPACES_BEFORE_DIGITS_TEXTS)
def test_tokenizer_round_trips_text_exactly(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("text", VARIED_TEXTS)
def test_token_ids_equal_transformers_gguf_tokenizer(tokenizer, reference_tokenizer, text):
    assert tokenizer.encode(text) == reference_tokenizer.encode(text)


@pytest.mark.parametrize("text", VARIED_TEXTS + SPACES_BEFORE_DIGITS_TEXTS)
def test_token_ids_follow_llama_cpp_digit_split(tokenizer, reference_tokenizer, text):
    assert tokenizer.encode(text) == llama_cpp_style_ids(reference_tokenizer, text)


def test_whitespace_before_digit_stays_one_token(tokenizer):
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("a  5")) == ["a", "ĠĠ", "5"]


def test_special_tokens_come_from_metadata(tokenizer):
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", 2)
    assert tokenizer.unk_token == "<|endoftext|>"
    assert len(tokenizer) == 49152
    # Control tokens are matched whole and no BOS/EOS is added (add_bos_token is false in the file).
    assert tokenizer.encode("<|im_start|>hi<|im_end|>") == [1, 6004, 2]


def test_chat_template_renders_conversation(tokenizer, reference_tokenizer):
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    assert "<|im_start|>assistant\nParis.<|im_end|>\n" in text
    assert text == reference_tokenizer.apply_chat_template(messages, tokenize=False)
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert tokenizer.decode(ids) == prompt


# --- Checkpoint: config, dequantised tensors, generation -------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(smollm2_gguf_path):
    return read_gguf(smollm2_gguf_path)


@pytest.fixture(scope="module")
def reference_gguf(smollm2_gguf_path):
    """transformers' torch GGUF loading (test-only): its own config parse, dequantisation and q/k un-permute.

    This is the function `from_pretrained(..., gguf_file=...)` runs for llama-arch files; we call it
    directly because `from_pretrained` additionally insists on `accelerate`, which we do not install.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = load_gguf_checkpoint(smollm2_gguf_path, return_tensors=False)["config"]
    with torch.device("meta"):  # only the parameter names are needed, to map GGUF names to HF names
        skeleton = LlamaForCausalLM(LlamaConfig(**config))
    parsed = load_gguf_checkpoint(smollm2_gguf_path, return_tensors=True, model_to_load=skeleton)
    return config, {name: tensor.numpy() for name, tensor in parsed["tensors"].items()}


@pytest.mark.slow  # loads SmolLM2-135M (about 40 s with torch); the synthetic GGUF tests stay quick
def test_config_describes_smollm2(checkpoint, reference_gguf):
    reference_config, _ = reference_gguf
    config = checkpoint.hf_config
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    expected = {
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "torch_dtype": "float32",
    }
    assert {key: config[key] for key in expected} == expected
    for key, value in reference_config.items():
        if key in config:
            assert config[key] == pytest.approx(value), key


@pytest.mark.slow  # loads SmolLM2-135M (about 40 s with torch); the synthetic GGUF tests stay quick
def test_tensors_equal_transformers_torch_gguf_loading(checkpoint, reference_gguf):
    _, reference_tensors = reference_gguf
    assert set(checkpoint.tensors) == set(reference_tensors)
    assert len(checkpoint.tensors) == 2 + 30 * 9  # tied embeddings: no lm_head.weight
    for name, weights in checkpoint.tensors.items():
        assert weights.dtype == np.float32 and weights.flags.writeable, name
        np.testing.assert_allclose(weights, reference_tensors[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.slow  # loads SmolLM2-135M (about 40 s with torch); the synthetic GGUF tests stay quick
def test_llama_q_and_k_rows_are_unpermuted(checkpoint):
    """The raw GGUF rows differ from ours exactly by llama.cpp's interleaving permutation."""
    raw = {tensor.name: tensor for tensor in gguf.GGUFReader(checkpoint.path).tensors}
    for gguf_name, hf_name, heads in [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 9),
        ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", 3),
    ]:
        stored = gguf.quants.dequantize(raw[gguf_name].data, raw[gguf_name].tensor_type)
        ours = checkpoint.tensors[hf_name]
        assert not np.array_equal(stored, ours)
        np.testing.assert_array_equal(llama_cpp_permute(ours, heads), stored)


def llama_cpp_permute(weights, heads):
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved pairs), written independently."""
    head_dim = weights.shape[0] // heads
    order = [
        h * head_dim + member * head_dim // 2 + j
        for h in range(heads)
        for j in range(head_dim // 2)
        for member in range(2)
    ]
    return weights[order]


def test_unpermute_inverts_llama_cpp_permutation():
    rows = np.arange(4 * 8 * 3, dtype=np.float32).reshape(4 * 8, 3)
    np.testing.assert_array_equal(unpermute_rotary_rows(llama_cpp_permute(rows, 4), 4), rows)
    bias = np.arange(2 * 6, dtype=np.float32)
    np.testing.assert_array_equal(unpermute_rotary_rows(llama_cpp_permute(bias, 2), 2), bias)


@pytest.fixture(scope="module")
def torch_model(checkpoint):
    """A test-only torch `LlamaForCausalLM` built from our config and tensors (nothing else)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**checkpoint.hf_config)).eval()
    state = {name: torch.from_numpy(weights) for name, weights in checkpoint.tensors.items()}
    incompatible = model.load_state_dict(state, strict=False)
    assert incompatible.unexpected_keys == [] and incompatible.missing_keys == ["lm_head.weight"]
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    return model


PARIS_PROMPT = "The capital of France is"
PARIS_NEW_TOKENS = 6


@pytest.mark.slow  # loads SmolLM2-135M (about 40 s with torch); the synthetic GGUF tests stay quick
def test_torch_llama_from_our_checkpoint_answers_paris(checkpoint, torch_model):
    import torch

    prompt = checkpoint.tokenizer.encode(PARIS_PROMPT)
    with torch.no_grad():
        output = torch_model.generate(
            torch.tensor([prompt]), max_new_tokens=PARIS_NEW_TOKENS, do_sample=False
        )
    completion = checkpoint.tokenizer.decode(output[0, len(prompt) :])
    assert "Paris" in completion, completion


@pytest.mark.slow  # loads SmolLM2-135M (about 40 s with torch); the synthetic GGUF tests stay quick
def test_nnx_decoder_from_gguf_matches_torch_and_answers_paris(smollm2_gguf_path, checkpoint, torch_model):
    """`load_pretrained(gguf)` (routes through `read_gguf`): logits match torch, greedy decoding says Paris.

    Decoding re-runs the full forward on a fixed-length, right-padded buffer so one jit trace serves all steps.
    """
    import torch
    from flax import nnx

    from coevo_jax.checkpoint_formats import load_pretrained

    model, tokenizer = load_pretrained(smollm2_gguf_path)
    prompt = tokenizer.encode(PARIS_PROMPT)
    assert prompt == checkpoint.tokenizer.encode(PARIS_PROMPT)
    length = len(prompt) + PARIS_NEW_TOKENS
    tokens = np.zeros((1, length), dtype=np.int32)
    tokens[0, : len(prompt)] = prompt
    forward = nnx.jit(lambda model, ids, mask: model(ids, mask))
    for filled in range(len(prompt), length):
        mask = (np.arange(length) < filled).astype(np.int32)[None]
        logits = np.asarray(forward(model, tokens, mask))
        if filled == len(prompt):
            with torch.no_grad():
                reference = torch_model(torch.tensor([prompt])).logits.numpy()
            assert logits.shape == (1, length, 49152)
            np.testing.assert_allclose(logits[:, : len(prompt)], reference, atol=2e-3, rtol=0)
        tokens[0, filled] = int(logits[0, filled - 1].argmax())
    completion = tokenizer.decode(tokens[0, len(prompt) :])
    assert "Paris" in completion, completion


# --- Errors ----------------------------------------------------------------------------------------------


def test_missing_file_raises_file_not_found(tmp_path):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        read_gguf(missing)
    with pytest.raises(FileNotFoundError, match="absent.gguf"):
        load_gguf_tokenizer(missing)


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all\n", b"GGUF"])
def test_non_gguf_file_raises_value_error_naming_it(tmp_path, content):
    path = tmp_path / "bogus.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="bogus.gguf"):
        read_gguf(path)


def write_tiny_gguf(path, architecture, tensors, key_length=None, embedding_length=8, head_count=2):
    """A synthetic GGUF without tokenizer: `architecture`, tiny hyper-parameters, the given float32 tensors."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_context_length(16)
    if isinstance(embedding_length, str):
        writer.add_string(f"{architecture}.embedding_length", embedding_length)
    else:
        writer.add_embedding_length(embedding_length)
    writer.add_feed_forward_length(12)
    writer.add_head_count(head_count)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(10)
    if key_length is not None:
        writer.add_key_length(key_length)
        writer.add_value_length(key_length)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tiny_llama_tensors(hidden=8, inner=12, vocab=10, heads=2, kv_heads=1):
    """HF-shaped random tensors for a one-layer llama with the hyper-parameters of `write_tiny_gguf`."""
    rng = np.random.default_rng(0)
    head_dim = hidden // heads
    shapes = {
        "token_embd.weight": (vocab, hidden),
        "output_norm.weight": (hidden,),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (heads * head_dim, hidden),
        "blk.0.attn_k.weight": (kv_heads * head_dim, hidden),
        "blk.0.attn_v.weight": (kv_heads * head_dim, hidden),
        "blk.0.attn_output.weight": (hidden, heads * head_dim),
        "blk.0.ffn_gate.weight": (inner, hidden),
        "blk.0.ffn_up.weight": (inner, hidden),
        "blk.0.ffn_down.weight": (hidden, inner),
    }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_tiny_synthetic_llama_reads_back(tmp_path):
    tensors = tiny_llama_tensors()
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama", tensors)
    checkpoint = read_gguf(path, with_tokenizer=False)
    assert checkpoint.tokenizer is None and checkpoint.hf_config["head_dim"] == 4
    assert_loads_into_transformers(checkpoint)
    np.testing.assert_array_equal(
        checkpoint.tensors["model.layers.0.mlp.down_proj.weight"], tensors["blk.0.ffn_down.weight"]
    )
    np.testing.assert_array_equal(
        checkpoint.tensors["model.layers.0.self_attn.k_proj.weight"],
        unpermute_rotary_rows(tensors["blk.0.attn_k.weight"], 1),
    )


def assert_loads_into_transformers(checkpoint):
    """Our config builds the named transformers class, and our tensors fill it exactly (strict names/shapes)."""
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**checkpoint.hf_config)
    model = getattr(transformers, checkpoint.hf_config["architectures"][0])(config)
    state = {name: torch.from_numpy(weights) for name, weights in checkpoint.tensors.items()}
    incompatible = model.load_state_dict(state, strict=False)
    tied = ["lm_head.weight"] if checkpoint.hf_config["tie_word_embeddings"] else []
    assert incompatible.unexpected_keys == [] and incompatible.missing_keys == tied


def test_tiny_synthetic_qwen2_keeps_rows_and_biases(tmp_path):
    rng = np.random.default_rng(1)
    tensors = tiny_llama_tensors()
    tensors |= {
        "blk.0.attn_q.bias": rng.standard_normal(8).astype(np.float32),
        "blk.0.attn_k.bias": rng.standard_normal(4).astype(np.float32),
        "blk.0.attn_v.bias": rng.standard_normal(4).astype(np.float32),
        "output.weight": rng.standard_normal((10, 8)).astype(np.float32),
    }
    path = tmp_path / "tiny-qwen2.gguf"
    write_tiny_gguf(path, "qwen2", tensors)
    checkpoint = read_gguf(path)
    assert checkpoint.tokenizer is None  # the file has no tokenizer metadata
    config = checkpoint.hf_config
    assert (config["model_type"], config["architectures"]) == ("qwen2", ["Qwen2ForCausalLM"])
    assert config["attention_bias"] is True and config["tie_word_embeddings"] is False
    for gguf_name, hf_name in [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),  # no un-permute for qwen
        ("blk.0.attn_k.bias", "model.layers.0.self_attn.k_proj.bias"),
        ("output.weight", "lm_head.weight"),
    ]:
        np.testing.assert_array_equal(checkpoint.tensors[hf_name], tensors[gguf_name])
    assert_loads_into_transformers(checkpoint)


def test_tiny_synthetic_qwen3_reads_qk_norms_and_head_dim(tmp_path):
    """Qwen3 may have head_dim * heads != hidden_size; `attention.key_length` gives head_dim."""
    rng = np.random.default_rng(2)
    tensors = tiny_llama_tensors()
    head_dim = 6
    tensors |= {
        "blk.0.attn_q.weight": rng.standard_normal((2 * head_dim, 8)).astype(np.float32),
        "blk.0.attn_k.weight": rng.standard_normal((head_dim, 8)).astype(np.float32),
        "blk.0.attn_v.weight": rng.standard_normal((head_dim, 8)).astype(np.float32),
        "blk.0.attn_output.weight": rng.standard_normal((8, 2 * head_dim)).astype(np.float32),
        "blk.0.attn_q_norm.weight": rng.standard_normal(head_dim).astype(np.float32),
        "blk.0.attn_k_norm.weight": rng.standard_normal(head_dim).astype(np.float32),
    }
    path = tmp_path / "tiny-qwen3.gguf"
    write_tiny_gguf(path, "qwen3", tensors, key_length=head_dim)
    checkpoint = read_gguf(path)
    assert checkpoint.hf_config["model_type"] == "qwen3" and checkpoint.hf_config["head_dim"] == head_dim
    np.testing.assert_array_equal(
        checkpoint.tensors["model.layers.0.self_attn.q_norm.weight"], tensors["blk.0.attn_q_norm.weight"]
    )
    np.testing.assert_array_equal(
        checkpoint.tensors["model.layers.0.self_attn.q_proj.weight"], tensors["blk.0.attn_q.weight"]
    )
    assert_loads_into_transformers(checkpoint)


def test_unknown_tensor_name_raises_naming_file_and_tensor(tmp_path):
    tensors = tiny_llama_tensors() | {"blk.0.mystery.weight": np.zeros(8, dtype=np.float32)}
    path = tmp_path / "extra.gguf"
    write_tiny_gguf(path, "llama", tensors)
    with pytest.raises(ValueError, match=r"extra\.gguf.*blk\.0\.mystery\.weight"):
        read_gguf(path)


def test_unknown_architecture_raises_value_error(tmp_path):
    path = tmp_path / "mystery.gguf"
    write_tiny_gguf(path, "mamba9000", tiny_llama_tensors())
    with pytest.raises(ValueError, match=r"mystery\.gguf.*mamba9000"):
        read_gguf(path)


def test_missing_tensor_raises_naming_file_and_tensor(tmp_path):
    tensors = tiny_llama_tensors()
    del tensors["blk.0.ffn_up.weight"]
    path = tmp_path / "holey.gguf"
    write_tiny_gguf(path, "llama", tensors)
    with pytest.raises(ValueError, match=r"holey\.gguf.*model\.layers\.0\.mlp\.up_proj\.weight"):
        read_gguf(path, with_tokenizer=False)


def test_misshaped_tensor_raises_naming_file_and_tensor(tmp_path):
    tensors = tiny_llama_tensors()
    tensors["blk.0.ffn_gate.weight"] = np.zeros((13, 8), dtype=np.float32)
    path = tmp_path / "warped.gguf"
    write_tiny_gguf(path, "llama", tensors)
    with pytest.raises(ValueError, match=r"warped\.gguf.*gate_proj.*\(13, 8\)"):
        read_gguf(path, with_tokenizer=False)


@pytest.mark.parametrize(
    "metadata, message",
    [
        ({"head_count": 0}, r"llama\.attention\.head_count must be a positive integer, got 0"),
        ({"embedding_length": "8"}, r"llama\.embedding_length must be a positive integer, got '8'"),
    ],
)
def test_bad_hyper_parameters_are_named(tmp_path, metadata, message):
    path = tmp_path / "bad_meta.gguf"
    write_tiny_gguf(path, "llama", tiny_llama_tensors(), **metadata)
    with pytest.raises(ValueError, match=rf"GGUF file .*bad_meta\.gguf: metadata {message}"):
        read_gguf(path, with_tokenizer=False)
