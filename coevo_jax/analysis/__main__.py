"""`python -m coevo_jax.analysis TOOL [ARGS ...]`: run one of the package's analysis tools on its own flags."""

import importlib
import sys

TOOLS = ("preference_sweep", "sampled_eval", "dev_eval", "hard_negatives", "grpo_logprob_gap")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in TOOLS:
        print(f"usage: python -m coevo_jax.analysis {{{','.join(TOOLS)}}} [ARGS ...]", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    tool = importlib.import_module(f"coevo_jax.analysis.{argv[0]}")
    sys.argv[0] = f"python -m coevo_jax.analysis {argv[0]}"
    result = tool.main(argv[1:])
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
