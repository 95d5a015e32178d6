"""The scratch policy's tokenizer: trained on the experts' text once per workdir, then reloaded from there.

A resumed run (or a later stage of the same run) must tokenize exactly as the first one did, so the trained
tokenizer is saved in the workdir (atomically) and never retrained.
"""

from __future__ import annotations

import os

from transformers import AutoTokenizer

from coevo_jax.atomic_files import atomic_path
from coevo_jax.tokenization.training import train_tokenizer_for_trajectories

TOKENIZER_DIR = "tokenizer"


def scratch_tokenizer(workdir: str, experts, vocab_size: int):
    """The tokenizer trained on the experts' text, saved in the workdir once and reloaded on resume."""
    path = os.path.join(workdir, TOKENIZER_DIR)
    if os.path.isdir(path):
        return AutoTokenizer.from_pretrained(path)
    tokenizer = train_tokenizer_for_trajectories(experts, vocab_size=vocab_size)
    with atomic_path(path) as tmp:
        tokenizer.save_pretrained(tmp)
    return tokenizer
