"""`load_pretrained` / `save_pretrained`: Hugging Face checkpoint directories and GGUF files.

A checkpoint directory holds `config.json` plus `model.safetensors` (or a sharded
`model.safetensors.index.json`), optionally tokenizer files; a `.gguf` file is decoded by `gguf.read_gguf`
into the same HF config dict and HF-named tensors. Both feed `hf_params.decoder_from_hf_tensors`, which reads
and places one tensor at a time.

Saving writes HF names and torch layouts that `transformers.AutoModelForCausalLM.from_pretrained` loads,
into a temporary sibling directory that is renamed into place only once complete. A LoRA decoder is saved
either merged (`save_pretrained`: W + alpha / r * A B, a plain checkpoint) or as its adapters alone
(`save_adapter`: a PEFT adapter directory, `peft_adapter`), which `load_pretrained(base, adapter=...)` puts
back on its base.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

import numpy as np
from flax import nnx

from coevo_jax.atomic_files import atomic_path
from coevo_jax.checkpoint_formats import peft_adapter
from coevo_jax.checkpoint_formats.hf_params import (
    PlaceFn,
    TensorSource,
    decoder_from_hf_tensors,
    hf_tensors_from_decoder,
    tensor_mappings,
)
from coevo_jax.checkpoint_formats.safetensors_io import (
    SINGLE_FILE,
    open_safetensors,
    open_safetensors_file,
    write_safetensors,
)
from coevo_jax.models.config import ModelConfig, text_stack_prefix
from coevo_jax.models.decoder import Decoder, abstract_model
from coevo_jax.models.lora import merged_params

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
    gguf = importlib.import_module("coevo_jax.checkpoint_formats.gguf").read_gguf(path)
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
    adapter: str | os.PathLike | None = None,
) -> tuple[Decoder, Any]:
    """Loads (model, tokenizer or None) from an HF checkpoint directory or a `.gguf` file.

    `dtype`/`param_dtype` override the compute/storage dtypes (default float32). `place(hf_name, array,
    logical_axes) -> jax.Array` puts each parameter on device (default `jax.device_put`). `adapter`, a PEFT
    LoRA adapter directory (`save_adapter`, or `peft`'s own), is put on top of the loaded base: the
    model is then a LoRA decoder with those adapters (its config has their rank, alpha and targets).
    Raises FileNotFoundError for missing files and ValueError naming file and tensor for bad contents.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint directory or .gguf file")
    overrides = _dtype_overrides(dtype, param_dtype)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"{path}: expected a checkpoint directory or a .gguf file")
        model, tokenizer = _load_gguf(path, overrides, place)
    else:
        hf_config = read_hf_config(path)
        cfg = ModelConfig.from_hf(hf_config, source=os.path.join(path, CONFIG_FILE), **overrides)
        prefix = text_stack_prefix(hf_config)
        with open_safetensors(path) as source:
            if prefix is not None:  # a multimodal checkpoint: its language model
                source = text_stack(source, prefix)
            model = decoder_from_hf_tensors(cfg, source, place)
        tokenizer = _load_tokenizer(path)
    if adapter is not None:
        model = _with_adapter(model, os.fspath(adapter), place)
    return model, tokenizer


def text_stack(source: TensorSource, prefix: str) -> TensorSource:
    """The tensors of a multimodal checkpoint's language model (`prefix`...) under the text model's names
    (`model.`...) and its `lm_head`; the towers' tensors are left out."""
    names = {"model." + name[len(prefix) :]: name for name in source.names if name.startswith(prefix)}
    names.update({name: name for name in source.names if name.startswith("lm_head.")})
    return TensorSource(
        names=frozenset(names),
        read=lambda name: source.read(names[name]),
        location=lambda name: source.location(names.get(name, name)),
    )


def _with_adapter(base: Decoder, adapter_dir: str, place: PlaceFn | None) -> Decoder:
    config_file, weights_file = peft_adapter.adapter_files(adapter_dir)
    with open(config_file, "rb") as f:
        try:
            adapter_config = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{config_file}: invalid JSON ({err})") from None
    lora = peft_adapter.lora_fields(adapter_config, config_file)
    with open_safetensors_file(weights_file) as source:
        return peft_adapter.with_adapter(base, lora, source, place)


def merged(model: Decoder) -> Decoder:
    """The plain decoder (`config.without_lora()`) computing what the LoRA decoder `model` computes: each
    adapter folded into its base kernel; `model` itself when it has no adapters."""
    cfg: ModelConfig = model.config
    if not cfg.lora_rank:
        return model
    params = merged_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)), cfg)
    return nnx.merge(abstract_model(cfg.without_lora())[0], params)


def save_pretrained(model: Decoder, path: str | os.PathLike, tokenizer=None) -> None:
    """Writes `config.json` + `model.safetensors` (+ tokenizer files) to the directory `path`.

    Parameters are saved in their `param_dtype`, HF names and torch layouts; `lm_head` is omitted when
    embeddings are tied; LoRA adapters are merged into their base weights (`merged`). The directory appears
    (or is replaced) only after everything was written.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    model = merged(model)
    cfg: ModelConfig = model.config
    hf_config = cfg.to_hf()  # validates before anything touches the disk
    dtype = np.dtype(cfg.param_dtype)
    shapes = {m.hf_name: m.hf_shape for m in tensor_mappings(cfg)}
    with atomic_path(path, replace_directory=True) as staging:
        os.mkdir(staging)
        with open(os.path.join(staging, CONFIG_FILE), "w") as f:
            json.dump(hf_config, f, indent=2)
        write_safetensors(
            os.path.join(staging, SINGLE_FILE),
            [(name, shapes[name], dtype, fetch) for name, fetch in hf_tensors_from_decoder(model)],
        )
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)


def save_adapter(model: Decoder, path: str | os.PathLike) -> None:
    """Writes the LoRA adapters of `model` as a PEFT adapter directory at `path`.

    `adapter_config.json` + `adapter_model.safetensors` in PEFT's names and torch layouts, in the adapters'
    `param_dtype`: `peft.PeftModel.from_pretrained(transformers_model, path)` loads them onto the base (for
    that, `save_pretrained` of the base), and so does `load_pretrained(base, adapter=path)`. The directory
    appears (or is replaced) only after everything was written.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    cfg: ModelConfig = model.config
    adapter_config = peft_adapter.adapter_config(cfg)  # validates before anything touches the disk
    dtype = np.dtype(cfg.param_dtype)
    with atomic_path(path, replace_directory=True) as staging:
        os.mkdir(staging)
        with open(os.path.join(staging, peft_adapter.ADAPTER_CONFIG), "w") as f:
            json.dump(adapter_config, f, indent=2)
        write_safetensors(
            os.path.join(staging, peft_adapter.ADAPTER_WEIGHTS),
            [(name, shape, dtype, fetch) for name, shape, fetch in peft_adapter.adapter_tensors(model)],
        )
