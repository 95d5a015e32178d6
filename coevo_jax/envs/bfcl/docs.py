"""The function docs shown to the agent: BFCL's JSON docs (`full`), or one compact signature line each.

`full` is what BFCL's prompting handlers put in the system prompt (`json.dumps(functions, indent=4)`, the
default `func_doc_fmt=json`): every description, parameter and response field, about 20k characters a task.
`compact` keeps what a call needs in a line a function, under a header naming the class once:

    GorillaFileSystem: This tool belongs to the Gorilla file system. It is a simple file system ...
    - cd(folder: str): Change the current working directory to the specified folder.
    - ls(a: bool = False): List the contents of the current directory.

Types are Python's (`list[float]`), an enumeration (BFCL writes `[Enum]: [...]` into the parameter's
description) becomes its quoted values (`unit: 'celsius' | 'fahrenheit' = 'celsius'`), and an optional
parameter shows its default (`= None` where BFCL gives none). Parameter descriptions and response fields are
left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from coevo_jax.envs.bfcl.data import PYTHON_HINT, class_docs

DOC_STYLES = ("compact", "full")
_TOOL_DESCRIPTION = "Tool description: "
_ENUM = re.compile(r"\[Enum\]: (\[.*?\])")
_TYPES = {
    "string": "str",
    "integer": "int",
    "float": "float",
    "boolean": "bool",
    "dict": "dict",
    "any": "Any",
}


def render_docs(functions: Sequence[dict], style: str) -> str:
    """The docs of `functions` in `style` ('compact' or 'full')."""
    if style == "full":
        return json.dumps(list(functions), indent=4)
    if style == "compact":
        return compact_docs(functions)
    raise ValueError(f"bfcl: unknown docs style {style!r}; styles: {', '.join(DOC_STYLES)}")


def _class_of() -> dict[str, str]:
    return {doc["name"]: name for name, docs in class_docs().items() for doc in docs}


def _type(spec: dict) -> str:
    enum = _ENUM.search(spec.get("description", ""))
    if enum:
        values = " | ".join(repr(v) for v in json.loads(enum.group(1)))
        return f"list[{values}]" if spec["type"] == "array" else values
    if spec["type"] == "array":
        return f"list[{_type(spec.get('items', {'type': 'any'}))}]"
    return _TYPES.get(spec["type"], spec["type"])


def _default(spec: dict) -> str:
    value = spec.get("default")
    return "None" if value in (None, "None") else repr(value)


def signature(doc: dict) -> str:
    """`name(param: type, optional: type = default)` of one function doc."""
    required = set(doc["parameters"].get("required", []))
    params = []
    for name, spec in doc["parameters"]["properties"].items():
        text = f"{name}: {_type(spec)}"
        params.append(text if name in required else f"{text} = {_default(spec)}")
    return f"{doc['name']}({', '.join(params)})"


def _split_description(doc: dict) -> tuple[str, str]:
    """(the class's preamble, the function's own description), BFCL's Python hint dropped."""
    text = doc["description"].removesuffix(PYTHON_HINT)
    preamble, _, own = text.rpartition(_TOOL_DESCRIPTION)
    return preamble.strip(), own.strip()


def compact_docs(functions: Sequence[dict]) -> str:
    """One signature line per function under a header per class (see the module docstring)."""
    class_of, lines, current = _class_of(), [], None
    for doc in functions:
        preamble, own = _split_description(doc)
        owner = class_of.get(doc["name"], "")
        if owner != current:
            current = owner
            lines.append(f"{owner}: {preamble}" if preamble else f"{owner}:")
        lines.append(f"- {signature(doc)}: {own}")
    return "\n".join(lines)
