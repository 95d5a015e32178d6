"""TensorBoard scalars: a small writer over tensorboardX and a reader that needs no TensorFlow.

`ScalarWriter` logs dicts of metrics per step (tags `prefix/key`). `read_scalars` parses the event files'
TFRecord framing itself (uint64 length, masked CRC32C of it, payload, masked CRC32C of the payload) and decodes
each payload with tensorboardX's bundled `Event` protobuf, so tests and notebooks can read logs back without
tensorflow or tensorboard installed.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from pathlib import Path

from tensorboardX import SummaryWriter
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c


class ScalarWriter:
    """Writes scalar metrics to a TensorBoard log directory; usable as a context manager."""

    def __init__(self, logdir: str | os.PathLike) -> None:
        self.logdir = Path(logdir)
        self._writer = SummaryWriter(logdir=str(self.logdir))

    def scalars(self, step: int, values: Mapping[str, object], prefix: str = "") -> None:
        """Log each value at `step` under `prefix/key` (or `key`); None is skipped, NaN is logged as is.

        tensorboardX replaces characters that are illegal in tag names (spaces, parentheses) with `_`.
        """
        for key, value in values.items():
            if value is None:
                continue
            tag = f"{prefix}/{key}" if prefix else key
            try:
                number = float(value)
            except (TypeError, ValueError) as err:
                raise TypeError(f"scalar {tag!r} is not a number: {value!r}") from err
            self._writer.add_scalar(tag, number, global_step=int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> ScalarWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _records(path: Path):
    """Yield the payloads of one TFRecord file; a truncated last record (file still being written) ends it."""
    data = path.read_bytes()
    offset = 0
    while offset + 12 <= len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        if masked_crc32c(header) != header_crc:
            raise ValueError(f"{path}: corrupt record length at byte {offset}")
        end = offset + 12 + length + 4
        if end > len(data):
            return
        payload = data[offset + 12 : offset + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[end - 4 : end])
        if masked_crc32c(payload) != payload_crc:
            raise ValueError(f"{path}: corrupt record payload at byte {offset}")
        yield payload
        offset = end


def _scalar_value(value) -> float | None:
    """The number held by a `Summary.Value`: `simple_value` or a one-element float tensor; else None."""
    if value.HasField("simple_value"):
        return value.simple_value
    if value.HasField("tensor") and value.tensor.float_val:
        return value.tensor.float_val[0]
    if value.HasField("tensor") and len(value.tensor.tensor_content) == 4:
        return struct.unpack("<f", value.tensor.tensor_content)[0]
    return None


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """All scalars under `logdir` (event files in it and its subfolders) as tag -> [(step, value)].

    Files are read in name order (tensorboardX names start with the creation time) and records in file
    order, so each list follows the order of writing. Values come back at float32 precision.
    """
    root = Path(logdir)
    if not root.is_dir():
        raise FileNotFoundError(f"no TensorBoard log directory at {root}")
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(p for p in root.rglob("*tfevents*") if p.is_file()):
        for payload in _records(path):
            event = Event.FromString(payload)
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _scalar_value(value)
                if number is not None:
                    scalars.setdefault(value.tag, []).append((int(event.step), float(number)))
    return scalars
