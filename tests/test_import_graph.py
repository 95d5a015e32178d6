"""The package's import graph, read from the source: no import cycle, and the layering holds: each layer of
`LAYERS` imports nothing above it (nothing below the job driver imports `experiment`); environments import
nothing above them; the network (`models`) imports nothing outside itself, and inside it only the
kernel set chooses the platform-specific kernels; checkpoint formats and tokenizers import only what they
read and write; the paper's losses stay plain JAX.

Every `import` statement counts, those inside functions and under `TYPE_CHECKING` too, so a cycle cannot hide
behind a deferred import. `from package import name` counts as importing the submodule `name` when there is one.
"""

import ast
import pathlib

import coevo_jax

ROOT = pathlib.Path(coevo_jax.__file__).parent
# The package's layers, bottom first: a module imports from its own layer or those below, never above, so
# nothing below the job driver (`experiment`) imports it, and only the entry points sit above it.
LAYERS = (
    # pure functions and data: the paper's losses, trajectories, the network, its files and tokenizers
    (
        "coevo_jax.atomic_files",
        "coevo_jax.react",
        "coevo_jax.losses",
        "coevo_jax.chunked_logprobs",
        "coevo_jax.data",
        "coevo_jax.models",
        "coevo_jax.checkpoint_formats",
        "coevo_jax.tokenization",
        "coevo_jax.sharding",
    ),
    # what runs them: environments, training steps and their checkpoints, sampling
    (
        "coevo_jax.envs",
        "coevo_jax.train",
        "coevo_jax.checkpoints",
        "coevo_jax.sampling",
        "coevo_jax.decode_loop",
        "coevo_jax.generate",
    ),
    # the agent in its environments, and CoEvolve's task synthesis
    ("coevo_jax.rollout", "coevo_jax.coevolve"),
    # reports on a job's results.json: statistics, tables, figures (the job driver writes them at its end)
    ("coevo_jax.reporting",),
    # the job driver
    ("coevo_jax.experiment",),
    # entry points over the job and its workdirs, and how the job's process starts
    ("coevo_jax.main", "coevo_jax.analysis", "coevo_jax.hugepage_malloc"),
)
# What the environments may import from coevo_jax: themselves, trajectory data and the ReAct format.
ENVS_MAY_IMPORT = ("coevo_jax.envs", "coevo_jax.data", "coevo_jax.react", "coevo_jax.atomic_files")
# What each layer may import from coevo_jax, by module-name prefix (itself always).
MAY_IMPORT = {
    # the network: nothing of checkpoints, tokenizers, sampling, training or the experiment
    "coevo_jax.models": ("coevo_jax.models",),
    # the kernel set sits under the network: the config, the layers, the cache and the differentiable product
    # whose forward and backward it computes; never the decoder above it
    "coevo_jax.models.kernels": (
        "coevo_jax.models.kernels",
        "coevo_jax.models.config",
        "coevo_jax.models.dense",
        "coevo_jax.models.layers",
        "coevo_jax.models.kv_cache",
        "coevo_jax.atomic_files",
    ),
    # the differentiable product takes the kernel set as an argument, and imports nothing
    "coevo_jax.models.dense": (),
    # the KV cache is plain data: it knows no model (nor the token shift)
    "coevo_jax.models.kv_cache": (),
    # checkpoint formats read and write the decoder's parameters: its config, the decoder, its LoRA sites
    "coevo_jax.checkpoint_formats": (
        "coevo_jax.checkpoint_formats",
        "coevo_jax.tokenization",
        "coevo_jax.models.config",
        "coevo_jax.models.decoder",
        "coevo_jax.models.lora",
        "coevo_jax.atomic_files",
    ),
    # tokenizers know text and trajectories, not the network
    "coevo_jax.tokenization": ("coevo_jax.tokenization", "coevo_jax.data.records"),
    # the paper's equations and their chunked log-probs: plain JAX
    "coevo_jax.losses": ("coevo_jax.chunked_logprobs",),
    "coevo_jax.chunked_logprobs": (),
    # sampling runs the network on the data's buckets and meshes, below rollout and training
    "coevo_jax.sampling": (
        "coevo_jax.decode_loop",
        "coevo_jax.models",
        "coevo_jax.data",
        "coevo_jax.sharding",
    ),
    "coevo_jax.decode_loop": ("coevo_jax.models", "coevo_jax.sharding"),
}


def _modules() -> dict[str, pathlib.Path]:
    modules = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {module for module in found if module in modules and module != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return cycles


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back():
    graph = _graph()
    assert "coevo_jax.envs.sciworld.gold" in graph  # the graph was read
    assert _cycles(graph) == []


def test_environments_import_nothing_above_them():
    upward = {
        (name, module)
        for name, imported in _graph().items()
        if name.startswith("coevo_jax.envs")
        for module in imported
        if not module.startswith(ENVS_MAY_IMPORT)
    }
    assert upward == set()


def _layer(name: str) -> str | None:
    """The most specific `MAY_IMPORT` layer that module `name` belongs to."""
    layers = [layer for layer in MAY_IMPORT if name == layer or name.startswith(layer + ".")]
    return max(layers, key=len, default=None)


def test_each_layer_imports_only_what_it_may():
    graph = _graph()
    assert {_layer(name) for name in graph} >= set(MAY_IMPORT)  # every layer was read
    upward = {
        (name, module)
        for name, imported in graph.items()
        if (layer := _layer(name)) is not None
        for module in imported
        if module != layer
        and not module.startswith(layer + ".")
        and not any(module == ok or module.startswith(ok + ".") for ok in MAY_IMPORT[layer])
    }
    assert upward == set()


def _rank(name: str) -> int | None:
    """The index in `LAYERS` of the layer that module `name` belongs to."""
    ranks = [
        rank
        for rank, layer in enumerate(LAYERS)
        for prefix in layer
        if name == prefix or name.startswith(prefix + ".")
    ]
    return ranks[0] if ranks else None


def test_every_module_has_a_layer():
    assert {name for name in _graph() if name != "coevo_jax" and _rank(name) is None} == set()


def test_no_module_imports_from_a_layer_above_it():
    upward = {
        (name, module)
        for name, imported in _graph().items()
        if name != "coevo_jax"
        for module in imported
        if _rank(module) is not None and _rank(module) > _rank(name)
    }
    assert upward == set()


def test_only_the_entry_points_import_the_job_driver():
    importers = {
        name
        for name, imported in _graph().items()
        if not name.startswith("coevo_jax.experiment")
        and any(module.startswith("coevo_jax.experiment") for module in imported)
    }
    assert importers and all(_rank(name) == len(LAYERS) - 1 for name in importers)


def test_only_the_kernel_set_reaches_the_cpu_kernels():
    # the rest of the code asks `models.kernels` (one method per operation), never the kernels themselves
    inside = "coevo_jax.models.kernels."
    reaching = {
        name
        for name, imported in _graph().items()
        if not name.startswith("coevo_jax.models.kernels")
        and any(module.startswith(inside) for module in imported)
    }
    assert reaching == set()


def test_the_token_shift_is_confined_to_the_decoder():
    graph = _graph()
    users = {name for name, imported in graph.items() if "coevo_jax.models.token_shift" in imported}
    assert users == {"coevo_jax.models.decoder"}
    assert "token_shift" not in (ROOT / "models" / "kv_cache.py").read_text()
    assert "token_ids" not in (ROOT / "sampling.py").read_text()


def test_the_package_tests_never_import_a_bench_script():
    """tests/ tests the package; the bench scripts' own tests live in bench/tests."""
    bench = ROOT.parent / "bench"
    scripts = {path.stem for path in [*bench.glob("*.py"), *bench.glob("peers/*.py")]}
    assert {"common", "flops", "gpu_mfu"} <= scripts
    for path in sorted((ROOT.parent / "tests").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            alias.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names
        }
        imported |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        local = {p.stem for p in (ROOT.parent / "tests").glob("*.py")}
        assert not (imported & scripts) - local, f"{path}: imports bench scripts {sorted(imported & scripts)}"


def _top_level_imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    found |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    return found


def test_the_studies_sit_above_the_package_and_apart_from_each_other():
    """The package never imports a study's script; a study's script imports the package and its own folder's
    scripts, never another study's (what two studies share belongs in the package)."""
    for path in sorted(ROOT.rglob("*.py")):
        studies = {name for name in _top_level_imports(path) if name.split(".")[0] == "studies"}
        assert not studies, f"{path}: the package imports {sorted(studies)}"
    scripts = sorted((ROOT.parent / "studies").glob("*/*.py"))
    assert {"room_recall", "grpo_credit", "grpo_paired_baseline", "dpo_lr_probe"} <= {p.stem for p in scripts}
    for path in scripts:
        own = f"studies.{path.parent.name}"
        others = {
            name
            for name in _top_level_imports(path)
            if name.split(".")[0] == "studies" and name != own and not name.startswith(own + ".")
        }
        assert not others, f"{path}: imports another study's scripts {sorted(others)}"
