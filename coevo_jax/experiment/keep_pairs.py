"""`python -m coevo_jax.experiment.keep_pairs WORKDIR`: the pairs file of every finished pair phase of a run
that did not keep them (a run begun before the job wrote `pairs/<policy>.jsonl`, `stages.save_pairs`).

The pairs are rebuilt by replaying the run's own method code over its stage records and checked against the
report each phase recorded (`run_data.pair_splits`, as the export does); a phase's existing file is left as
it is. The reference log-probs are not among them: the job keeps those only while the phase runs. The HTML
report's pair browser (`python -m coevo_jax.reporting.report WORKDIR --html OUT.html`) then shows the pairs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from coevo_jax.experiment import run_data
from coevo_jax.experiment.stages import pairs_file, save_pairs, stage_outputs


def keep_pairs(workdir: str) -> list[str]:
    """Writes the missing pairs files of the run's finished pair phases; returns the files written."""
    written = []
    for split in run_data.pair_splits(workdir).values():
        path = os.path.join(workdir, pairs_file(stage_outputs(split.stage)[0]))
        if not os.path.exists(path):
            save_pairs(path, split.dataset.pairs, None)
            written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coevo_jax.experiment.keep_pairs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("workdir", help="a run's workdir (finished or partial)")
    args = parser.parse_args(argv)
    try:
        written = keep_pairs(args.workdir)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print("\n".join(f"wrote {path}" for path in written) or "every finished pair phase has its pairs file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
