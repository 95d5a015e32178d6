"""Files of JSON records: a `.json` list or `.jsonl` lines, read strictly as UTF-8 and written exactly.

Every reader of record files (trajectories, ETO conversations, preference pairs, converters of published
data) loads through `load_json_records` and writes through `write_json_records`. Anything malformed, from a
line that is not UTF-8 JSON to a bad field in one record, raises `DataFormatError`, whose message names the
file, the record index and the field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping


class DataFormatError(ValueError):
    """A malformed record; the message names the file (`source`), the record index and the field."""

    def __init__(self, source: str, index: int, field_name: str, problem: str):
        self.source, self.index, self.field_name, self.problem = source, index, field_name, problem
        super().__init__(f"{source}: record {index}: field '{field_name}': {problem}")


def _utf8(data: bytes, path: str, index: int, where: str) -> str | DataFormatError:
    """`data` decoded, or the error naming the first byte that is not UTF-8 (a Latin-1 file, say)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        problem = (
            f"{where}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); re-save as UTF-8"
        )
        return DataFormatError(path, index, "<json>", problem)


def _load_json_lines(path: str) -> list[object]:
    """One entry per non-blank line; a line that is not UTF-8 JSON becomes a `DataFormatError` entry."""
    records: list[object] = []
    with open(path, "rb") as f:
        for line_number, raw in enumerate(f):
            line = _utf8(raw, path, len(records), f"line {line_number + 1}")
            if isinstance(line, DataFormatError):
                records.append(line)
                continue
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                records.append(
                    DataFormatError(path, len(records), "<json>", f"line {line_number + 1}: {err.msg}")
                )
    return records


def load_json_records(path: str | os.PathLike[str], *, strict: bool = True) -> list[object]:
    """Raw JSON records from a `.json` (list) or `.jsonl` file, naming the file in any parse error.

    With `strict=False`, JSON Lines lines that do not parse (or are not UTF-8) are returned as
    `DataFormatError` entries, which `skip_bad` readers skip.
    """
    path = os.fspath(path)
    if path.endswith(".jsonl"):
        records = _load_json_lines(path)
        bad = next((r for r in records if isinstance(r, DataFormatError)), None)
        if strict and bad is not None:
            raise bad
        return records
    with open(path, "rb") as f:
        text = _utf8(f.read(), path, -1, "the file")
    if isinstance(text, DataFormatError):
        raise text
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFormatError(path, -1, "<json>", f"line {err.lineno}: {err.msg}") from err


def write_json_records(path: str | os.PathLike[str], records: Iterable[Mapping[str, object]]) -> None:
    """JSON Lines for `.jsonl`, otherwise one indented JSON list; UTF-8, floats written exactly (repr)."""
    with open(path, "w", encoding="utf-8") as f:
        if os.fspath(path).endswith(".jsonl"):
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        else:
            json.dump(list(records), f, ensure_ascii=False, indent=1)
            f.write("\n")
