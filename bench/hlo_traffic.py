"""The kernels of a compiled XLA program and the bytes each moves, read from its optimised HLO text.

    python bench/hlo_traffic.py PROGRAM.txt [--top 30]

Used on programs compiled for a GPU (`bench/gpu_aot.py`, or the `hlo_*.txt.gz` that `bench/gpu_mfu.py
--profile` writes): each top-level fusion, custom call, copy or unfused op of the entry computation is one
kernel launch; a while loop's body counts once per iteration (XLA's `known_trip_count`); a call counts its
callee; a conditional counts its branch that calls cuDNN if one does (the right-padded batches' path of the
attention dispatch), else its branch that moves the most bytes.

Bytes are what a kernel must read and write at least once: its operands and results, except that an operand
a kernel reads only through slices or gathers counts the elements those pick (a gather of one target logit per
token from a [tokens, vocabulary] block reads [tokens] values, not the block), and a buffer a dynamic-update-slice writes in place
counts the update alone (so a scan's stacked residuals count what each iteration writes). Kernels fall into
families: `matmul` (cuBLAS calls, fusions holding a dot), `attention` (cuDNN calls), `stack` (in-place
dynamic-update-slices: a loop's stacked outputs), `copy` (copies, transposes and slices on their own), and
`fusion` (the other fusions: elementwise work, reductions). The memory-bound families' bytes over a chip's
bandwidth estimate their time; matmul FLOPs come from the dots' shapes.

No JAX needed: the text is parsed with regular expressions.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4}
DTYPE_BYTES |= {"f32": 4, "s64": 8, "u64": 8, "f64": 8, "s4": 1, "u4": 1, "token": 0}
FAMILIES = ("matmul", "attention", "fusion", "stack", "copy", "other")
MEMORY_BOUND = ("fusion", "stack", "copy", "other")

_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|token)\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_NO_KERNEL = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id"}
_NO_KERNEL |= {"replica-id", "opt-barrier", "add-dependency", "async-done", "async-update"}
_VIEWS = ("bitcast", "reshape")  # inside a fusion: the same bytes under another shape
_PICKS = ("dynamic-slice", "slice", "gather")  # read only the elements of their result from operand 0


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str  # the result type as printed: an array or a tuple of arrays
    op: str
    operands: tuple[str, ...]
    attrs: str  # everything after the operand list
    root: bool


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    family: str
    launches: int  # the loops' trip counts multiplied
    bytes_read: int  # over all launches
    bytes_written: int
    flops: int
    shape: str
    op_name: str  # the JAX operation (metadata), if any


def shape_bytes(shape: str) -> int:
    """Bytes of every array in a printed HLO type (a tuple's elements summed)."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        count = 1
        for dim in filter(None, dims.split(",")):
            count *= int(dim)
        total += count * DTYPE_BYTES[dtype]
    return total


def _dims(shape: str) -> list[int]:
    match = _ARRAY.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def parse(text: str) -> tuple[dict[str, list[Instruction]], str]:
    """(computation name -> its instructions in order, the entry computation's name)."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
            continue
        if line.startswith("}"):
            current = None
            continue
        match = _INSTRUCTION.match(line) if current is not None else None
        if not match:
            continue
        root, name, shape, op, rest = match.groups()
        depth, end = 1, 0
        while end < len(rest) and depth:  # the operand list ends at its closing parenthesis
            depth += {"(": 1, ")": -1}.get(rest[end], 0)
            end += 1
        operands = tuple(re.findall(r"%([\w.\-]+)", rest[: end - 1]))
        computations[current].append(Instruction(name, shape, op, operands, rest[end:], bool(root)))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def _called(attrs: str, key: str) -> str | None:
    match = re.search(key + r"=\{?%([\w.\-]+)", attrs)
    return match.group(1) if match else None


def _outputs(body: list[Instruction], by_name: dict[str, Instruction]) -> list[Instruction]:
    """What a computation's root returns: the tuple's elements, or the root itself."""
    root = next(i for i in body if i.root)
    return [by_name[o] for o in root.operands] if root.op == "tuple" else [root]


def _fusion_bytes(body: list[Instruction]) -> tuple[int, int]:
    """(bytes read, bytes written) of one fusion's body (see the module docstring)."""
    by_name = {i.name: i for i in body}
    users = collections.defaultdict(list)
    for instruction in body:
        for operand in instruction.operands:
            users[operand].append(instruction)

    def source(name: str) -> str:
        while by_name[name].op in _VIEWS and by_name[name].operands:
            name = by_name[name].operands[0]
        return name

    def readers(name: str) -> list[tuple[str, Instruction]]:
        found = []
        for user in users[name]:
            found += readers(user.name) if user.op in _VIEWS else [(name, user)]
        return found

    written, in_place = 0, set()
    for output in _outputs(body, by_name):
        output = by_name[source(output.name)]
        if output.op == "dynamic-update-slice":
            written += shape_bytes(by_name[output.operands[1]].shape)
            in_place.add(source(output.operands[0]))
        else:
            written += shape_bytes(output.shape)
    read = 0
    for instruction in body:
        if instruction.op != "parameter" or instruction.name in in_place:
            continue
        uses = readers(instruction.name)
        if uses and all(u.op in _PICKS and u.operands[0] == via for via, u in uses):
            read += sum(shape_bytes(u.shape) for _, u in uses)
        else:
            read += shape_bytes(instruction.shape)
    return read, written


def _dot_flops(instruction: Instruction, table: dict[str, Instruction]) -> int:
    """2 x output elements x contracted size of a dot (or a cuBLAS call, from its backend config)."""
    lhs = _dims(table[instruction.operands[0]].shape) if instruction.operands[0] in table else []
    contracting = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instruction.attrs)
    if contracting is None:
        contracting = re.search(r'"lhs_contracting_dimensions":\[([\d",]*)\]', instruction.attrs)
    depth = 1
    for dim in re.findall(r"\d+", contracting.group(1)) if contracting else []:
        depth *= lhs[int(dim)]
    out = 1
    for dim in _dims(instruction.shape):  # a tuple's first array: the product (a workspace may follow)
        out *= dim
    return 2 * out * depth


class Program:
    """A parsed program; `kernels()` walks it from the entry computation."""

    def __init__(self, text: str):
        self.computations, self.entry = parse(text)

    def _calls(self, name: str) -> str:
        """Every attribute text under a computation, the computations it calls included."""
        seen, stack, parts = set(), [name], []
        while stack:
            current = stack.pop()
            if current in seen or current not in self.computations:
                continue
            seen.add(current)
            for instruction in self.computations[current]:
                parts.append(instruction.attrs)
                stack += re.findall(
                    r"%([\w.\-]+)", " ".join(re.findall(r"\w+=\{?%[\w.\-]+", instruction.attrs))
                )
        return " ".join(parts)

    def _flops_in(self, computation: str) -> int:
        table = {i.name: i for i in self.computations[computation]}
        total = 0
        for instruction in self.computations[computation]:
            if instruction.op == "dot":
                total += _dot_flops(instruction, table)
            elif instruction.op == "fusion":
                total += self._flops_in(_called(instruction.attrs, "calls"))
        return total

    def _family(self, instruction: Instruction, fused_flops: int) -> str:
        """The kernel's family; `fused_flops`: the dot FLOPs inside it, if it is a fusion."""
        if instruction.op == "custom-call":
            target = re.search(r'custom_call_target="([^"]*)"', instruction.attrs).group(1)
            if "cudnn" in target:
                return "attention"
            return "matmul" if "cublas" in target or "gemm" in target else "other"
        if instruction.op == "fusion":
            if fused_flops:
                return "matmul"
            body = self.computations[_called(instruction.attrs, "calls")]
            if any(o.op == "dynamic-update-slice" for o in _outputs(body, {i.name: i for i in body})):
                return "stack"
            if all(
                i.op in ("parameter", "copy", "transpose", "slice", "dynamic-slice") + _VIEWS for i in body
            ):
                return "copy"
            return "fusion"
        if instruction.op in ("copy", "transpose", "slice", "dynamic-slice"):
            return "copy"
        return "stack" if instruction.op == "dynamic-update-slice" else "other"

    def _kernel(self, instruction: Instruction, table: dict[str, Instruction], launches: int) -> Kernel:
        fused = _called(instruction.attrs, "calls") if instruction.op == "fusion" else None
        flops = self._flops_in(fused) if fused else 0
        family = self._family(instruction, flops)
        operand_bytes = [shape_bytes(table[o].shape) if o in table else 0 for o in instruction.operands]
        if fused:
            read, written = _fusion_bytes(self.computations[fused])
        elif instruction.op == "dynamic-update-slice":
            read = written = operand_bytes[1]
        elif instruction.op in ("dynamic-slice", "slice"):
            read = written = shape_bytes(instruction.shape)
        elif instruction.op == "gather":
            read, written = shape_bytes(instruction.shape) + operand_bytes[1], shape_bytes(instruction.shape)
        else:
            read, written = sum(operand_bytes), shape_bytes(instruction.shape)
            flops = _dot_flops(instruction, table) if family == "matmul" else 0
        op_name = re.search(r'op_name="([^"]*)"', instruction.attrs)
        return Kernel(
            instruction.name,
            family,
            launches,
            read * launches,
            written * launches,
            flops * launches,
            instruction.shape,
            op_name.group(1) if op_name else "",
        )

    def kernels(self, computation: str | None = None, launches: int = 1) -> list[Kernel]:
        """Every kernel launched by `computation` (default the entry), `launches` times each."""
        computation = computation or self.entry
        table = {i.name: i for i in self.computations[computation]}
        found: list[Kernel] = []
        for instruction in self.computations[computation]:
            if instruction.op in _NO_KERNEL:
                continue
            if instruction.op == "while":
                trips = re.search(r'known_trip_count":\{"n":"(\d+)"', instruction.attrs)
                found += self.kernels(
                    _called(instruction.attrs, "body"), launches * int(trips.group(1) if trips else 1)
                )
            elif instruction.op == "conditional":
                found += self._branch(instruction, launches)
            elif instruction.op in ("call", "async-start"):
                callee = _called(instruction.attrs, "to_apply") or _called(instruction.attrs, "calls")
                found += self.kernels(callee, launches) if callee else []
            else:
                found.append(self._kernel(instruction, table, launches))
        return found

    def _branch(self, instruction: Instruction, launches: int) -> list[Kernel]:
        listed = re.search(r"branch_computations=\{([^}]*)\}", instruction.attrs)
        names = (
            re.findall(r"%([\w.\-]+)", listed.group(1))
            if listed
            else [
                _called(instruction.attrs, "true_computation"),
                _called(instruction.attrs, "false_computation"),
            ]
        )
        with_cudnn = [name for name in names if "cudnn" in self._calls(name)]
        if with_cudnn:
            return self.kernels(with_cudnn[0], launches)
        branches = [self.kernels(name, launches) for name in names]
        return max(branches, key=lambda ks: sum(k.bytes_read + k.bytes_written for k in ks))


def summary(kernels: list[Kernel]) -> dict[str, dict[str, float]]:
    """Per family: launches, GB read, GB written, TFLOP."""
    table = {family: dict(launches=0, gb_read=0.0, gb_written=0.0, tflop=0.0) for family in FAMILIES}
    for kernel in kernels:
        row = table[kernel.family]
        row["launches"] += kernel.launches
        row["gb_read"] += kernel.bytes_read / 1e9
        row["gb_written"] += kernel.bytes_written / 1e9
        row["tflop"] += kernel.flops / 1e12
    return table


def memory_bound_gb(kernels: list[Kernel]) -> float:
    """GB read and written by the memory-bound families (everything but matmuls and attention)."""
    return sum(k.bytes_read + k.bytes_written for k in kernels if k.family in MEMORY_BOUND) / 1e9


def print_report(kernels: list[Kernel], top: int) -> None:
    print(f"{'family':10s} {'launches':>9s} {'GB read':>9s} {'GB written':>11s} {'TFLOP':>8s}")
    for family, row in summary(kernels).items():
        print(
            f"{family:10s} {row['launches']:9d} {row['gb_read']:9.2f} {row['gb_written']:11.2f} {row['tflop']:8.2f}"
        )
    print(f"memory-bound families: {memory_bound_gb(kernels):.1f} GB\n")
    print(f"{'GB':>7s} {'launches':>8s} {'family':9s} {'result':60s} JAX operation")
    for kernel in sorted(kernels, key=lambda k: -(k.bytes_read + k.bytes_written))[:top]:
        gigabytes = (kernel.bytes_read + kernel.bytes_written) / 1e9
        print(
            f"{gigabytes:7.2f} {kernel.launches:8d} {kernel.family:9s} {kernel.shape[:60]:60s} {kernel.op_name[-80:]}"
        )


def read_text(path: str) -> str:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("program", help="optimised HLO text (.txt or .txt.gz)")
    parser.add_argument("--top", type=int, default=30, help="list this many kernels, most bytes first")
    args = parser.parse_args()
    print_report(Program(read_text(args.program)).kernels(), args.top)


if __name__ == "__main__":
    main()
