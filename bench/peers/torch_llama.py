"""The anchor model for the torch peers (TRL, transformers): a random-init `LlamaForCausalLM`.

Imported by `trl_dpo.py` and `hf_generate.py`, which run in bench/.venvs/trl. Besides the model it builds
the smallest tokenizer that TRL insists on (`processing_class`): a word-level vocabulary in which the
id of every token is its own anchor id, so nothing a tokenizer does can change the ids we feed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
if str(BENCH) not in sys.path:  # bench/common.py, the anchor shared with our own scripts
    sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

SPECIAL = {common.PAD_ID: "<pad>", common.BOS_ID: "<s>", common.EOS_ID: "</s>"}


def setup_device(device: str) -> torch.device:
    """All cores for torch on CPU; checks that a requested GPU is there."""
    if device == "cpu":
        torch.set_num_threads(os.cpu_count())
    elif not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: torch sees no CUDA device")
    return torch.device(device)


def synchronize(device: torch.device) -> None:
    """Waits for queued GPU work so that wall-clock timings are honest (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def llama_config(attn_implementation: str) -> LlamaConfig:
    """`common.MODEL`, the anchor shape."""
    m = common.MODEL
    return LlamaConfig(
        vocab_size=m["vocab_size"],
        hidden_size=m["hidden_size"],
        intermediate_size=m["intermediate_size"],
        num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_heads"],
        num_key_value_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
        rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"]},
        rms_norm_eps=m["rms_norm_eps"],
        tie_word_embeddings=m["tie_word_embeddings"],
        max_position_embeddings=1024,
        pad_token_id=common.PAD_ID,
        bos_token_id=common.BOS_ID,
        eos_token_id=common.EOS_ID,
        attn_implementation=attn_implementation,
    )


def build_model(attn_implementation: str, device: torch.device, dtype=torch.float32, seed: int = 0):
    """Random-init LlamaForCausalLM (the same weights for the same seed)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(attn_implementation))
    return model.to(device=device, dtype=dtype)


def id_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer whose token `t{i}` has id i (specials: <pad> 0, <s> 1, </s> 2)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {SPECIAL.get(i, f"t{i}"): i for i in range(common.MODEL["vocab_size"])}
    backend = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<pad>",
        padding_side="left",
    )
