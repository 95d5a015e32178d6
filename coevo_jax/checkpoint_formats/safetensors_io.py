"""Lazy safetensors reading (single file or sharded index) and streaming writing.

Reading memory-maps the files through `safetensors.safe_open` (numpy framework; bfloat16 comes back as
`ml_dtypes.bfloat16`), so a tensor is only materialised when asked for. Writing streams one tensor at a
time into the file (header first, from the known shapes), so saving never holds a second host copy of
the model.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator

import ml_dtypes
import numpy as np
from safetensors import safe_open

from coevo_jax.checkpoint_formats.hf_params import TensorSource

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPE_CODES = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.float64): "F64",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype(np.int32): "I32",
    np.dtype(np.int64): "I64",
}


def _safe_open(path: str):
    """`safe_open(path)`, with a truncated or corrupt file reported as a ValueError naming it."""
    try:
        return safe_open(path, framework="numpy")
    except Exception as err:  # safetensors raises SafetensorError (not a ValueError) without the file
        raise ValueError(f"{path}: not a readable safetensors file ({err})") from None


def shard_files(checkpoint_dir: str) -> tuple[dict[str, str], str]:
    """(tensor name -> shard path, the index or single file) for a checkpoint directory."""
    index_path = os.path.join(checkpoint_dir, INDEX_FILE)
    single_path = os.path.join(checkpoint_dir, SINGLE_FILE)
    if os.path.exists(index_path):
        with open(index_path) as f:
            try:
                weight_map = json.load(f)["weight_map"]
            except (json.JSONDecodeError, KeyError) as err:
                raise ValueError(f"{index_path}: not a safetensors index ({err})") from None
        files = {name: os.path.join(checkpoint_dir, shard) for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not os.path.exists(shard):
                raise FileNotFoundError(f"{shard}: shard listed in {index_path} does not exist")
        return files, index_path
    if os.path.exists(single_path):
        with _safe_open(single_path) as f:
            return {name: single_path for name in f.keys()}, single_path
    raise FileNotFoundError(
        f"{checkpoint_dir}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors is supported)"
    )


@contextlib.contextmanager
def open_safetensors(checkpoint_dir: str) -> Iterator[TensorSource]:
    """A lazy `TensorSource` over the checkpoint's safetensors file(s), valid inside the `with`."""
    files, main_file = shard_files(checkpoint_dir)
    with contextlib.ExitStack() as stack:
        handles = {path: stack.enter_context(_safe_open(path)) for path in sorted(set(files.values()))}

        def read(name: str) -> np.ndarray:
            try:
                return handles[files[name]].get_tensor(name)
            except Exception as err:  # a corrupt file or an index naming a tensor its shard lacks
                raise ValueError(f"{files[name]}: cannot read tensor {name!r}: {err}") from err

        yield TensorSource(
            names=frozenset(files), read=read, location=lambda name: files.get(name, main_file)
        )


@contextlib.contextmanager
def open_safetensors_file(path: str) -> Iterator[TensorSource]:
    """A lazy `TensorSource` over one safetensors file (e.g. a PEFT adapter's), valid inside the `with`."""
    with _safe_open(path) as handle:

        def read(name: str) -> np.ndarray:
            try:
                return handle.get_tensor(name)
            except Exception as err:
                raise ValueError(f"{path}: cannot read tensor {name!r}: {err}") from err

        yield TensorSource(names=frozenset(handle.keys()), read=read, location=lambda name: path)


def write_safetensors(
    path: str,
    tensors: Iterable[tuple[str, tuple[int, ...], np.dtype, Callable[[], np.ndarray]]],
    metadata: dict[str, str] | None = None,
) -> None:
    """Writes (name, shape, dtype, thunk) tensors to `path`, fetching each thunk only when writing it."""
    tensors = list(tensors)
    header: dict[str, object] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, shape, dtype, _ in tensors:
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {
            "dtype": _DTYPE_CODES[np.dtype(dtype)],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        for name, shape, dtype, fetch in tensors:
            array = np.ascontiguousarray(fetch(), dtype=dtype)
            if array.shape != tuple(shape):
                raise ValueError(
                    f"{path}: tensor {name!r} has shape {array.shape}, header says {tuple(shape)}"
                )
            f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
