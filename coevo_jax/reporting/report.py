"""The paper's outputs from a run's `results.json`: Table 1 (Markdown), Figure 2 and Figure 3 (PNG), and
CoEvolve's pool make-up (PNG) when a CoEvolve method ran.

One workdir: rewrites its table.md, reward_curves.png, failure_analysis.png and pool_makeup.png
(`write_reports`) and prints Table 1. Several workdirs (seeds of one study): prints Table 1 as mean ± std over
them, then each method's difference from the baseline method (`--baseline`, SFT by default) in the same seed
as mean ± std, then the study's contrasts (`paired.DEFAULT_CONTRASTS`: ETO − SFT, CoEvolving − ETO, the
latest pairing − ETO, Best-of-4 − ETO, the ablations, RFT − SFT) per seed with 95 % t-intervals and the tasks
each moved up / down, and with --figures DIR writes Figures 2 and 3 (mean ± std) and details.md into DIR
(`write_study_reports`). Both then print what the co-evolution had to work with per iteration (mean ± std
over several runs) and a warning where the failure agent had too few pairs (`reporting.mechanism`). A
WORKDIR argument may also name a results file itself. Every file is written atomically.

`--html OUT.html` (one workdir) also writes the run's self-contained HTML page (`reporting.html`: the
table, the figures, pair counts, and browsers over the pairs, test-set episodes and GRPO groups) and prints
its size.

CLI: `python -m coevo_jax.reporting.report WORKDIR [WORKDIR ...] [--out FILE] [--figures DIR]
[--baseline METHOD] [--html OUT.html]`.
The pieces: `reporting.results` (reading, statistics), `reporting.tables`, `reporting.figures`,
`reporting.html`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from coevo_jax.atomic_files import atomic_path
from coevo_jax.reporting.figures import (
    grpo_step_rewards,
    plot_failure_analysis,
    plot_grpo_steps,
    plot_pool_makeup,
    plot_reward_curves,
)
from coevo_jax.reporting.html import write_html_report
from coevo_jax.reporting.mechanism import mechanism_markdown
from coevo_jax.reporting.results import coevolve_rounds, load_results, results_path
from coevo_jax.reporting.tables import (
    details_markdown,
    table_markdown,
    table_markdown_contrasts,
    table_markdown_failure_contrasts,
    table_markdown_mean_std,
    table_markdown_paired,
)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to `path` atomically."""
    with atomic_path(path) as tmp, open(tmp, "w") as file:
        file.write(text)
    return Path(path)


def write_reports(results: Mapping, workdir: str | os.PathLike) -> dict[str, Path]:
    """Write table.md, reward_curves.png, failure_analysis.png, when a method has CoEvolve rounds
    pool_makeup.png, and when one has GRPO steps grpo_steps.png into `workdir` (each atomically)."""
    workdir = Path(workdir)
    paths = {
        "table": write_text(workdir / "table.md", table_markdown(results)),
        "reward_curves": plot_reward_curves(results, workdir / "reward_curves.png"),
        "failure_analysis": plot_failure_analysis(results, workdir / "failure_analysis.png"),
    }
    if any(coevolve_rounds(method) for method in results["methods"].values()):
        paths["pool_makeup"] = plot_pool_makeup(results, workdir / "pool_makeup.png")
    if any(grpo_step_rewards(method) for method in results["methods"].values()):
        paths["grpo_steps"] = plot_grpo_steps(results, workdir / "grpo_steps.png")
    return paths


def write_study_reports(runs: Sequence[Mapping], directory: str | os.PathLike) -> dict[str, Path]:
    """Write reward_curves.png, failure_analysis.png (mean ± std over `runs`), details.md and, when a method
    has GRPO steps, grpo_steps.png into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "reward_curves": plot_reward_curves(runs, directory / "reward_curves.png"),
        "failure_analysis": plot_failure_analysis(runs, directory / "failure_analysis.png"),
        "details": write_text(directory / "details.md", details_markdown(runs)),
    }
    if any(grpo_step_rewards(method) for run in runs for method in run["methods"].values()):
        paths["grpo_steps"] = plot_grpo_steps(runs, directory / "grpo_steps.png")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: one workdir rewrites its reports and prints Table 1; several print the mean ± std table."""
    parser = argparse.ArgumentParser(prog="python -m coevo_jax.reporting.report", description=__doc__)
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="run directory with results.json")
    parser.add_argument("--out", help="also write the printed table to this file")
    parser.add_argument(
        "--figures",
        metavar="DIR",
        help="with several workdirs: write Figures 2 and 3 (mean ± std over them) and details.md into DIR",
    )
    parser.add_argument(
        "--baseline",
        default="SFT",
        metavar="METHOD",
        help="with several workdirs: also print each method minus this one (its title) in the same seed",
    )
    parser.add_argument(
        "--html",
        metavar="OUT.html",
        help="with one workdir: also write its self-contained HTML report (pairs, episodes, figures) here",
    )
    args = parser.parse_args(argv)
    if args.html and len(args.workdirs) != 1:
        parser.error("--html takes one workdir")
    paths = [results_path(arg) for arg in args.workdirs]
    try:
        runs = [load_results(path) for path in paths]
        if len(runs) == 1:
            written = write_reports(runs[0], paths[0].parent)
            worked_with = mechanism_markdown(runs[0])
            table = table_markdown(runs[0]) + ("\n" + worked_with if worked_with else "")
            print("\n".join(f"wrote {path}" for path in written.values()), file=sys.stderr)
            if args.html:
                size = write_html_report(paths[0].parent, runs[0], args.html)
                print(f"wrote {args.html} ({size / 2**20:.2f} MiB, {size} bytes)", file=sys.stderr)
        else:
            names = [str(path) for path in paths]
            table = table_markdown_mean_std(runs, names=names)
            if args.baseline in runs[0]["methods"]:
                table += "\n" + table_markdown_paired(runs, args.baseline, names=names)
            table += "\n" + table_markdown_contrasts(runs)
            failures = table_markdown_failure_contrasts(runs)
            table += "\n" + failures if failures else ""
            worked_with = mechanism_markdown(runs)
            table += "\n" + worked_with if worked_with else ""
            if args.figures:
                written = write_study_reports(runs, args.figures)
                print("\n".join(f"wrote {path}" for path in written.values()), file=sys.stderr)
        if args.out:
            write_text(args.out, table)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
