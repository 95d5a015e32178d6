"""The study's published numbers are the ones its committed results give.

`docs/study/details.md`, the tables of docs/results.md's "Equal-budget study" section and the README's
means row are recomputed here from `docs/study/results_seed*.json` with the report's own functions, so a
results file replaced without regenerating the documents (or a document edited by hand) fails the suite.
"""

import re
from pathlib import Path

import pytest

from coevo_jax.reporting.results import aggregate_runs, load_results
from coevo_jax.reporting.tables import (
    details_markdown,
    table_markdown_contrasts,
    table_markdown_failure_contrasts,
    table_markdown_mean_std,
)

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "docs" / "study"
README_COLUMNS = [
    "SFT",
    "RFT",
    "ETO",
    "CoEvolving",
    "CoEvolving (positive agent)",
    "CoEvolving (frozen failure agent)",
]


@pytest.fixture(scope="module")
def runs():
    paths = sorted(STUDY.glob("results_seed*.json"), key=lambda p: int(re.search(r"(\d+)", p.stem).group(1)))
    assert len(paths) == 5, f"expected the 5 seeds' results in {STUDY}, found {[p.name for p in paths]}"
    return [load_results(path) for path in paths]


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _table_rows(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("|") and not line.startswith("|---")]


def test_details_match_the_committed_results(runs):
    assert (STUDY / "details.md").read_text() == details_markdown(runs)


def test_results_section_tables_match_the_committed_results(runs):
    section = _section((ROOT / "docs" / "results.md").read_text(), "## Equal-budget study")
    assert f"docs/study/results_seed{{{','.join(str(run['seed']) for run in runs)}}}.json" in section
    expected = [
        *_table_rows(table_markdown_mean_std(runs)),
        *_table_rows(table_markdown_contrasts(runs)),
        *_table_rows(table_markdown_failure_contrasts(runs)),
    ]
    assert len(expected) > 20
    missing = [row for row in expected if row not in section.splitlines()]
    assert not missing, "rows the committed results give but docs/results.md lacks:\n" + "\n".join(missing)


def test_readme_means_row_matches_the_committed_results(runs):
    aggregate = aggregate_runs(runs)
    seen, unseen = aggregate["splits"]
    cells = []
    for method in README_COLUMNS:
        reward = aggregate["methods"][method]["reward"]
        cells.append(f"{reward[seen]['mean']:.1f} / {reward[unseen]['mean']:.1f}")
    readme = (ROOT / "README.md").read_text()
    study = _section(readme, "[Equal-budget study]")
    assert f"{len(runs)} seeds" in study.splitlines()[0]
    assert "| " + " | ".join(cells) + " |" in study.splitlines()


def test_readme_stays_within_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
