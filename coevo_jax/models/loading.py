"""`load_pretrained` / `save_pretrained`: Hugging Face checkpoint directories and GGUF files.

A checkpoint directory holds `config.json` plus `model.safetensors` (or a sharded
`model.safetensors.index.json`), optionally tokenizer files; a `.gguf` file is decoded by
`coevo_jax.models.gguf.read_gguf` into the same HF config dict and HF-named tensors. Both feed
`hf_params.decoder_from_hf_tensors`, which reads and places one tensor at a time.

Saving writes HF names and torch layouts that `transformers.AutoModelForCausalLM.from_pretrained` loads,
into a temporary sibling directory that is renamed into place only once complete.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from coevo_jax.models.config import ModelConfig
from coevo_jax.models.decoder import Decoder
from coevo_jax.models.hf_params import (
    PlaceFn,
    TensorSource,
    decoder_from_hf_tensors,
    hf_tensors_from_decoder,
    tensor_mappings,
)
from coevo_jax.models.safetensors_io import SINGLE_FILE, open_safetensors, write_safetensors

CONFIG_FILE = "config.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _dtype_overrides(dtype, param_dtype) -> dict[str, Any]:
    overrides = {}
    if dtype is not None:
        overrides["dtype"] = dtype
    if param_dtype is not None:
        overrides["param_dtype"] = param_dtype
    return overrides


def read_hf_config(checkpoint_dir: str) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint directory."""
    path = os.path.join(checkpoint_dir, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: missing (not a Hugging Face checkpoint directory?)")
    with open(path, "rb") as f:
        try:
            config = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: invalid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def _load_tokenizer(checkpoint_dir: str):
    if not any(os.path.exists(os.path.join(checkpoint_dir, name)) for name in _TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True)


def _load_gguf(path: str, overrides: dict[str, Any], place: PlaceFn | None):
    gguf = importlib.import_module("coevo_jax.models.gguf").read_gguf(path)
    cfg = ModelConfig.from_hf(gguf.hf_config, source=path, **overrides)
    tensors = gguf.tensors

    def read(name: str) -> np.ndarray:
        return tensors.pop(name)  # drop our reference as soon as the tensor is placed

    source = TensorSource(names=frozenset(tensors), read=read, location=lambda name: path)
    return decoder_from_hf_tensors(cfg, source, place), gguf.tokenizer


def load_pretrained(
    path: str | os.PathLike,
    *,
    dtype=None,
    param_dtype=None,
    place: PlaceFn | None = None,
) -> tuple[Decoder, Any]:
    """Loads (model, tokenizer or None) from an HF checkpoint directory or a `.gguf` file.

    `dtype`/`param_dtype` override the compute/storage dtypes (default float32). `place(hf_name, array,
    logical_axes) -> jax.Array` puts each parameter on device (default `jax.device_put`).
    Raises FileNotFoundError for missing files and ValueError naming file and tensor for bad contents.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint directory or .gguf file")
    overrides = _dtype_overrides(dtype, param_dtype)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"{path}: expected a checkpoint directory or a .gguf file")
        return _load_gguf(path, overrides, place)
    cfg = ModelConfig.from_hf(read_hf_config(path), source=os.path.join(path, CONFIG_FILE), **overrides)
    with open_safetensors(path) as source:
        model = decoder_from_hf_tensors(cfg, source, place)
    return model, _load_tokenizer(path)


def save_pretrained(model: Decoder, path: str | os.PathLike, tokenizer=None) -> None:
    """Writes `config.json` + `model.safetensors` (+ tokenizer files) to the directory `path`.

    Parameters are saved in their `param_dtype`, HF names and torch layouts; `lm_head` is omitted when
    embeddings are tied. The directory appears (or is replaced) only after everything was written.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    cfg: ModelConfig = model.config
    hf_config = cfg.to_hf()  # validates before anything touches the disk
    dtype = np.dtype(cfg.param_dtype)
    shapes = {m.hf_name: m.hf_shape for m in tensor_mappings(cfg)}
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        with open(os.path.join(staging, CONFIG_FILE), "w") as f:
            json.dump(hf_config, f, indent=2)
        write_safetensors(
            os.path.join(staging, SINGLE_FILE),
            [(name, shapes[name], dtype, fetch) for name, fetch in hf_tensors_from_decoder(model)],
        )
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        _replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replace_dir(new_dir: str, target: str) -> None:
    """Moves `new_dir` to `target`, replacing an existing directory only once the move is possible."""
    if not os.path.exists(target):
        os.replace(new_dir, target)
        return
    if not os.path.isdir(target):
        raise FileExistsError(f"{target}: exists and is not a directory")
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
    os.rmdir(old)
    os.replace(target, old)
    try:
        os.replace(new_dir, target)
    except BaseException:
        os.replace(old, target)
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(old)
