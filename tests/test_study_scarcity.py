"""The scarcity study's README tables are the ones its committed results give (`studies/scarcity/`)."""

from pathlib import Path

from coevo_jax.reporting.results import load_results
from studies.scarcity.dev_curve import HEADER, dev_curve_rows

STUDY = Path(__file__).resolve().parents[1] / "studies" / "scarcity"


def test_the_dev_curve_table_is_recomputed_from_the_committed_dev_runs():
    runs = [load_results(path) for path in sorted((STUDY / "dev").glob("*.json"))]
    assert runs, f"no committed dev runs in {STUDY / 'dev'}"
    lines = (STUDY / "README.md").read_text().splitlines()
    table = lines[lines.index(HEADER) + 2 :]
    table = table[: next(i for i, line in enumerate(table) if not line.startswith("|"))]
    assert table == dev_curve_rows(runs)


def test_a_dev_row_reads_the_mechanism_counts_of_iteration_1():
    (run,) = [load_results(p) for p in sorted((STUDY / "dev").glob("experts300_t1_seed0.json"))]
    coevo = run["methods"]["CoEvolving"]["iterations"][1]
    row = dev_curve_rows([run])[0].split(" | ")
    assert (
        row[6]
        == f"{coevo['explore']['target']['failures']} ({100 * coevo['explore']['target']['failure_avg_reward']:.1f})"
    )
    assert row[8] == str(coevo["failed_by_both"]) and row[9] == str(coevo["pairs"]["failure"]["pairs"])
