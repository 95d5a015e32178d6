"""What the co-evolution had to work with (`reporting.mechanism`): its rows from hand-built results, the
warning and its threshold, the mean ± std over seeds, the committed study, the CLI, the HTML page and the job's
log."""

import copy
import logging
import re
from html import escape
from pathlib import Path

import numpy as np
import pytest

from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.run import _log_mechanism
from coevo_jax.reporting import html
from coevo_jax.reporting.mechanism import (
    DEFAULT_MIN_FAILURE_PAIRS,
    HEADERS,
    mechanism_cells,
    mechanism_markdown,
    mechanism_rows,
    warnings,
)
from coevo_jax.reporting.results import load_results

ROOT = Path(__file__).resolve().parents[1]


def explore(failures, reward):
    return {"episodes": 10, "failures": failures, "failure_avg_reward": reward}


def pairs(count, hard=0):
    return {"pairs": count, "hard_negatives": hard, "by_kind": {}}


def results(seed=0, *, d_fail=(4, 40), both=(3, 5), config=None):
    """SFT, ETO, CoEvolving (two iterations: D_fail `d_fail`, tasks both failed `both`), the positive agent and
    the frozen failure agent (one iteration each; no `failed_by_both` in the frozen one, as in older runs)."""
    sft = {"iteration": 0, "eval": {}}
    coevo = [
        {
            "iteration": k,
            "explore": {"target": explore(6 + k, 0.25), "failure": explore(8, 0.5 + 0.1 * k)},
            "pairs": {"failure": pairs(d_fail[k - 1], 1), "target": pairs(20 + k, 3 + k)},
            "failed_by_both": both[k - 1],
        }
        for k in (1, 2)
    ]
    positive = {
        "iteration": 1,
        "explore": {"target": explore(5, 0.3), "failure": explore(2, None)},
        "pairs": {"failure": pairs(1), "target": pairs(9, 2)},
        "failed_by_both": 0,
    }
    frozen = {
        "iteration": 1,
        "explore": {"target": explore(4, 0.2), "failure": explore(9, 0.4)},
        "pairs": {"target": pairs(13, 1)},
    }
    eto = {"iteration": 1, "explore": {"target": explore(7, 0.35)}, "pairs": {"target": pairs(7, 4)}}
    out = {
        "env": "builtin",
        "seed": seed,
        "splits": ["test_seen"],
        "counts": {"train_tasks": 160},
        "config": config if config is not None else {"rollout": {"samples_per_task": 1}},
        "methods": {
            "SFT": {"iterations": [sft]},
            "ETO": {"iterations": [sft, eto]},
            "CoEvolving": {"iterations": [sft, *coevo]},
            "CoEvolving (positive agent)": {"iterations": [sft, positive]},
            "CoEvolving (frozen failure agent)": {"iterations": [sft, frozen]},
        },
    }
    return out


def test_rows_take_each_number_from_where_the_run_recorded_it():
    rows = {(r["method"], r["iteration"]): r for r in mechanism_rows(results())}
    assert list(rows) == [
        ("ETO", 1),
        ("CoEvolving", 1),
        ("CoEvolving", 2),
        ("CoEvolving (positive agent)", 1),
        ("CoEvolving (frozen failure agent)", 1),
    ]  # SFT trained no target on pairs
    assert rows["CoEvolving", 2] == {
        "method": "CoEvolving",
        "iteration": 2,
        "target_failures": 8,
        "target_failure_reward": 0.25,
        "failure_failures": 8,
        "failure_failure_reward": pytest.approx(0.7),
        "failed_by_both": 5,
        "failure_pairs": 40,
        "target_pairs": 22,
        "target_hard_negatives": 5,
    }
    assert rows["ETO", 1]["failure_failures"] is None and rows["ETO", 1]["failure_pairs"] is None
    assert rows["CoEvolving (positive agent)", 1]["failure_pairs"] is None  # its pairs are expert pairs
    frozen = rows["CoEvolving (frozen failure agent)", 1]
    assert (frozen["failure_pairs"], frozen["failed_by_both"], frozen["failure_failures"]) == (None, None, 9)


def test_a_warning_names_the_phases_below_the_threshold_and_the_knobs():
    (line,) = warnings(results())
    assert line.startswith("warning: CoEvolving: the failure agent trained on fewer than 30 failure–failure")
    assert "in 1 of 2 phases (iteration 1: 4; iteration 2: 40)" in line
    assert "env.explore_tasks; 160 explored now" in line and "rollout.samples_per_task: 1 now" in line
    assert warnings(results(d_fail=(30, 31))) == []  # at the threshold: enough
    assert len(warnings(results(config={"warn_failure_pairs_below": 41}))) == 1  # the run's own threshold
    assert "in 2 of 2 phases" in warnings(results(config={"warn_failure_pairs_below": 41}))[0]
    assert warnings(results(config={"warn_failure_pairs_below": 0})) == []
    assert ExperimentConfig().warn_failure_pairs_below == DEFAULT_MIN_FAILURE_PAIRS
    with pytest.raises(ValueError, match="warn_failure_pairs_below must be >= 0"):
        ExperimentConfig(warn_failure_pairs_below=-1)


def test_over_seeds_cells_are_mean_and_sample_std_and_the_warning_lists_every_seed():
    runs = [results(0, d_fail=(4, 40), both=(3, 5)), results(1, d_fail=(12, 50), both=(6, 1))]
    runs[1]["methods"]["CoEvolving"]["iterations"][1]["explore"]["failure"]["failure_avg_reward"] = 0.9
    cells = {(row[0], row[1]): dict(zip(HEADERS, row, strict=True)) for row in mechanism_cells(runs)}
    first = cells["CoEvolving", "1"]
    assert first["D_fail pairs"] == f"8 ± {np.std([4, 12], ddof=1):.0f}"
    assert first["Tasks both failed"] == f"4 ± {np.std([3, 6], ddof=1):.0f}"
    assert (
        first["Failure-agent failure reward"]
        == f"{100 * np.mean([0.6, 0.9]):.1f} ± {100 * np.std([0.6, 0.9], ddof=1):.1f}"
    )
    assert cells["ETO", "1"]["D_fail pairs"] == "—" and cells["ETO", "1"]["Target hard neg."] == "4 ± 0"
    (line,) = warnings(runs)
    assert "in 2 of 4 phases (iteration 1: 4, 12; iteration 2: 40, 50; seeds 0, 1)" in line
    text = mechanism_markdown(runs)
    assert "mean ± std over 2 seeds" in text and text.endswith(line + "\n")
    assert line not in mechanism_markdown(runs, with_warnings=False)
    empty = copy.deepcopy(runs[0])
    empty["methods"] = {"SFT": empty["methods"]["SFT"]}
    assert mechanism_markdown(empty) == "" and warnings(empty) == []


def test_the_committed_study_reads_and_warns_in_every_phase():
    runs = [load_results(p) for p in sorted((ROOT / "studies" / "equal_budget").glob("results_seed*.json"))]
    (line,) = warnings(runs)  # recorded before `failed_by_both` and the threshold: both at their defaults
    assert line.startswith("warning: CoEvolving: the failure agent trained on fewer than 30")
    assert "in 15 of 15 phases" in line and "env.explore_tasks; 160 explored now" in line
    row = next(r for r in mechanism_rows(runs[0]) if r["method"] == "CoEvolving")
    assert (row["target_failures"], row["failure_failures"], row["failure_pairs"], row["failed_by_both"]) == (
        30,
        42,
        4,
        None,
    )


def test_the_html_page_and_the_job_log_show_the_table_and_the_warning(caplog):
    run = results()
    page = html.render_page(run, {"texts": [], "episodes": []}, "t")
    section = re.search(r'<section id="worked-with">(.*?)</section>', page, re.S).group(1)
    assert 'id="mechanism"' in section and section.count('<p class="warning">') == 1
    assert escape(warnings(run)[0]) in section
    assert "<td>CoEvolving (frozen failure agent)</td>" in section
    with caplog.at_level(logging.INFO, logger="coevo_jax.experiment.run"):
        _log_mechanism(run)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert messages[-1] == (logging.WARNING, warnings(run)[0])
    assert mechanism_markdown(run, with_warnings=False).strip() in messages[0][1]
