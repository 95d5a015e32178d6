"""The bench scripts' boundary.

`bench/` holds the maintained benchmarks, run as `python bench/<script>.py`: Python puts `bench/` first on
the path, so a script imports the shared `common` module and the measuring modules (`flops`, `ceiling`,
`op_profile`, `hlo_traffic`) by name. Their tests, here in bench/tests, import them the same way (conftest.py
puts bench/ on the path); the package's tests in tests/ never import bench/.
"""

import ast
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
# What a bench script may import from bench/: the shared module and the measuring modules, and `gpu_aot`
# compiles `gpu_mfu`'s cases. The peers' model modules import `common` for the anchor.
SHARED = {"common", "flops", "ceiling", "op_profile", "hlo_traffic"}
ALSO = {"gpu_aot": {"gpu_mfu"}, "hf_generate": {"torch_llama"}, "trl_dpo": {"torch_llama"}}
ALSO |= {"tunix_dpo": {"tunix_llama"}, "tunix_sample": {"tunix_llama"}}
PATH_SETTERS = {"torch_llama", "tunix_llama"}  # they put bench/ on the path for `common`


def _scripts() -> dict[str, Path]:
    return {path.stem: path for path in sorted([*BENCH.glob("*.py"), *BENCH.glob("peers/*.py")])}


def test_every_bench_script_says_what_it_is_and_imports_only_the_shared_modules():
    scripts = _scripts()
    assert {"common", "dpo_throughput", "gpu_mfu"} <= set(scripts)
    for name, path in scripts.items():
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path}: no module docstring"
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        imported |= {
            node.module.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        siblings = imported & set(scripts)
        assert siblings <= SHARED | ALSO.get(name, set()), f"{path}: imports {sorted(siblings)}"
        private = {
            f"{node.value.id}.{node.attr}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in scripts
            and node.attr.startswith("_")
        }
        assert not private, f"{path}: uses another script's private {sorted(private)}"
        assert ("sys.path" in path.read_text()) == (name in PATH_SETTERS), path


def test_run_all_runs_scripts_that_exist():
    named = re.findall(r"bench/[\w/]+\.(?:py|sh)", (BENCH / "run_all.sh").read_text())
    assert "bench/dpo_throughput.py" in named and "bench/compare.py" in named
    assert all((BENCH.parent / path).exists() for path in named), named


def test_the_scripts_tests_import_them_from_bench():
    import common

    assert Path(common.__file__).parent == BENCH and common.MODEL["hidden_size"] == 256
