"""Each study's published tables are the ones its committed results give.

The tables of every `studies/<name>/README.md` that has committed results, the equal-budget study's
`details.md` and the README's means row are recomputed here from the files committed beside them, with the
report's own functions where the report wrote the table, so a results file replaced without regenerating the
documents (or a document edited by hand) fails the suite.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from coevo_jax.reporting.results import aggregate_runs, final_scores, load_results
from coevo_jax.reporting.tables import (
    details_markdown,
    table_markdown,
    table_markdown_contrasts,
    table_markdown_failure_contrasts,
    table_markdown_mean_std,
)

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies"
EQUAL_BUDGET = STUDIES / "equal_budget"
README_COLUMNS = [
    "SFT",
    "RFT",
    "ETO",
    "CoEvolving",
    "CoEvolving (positive agent)",
    "CoEvolving (frozen failure agent)",
]


def _table_rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|") and not line.startswith("|---")]


def _assert_rows_in(expected: list[str], path: Path) -> None:
    lines = path.read_text().splitlines()
    missing = [row for row in expected if row not in lines]
    assert not missing, f"rows the committed results give but {path.relative_to(ROOT)} lacks:\n" + "\n".join(
        missing
    )


def _mean_std(values: list[float], signed: bool = False) -> str:
    return f"{np.mean(values):{'+' if signed else ''}.1f} ± {np.std(values, ddof=1):.1f}"


@pytest.fixture(scope="module")
def runs():
    paths = sorted(
        EQUAL_BUDGET.glob("results_seed*.json"), key=lambda p: int(re.search(r"(\d+)", p.stem).group(1))
    )
    assert len(paths) == 5, (
        f"expected the 5 seeds' results in {EQUAL_BUDGET}, found {[p.name for p in paths]}"
    )
    return [load_results(path) for path in paths]


def test_equal_budget_details_match_the_committed_results(runs):
    assert (EQUAL_BUDGET / "details.md").read_text() == details_markdown(runs)


def test_equal_budget_tables_match_the_committed_results(runs):
    readme = (EQUAL_BUDGET / "README.md").read_text()
    seeds = ",".join(str(run["seed"]) for run in runs)
    assert f"studies/equal_budget/results_seed{{{seeds}}}.json" in readme
    sft_rows = []
    for run in runs:
        scores = final_scores(run)["SFT"]
        cells = [f"{100 * s['avg_reward']:.1f} / {100 * s['success_rate']:.1f}" for s in scores.values()]
        sft_rows.append(f"| {run['seed']} | " + " | ".join(cells) + " |")
    expected = [
        *_table_rows(table_markdown_mean_std(runs)),
        *sft_rows,
        *_table_rows(table_markdown_contrasts(runs)),
        *_table_rows(table_markdown_failure_contrasts(runs)),
    ]
    assert len(expected) > 25
    _assert_rows_in(expected, EQUAL_BUDGET / "README.md")


def test_readme_means_row_matches_the_committed_results(runs):
    aggregate = aggregate_runs(runs)
    seen, unseen = aggregate["splits"]
    cells = []
    for method in README_COLUMNS:
        reward = aggregate["methods"][method]["reward"]
        cells.append(f"{reward[seen]['mean']:.1f} / {reward[unseen]['mean']:.1f}")
    readme = (ROOT / "README.md").read_text()
    start = readme.index("[Equal-budget study](studies/equal_budget/README.md)")
    study = readme[start:].splitlines()
    assert f"{len(runs)} seeds" in study[0]
    assert "| " + " | ".join(cells) + " |" in study[:6]


@pytest.mark.parametrize("env", ["sql", "sciworld"])
def test_smollm2_tables_match_the_committed_results(env):
    folder = STUDIES / "smollm2" / env
    results = load_results(folder / "results.json")
    limit = {"sql": "max_steps", "sciworld": "context_limit"}[env]
    limits = [
        f"| {method} | "
        + " | ".join(str(evals[split]["terminations"].get(limit, 0)) for split in results["splits"])
        + " |"
        for method, evals in final_scores(results).items()
    ]
    dev = json.loads((folder / "dev_eval.json").read_text())
    dev_rows = [
        f"| {policy} | {s['avg_reward']:.3f} | {round(s['success_rate'] * s['episodes'])} / {s['episodes']} |"
        for policy, s in dev["policies"].items()
    ]
    expected = [*_table_rows(table_markdown(results)), *limits, *dev_rows]
    assert (folder / "table.md").read_text().strip() == table_markdown(results).strip()
    _assert_rows_in(expected, STUDIES / "smollm2" / "README.md")


def test_coevolve_tables_match_the_committed_results():
    folder = STUDIES / "coevolve"
    reports = _table_rows((folder / "table.md").read_text()) + _table_rows(
        (folder / "details.md").read_text()
    )
    readme = (folder / "README.md").read_text()
    start = readme.index("## Results")
    report_rows = _table_rows(readme[start : readme.index("Sampled at T = 0.9", start)])
    report_rows += _table_rows(
        readme[readme.index("GRPO steps and CoEvolve rounds", start) : readme.index("![")]
    )
    assert len(report_rows) == 12 and not [row for row in report_rows if row not in reports]
    evals = [json.loads((folder / f"sampled_eval_s{s}.json").read_text()) for s in range(3)]
    rows = []
    for name, policy in [
        ("SFT", "sft_target"),
        ("GRPO", "grpo_it2_target"),
        ("CoEvolve", "coevolve_it2_target"),
    ]:
        splits = [[e["policies"][policy][split] for e in evals] for split in ("test_seen", "test_unseen")]
        cells = [_mean_std([100 * s["reward"] for s in split]) for split in splits]
        cells += [_mean_std([100 * s["success_rate"] for s in split]) for split in splits]
        for split in splits:
            differences = [100 * s["difference"] for s in split]
            per_seed = ", ".join(f"{d:+.1f}" for d in differences)
            cells.append(
                "" if policy == "sft_target" else f"{_mean_std(differences, signed=True)} ({per_seed})"
            )
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows[0] = rows[0].replace(" |  |  |", " | | |")
    _assert_rows_in(rows, folder / "README.md")


def test_grpo_paired_tables_match_the_committed_results():
    folder = STUDIES / "grpo_paired"
    paired = json.loads((folder / "grpo_paired.json").read_text())
    rows = _table_rows((folder / "table.md").read_text())
    steps = paired["steps"]
    for first in range(0, len(steps), 10):
        block = steps[first : first + 10]
        reward, base = (np.mean([s[key] for s in block]) for key in ("reward", "baseline_reward"))
        entropy, base_entropy = (np.mean([s[key] for s in block]) for key in ("entropy", "baseline_entropy"))
        rows.append(
            f"| {first + 1}–{first + len(block)} | {reward:.3f} / {base:.3f} ({reward - base:+.3f}) | "
            f"{entropy:.3f} / {base_entropy:.3f} |"
        )
    _assert_rows_in(rows, folder / "README.md")
    summary = (
        f"Over the {len(steps)} paired steps GRPO beats the SFT policy by {paired['mean_difference']:.3f} ± "
        f"{paired['difference_std_error']:.3f} reward (mean ± s.e.; {paired['steps_won']} won, "
        f"{paired['steps_lost']} lost, {paired['steps_tied']} tied)."
    )
    assert summary in (folder / "README.md").read_text()


def test_every_study_has_a_readme_the_readme_links():
    readme = (ROOT / "README.md").read_text()
    studies = sorted(path.parent.name for path in STUDIES.glob("*/README.md"))
    assert {"equal_budget", "credit", "smollm2", "coevolve", "scarcity"} <= set(studies)
    assert not [name for name in studies if f"(studies/{name}/README.md)" not in readme]
    assert not (ROOT / "docs" / "results.md").exists()


def test_readme_stays_within_200_lines_of_prose_within_120_characters():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    in_code, long = False, []
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and not line.startswith("|") and len(line) > 120:
            long.append(number)
    assert not long, f"README prose lines over 120 characters: {long}"
