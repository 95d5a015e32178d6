"""Reports from results.json (Table 1, Figures 2 and 3, the CLI) and the TensorBoard scalar round trip.

Every expected number is computed here from the synthetic results dict, independently of the report code,
and compared with the cells parsed back from the Markdown.
"""

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import scipy.stats
from seeds import fresh_seed

from coevo_jax.experiment.tensorboard import ScalarWriter, read_scalars
from coevo_jax.reporting.figures import (
    STEP_WINDOW,
    failure_analysis_figure,
    grpo_steps_figure,
    plot_failure_analysis,
    plot_reward_curves,
    reward_curves_figure,
)
from coevo_jax.reporting.mechanism import mechanism_markdown
from coevo_jax.reporting.paired import failure_contrast
from coevo_jax.reporting.report import write_reports
from coevo_jax.reporting.results import aggregate_runs, failure_series, final_scores
from coevo_jax.reporting.tables import (
    details_markdown,
    grpo_details_markdown,
    table_markdown,
    table_markdown_contrasts,
    table_markdown_failure_contrasts,
    table_markdown_mean_std,
    table_markdown_paired,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SPLITS = ["test_seen", "test_unseen"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def split_eval(rng):
    return {
        "avg_reward": float(rng.uniform()),
        "success_rate": float(rng.uniform()),
        "episodes": 50,
        "terminations": {"context_limit": int(rng.integers(0, 5))},
    }


def explore_stats(rng):
    failures = int(rng.integers(0, 80))
    return {
        "episodes": 100,
        "avg_reward": float(rng.uniform()),
        "success_rate": float(rng.uniform()),
        "failures": failures,
        "failure_avg_reward": float(rng.uniform(0, 0.9)) if failures else None,
    }


def make_results(seed=0, env="builtin", num_iterations=3, methods=("SFT", "ETO", "CoEvolving")):
    """A realistic results dict: SFT at iteration 0 only, the others explore (co-evolving: two agents)."""
    rng = np.random.default_rng(seed)
    out = {"env": env, "seed": seed, "splits": list(SPLITS), "methods": {}}
    for method in methods:
        iterations = []
        for iteration in range(1 if method == "SFT" else num_iterations + 1):
            record = {"iteration": iteration, "eval": {split: split_eval(rng) for split in SPLITS}}
            if iteration:
                agents = ["target", "failure"] if method.startswith("CoEvolving") else ["target"]
                record["explore"] = {agent: explore_stats(rng) for agent in agents}
                record["pairs"] = {
                    a: {
                        "pairs": int(rng.integers(50, 150)),
                        "hard_negatives": int(rng.integers(0, 20)),
                        "by_kind": {"expert_vs_target": int(rng.integers(0, 50))},
                    }
                    for a in agents
                }
                record["train"] = {
                    a: {
                        "steps": 30,
                        "loss": float(rng.uniform()),
                        "final_reward_accuracy": float(rng.uniform()),
                        "final_reward_margin": float(rng.normal()),
                    }
                    for a in agents
                }
            else:
                record["explore"] = {}
            iterations.append(record)
        out["methods"][method] = {"iterations": iterations}
    return out


def parse_table(markdown):
    """Header cells and {method: cells} from the Markdown table in `markdown`."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]
    assert set(lines[1]) <= set("|-:")
    return header, {row[0]: row[1:] for row in rows}


def expected_row(evals):
    """Table-1 numbers computed by hand: rewards x100, success x100, mean of the rewards."""
    rewards = [100 * evals[s]["avg_reward"] for s in SPLITS]
    success = [100 * evals[s]["success_rate"] for s in SPLITS]
    return [*rewards, *success, sum(rewards) / len(rewards)]


def test_final_scores_are_each_methods_last_iteration():
    results = make_results()
    scores = final_scores(results)
    assert list(scores) == ["SFT", "ETO", "CoEvolving"]
    assert scores["SFT"] == results["methods"]["SFT"]["iterations"][0]["eval"]
    assert scores["CoEvolving"] == results["methods"]["CoEvolving"]["iterations"][3]["eval"]


def test_table_cells_match_hand_computed_numbers():
    results = make_results(seed=3)
    markdown = table_markdown(results)
    assert "builtin" in markdown.splitlines()[0]
    header, rows = parse_table(markdown)
    assert header == ["Method", "Seen", "Unseen", "Seen SR (%)", "Unseen SR (%)", "Avg."]
    assert list(rows) == ["SFT", "ETO", "CoEvolving"]
    for method, cells in rows.items():
        evals = results["methods"][method]["iterations"][-1]["eval"]
        for cell, value in zip(cells, expected_row(evals), strict=True):
            assert len(cell.split(".")[1]) == 1  # one decimal
            assert float(cell) == pytest.approx(value, abs=0.05 + 1e-9)


def test_missing_split_renders_dash_and_avg_uses_the_rest(tmp_path):
    results = make_results(seed=4)
    for method in results["methods"].values():
        for record in method["iterations"]:
            del record["eval"]["test_unseen"]
    _, rows = parse_table(table_markdown(results))
    for method, cells in rows.items():
        seen = 100 * results["methods"][method]["iterations"][-1]["eval"]["test_seen"]["avg_reward"]
        assert cells[1] == cells[3] == "—"
        assert float(cells[0]) == float(cells[4]) == pytest.approx(seen, abs=0.05 + 1e-9)
    assert_png(plot_reward_curves(results, tmp_path / "seen_only.png"))


def test_other_split_names_are_used_as_given():
    results = make_results()
    results["splits"] = ["test_seen", "dev"]
    header, rows = parse_table(table_markdown(results))
    assert header[1:5] == ["Seen", "dev", "Seen SR (%)", "dev SR (%)"]
    assert rows["ETO"][1] == "—"


def test_mean_std_matches_numpy_sample_std():
    runs = [make_results(seed=seed) for seed in (10, 11, 12)]
    aggregate = aggregate_runs(runs)
    markdown = table_markdown_mean_std(runs)
    assert "3 seeds" in markdown and "10, 11, 12" in markdown
    _, rows = parse_table(markdown)
    for method, cells in rows.items():
        per_run = np.array([expected_row(run["methods"][method]["iterations"][-1]["eval"]) for run in runs])
        means, stds = per_run.mean(axis=0), per_run.std(axis=0, ddof=1)
        for cell, mean, std in zip(cells, means, stds, strict=True):
            mean_text, std_text = cell.split(" ± ")
            assert float(mean_text) == pytest.approx(mean, abs=0.05 + 1e-9)
            assert float(std_text) == pytest.approx(std, abs=0.05 + 1e-9)
        stat = aggregate["methods"][method]["avg"]
        assert stat["mean"] == pytest.approx(means[-1]) and stat["std"] == pytest.approx(stds[-1])
        assert stat["n"] == 3
        assert aggregate["methods"][method]["reward"]["test_unseen"]["std"] == pytest.approx(stds[1])


def test_single_run_mean_std_table_shows_just_the_mean():
    run = make_results(seed=5)
    _, rows = parse_table(table_markdown_mean_std([run]))
    _, single = parse_table(table_markdown(run))
    assert rows == single


def test_mismatched_runs_raise_value_error():
    base = make_results(seed=0)
    with pytest.raises(ValueError, match="different envs"):
        aggregate_runs([base, make_results(seed=1, env="webshop")])
    with pytest.raises(ValueError, match="different method sets.*RFT"):
        aggregate_runs([base, make_results(seed=1, methods=("SFT", "ETO", "RFT"))])
    with pytest.raises(ValueError, match="no runs"):
        aggregate_runs([])


def assert_png(path, expect_w_gt_h=False):
    data = Path(path).read_bytes()
    assert len(data) > 0 and data[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100 and image.shape[2] in (3, 4)
    if expect_w_gt_h:
        assert image.shape[1] > image.shape[0]


def test_write_reports_writes_table_and_valid_pngs(tmp_path):
    results = make_results(seed=6)
    paths = write_reports(results, tmp_path)
    assert set(paths) == {"table", "reward_curves", "failure_analysis"}
    assert Path(paths["table"]).read_text() == table_markdown(results)
    assert_png(paths["reward_curves"], expect_w_gt_h=True)
    assert_png(paths["failure_analysis"], expect_w_gt_h=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "failure_analysis.png",
        "reward_curves.png",
        "table.md",
    ]  # no temporary files left behind


def test_failure_series_labels_and_skips():
    results = make_results(methods=("SFT", "ETO", "CoEvolving", "CoEvolving (positive agent)"))
    labels = [label for label, _ in failure_series(results)]
    assert labels == [
        "ETO target",
        "CoEvolving target",
        "CoEvolving failure agent",
        "CoEvolving (positive agent) target",
        "CoEvolving (positive agent) positive agent",
    ]
    _, stats = failure_series(results)[2]
    assert sorted(stats) == [1, 2, 3]
    assert stats[2] == results["methods"]["CoEvolving"]["iterations"][2]["explore"]["failure"]


def test_plots_without_explore_or_eval_data_do_not_crash(tmp_path):
    results = make_results(seed=7)
    for method in results["methods"].values():
        for record in method["iterations"]:
            record.pop("explore", None)
    assert failure_series(results) == []
    plot_failure_analysis(results, tmp_path / "failures.png")
    assert_png(tmp_path / "failures.png")
    only_sft = make_results(methods=("SFT",))
    plot_reward_curves(only_sft, tmp_path / "sft.png")
    assert_png(tmp_path / "sft.png")
    no_eval = copy.deepcopy(only_sft)
    no_eval["methods"]["SFT"]["iterations"][0]["eval"] = {}
    no_eval["methods"]["Empty"] = {"iterations": []}
    plot_reward_curves(no_eval, tmp_path / "none.png")
    assert_png(tmp_path / "none.png")
    assert "—" in table_markdown(no_eval)


def run_cli(*args, module="coevo_jax.reporting.report"):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
    )


def test_cli_single_workdir_rewrites_reports_and_prints_table(tmp_path):
    results = make_results(seed=8)
    (tmp_path / "results.json").write_text(json.dumps(results))
    (tmp_path / "table.md").write_text("stale")
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == table_markdown(results) + "\n" + mechanism_markdown(results)
    assert "### What the co-evolution had to work with" in proc.stdout
    assert (tmp_path / "table.md").read_text() == table_markdown(results)
    assert_png(tmp_path / "reward_curves.png")
    assert_png(tmp_path / "failure_analysis.png")


def test_cli_several_workdirs_print_mean_std_and_write_out(tmp_path):
    runs = [make_results(seed=seed) for seed in (0, 1)]
    for run in runs:
        (tmp_path / str(run["seed"])).mkdir()
        (tmp_path / str(run["seed"]) / "results.json").write_text(json.dumps(run))
    out = tmp_path / "mean.md"
    proc = run_cli(tmp_path / "0", tmp_path / "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    contrasts = "\n" + table_markdown_contrasts(runs) + "\n" + table_markdown_failure_contrasts(runs)
    contrasts += "\n" + mechanism_markdown(runs)
    expected = table_markdown_mean_std(runs) + "\n" + table_markdown_paired(runs, "SFT") + contrasts
    assert proc.stdout == out.read_text() == expected
    assert "| ETO − SFT | Seen |" in expected and "CoEvolving − ETO" in expected
    proc = run_cli(tmp_path / "0", tmp_path / "1", "--baseline", "Zero-shot")  # not a method: no paired table
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == table_markdown_mean_std(runs) + contrasts


def test_cli_missing_or_malformed_results_exit_2_naming_the_file(tmp_path):
    proc = run_cli(tmp_path)
    assert proc.returncode == 2
    assert str(tmp_path / "results.json") in proc.stderr
    (tmp_path / "results.json").write_text("{not json")
    proc = run_cli(tmp_path)
    assert proc.returncode == 2
    assert str(tmp_path / "results.json") in proc.stderr and "Traceback" not in proc.stderr


def test_scalar_writer_round_trip(tmp_path):
    rng = np.random.default_rng(9)
    written = {}
    with ScalarWriter(tmp_path / "tb") as writer:
        for step in (0, 1, 5, 10):
            for prefix in ("train", "eval/test_seen", ""):
                values = {"loss": float(rng.normal()), "reward": float(rng.uniform()), "skipped": None}
                writer.scalars(step, values, prefix=prefix)
                for key in ("loss", "reward"):
                    tag = f"{prefix}/{key}" if prefix else key
                    written.setdefault(tag, []).append((step, float(np.float32(values[key]))))
        writer.scalars(11, {"nan": float("nan")}, prefix="train")
        writer.flush()
    scalars = read_scalars(tmp_path / "tb")
    nan_points = scalars.pop("train/nan")
    assert nan_points[0][0] == 11 and math.isnan(nan_points[0][1])
    assert scalars == written


def test_read_scalars_ignores_a_truncated_last_record(tmp_path):
    with ScalarWriter(tmp_path) as writer:
        writer.scalars(3, {"x": 1.5})
    (event_file,) = tmp_path.glob("*tfevents*")
    with event_file.open("ab") as file:
        file.write(b"\x10\x00\x00\x00\x00\x00\x00")  # a record header cut short
    assert read_scalars(tmp_path) == {"x": [(3, 1.5)]}


def test_details_cells_are_mean_and_sample_std_over_runs():
    seed = fresh_seed()
    runs = [make_results(seed=seed + i) for i in range(3)]
    no_failures = runs[0]["methods"]["CoEvolving"]["iterations"][2]["explore"]["failure"]
    no_failures.update(failures=0, failure_avg_reward=None)  # the other two runs' rewards make the cell
    header, _ = parse_table(details_markdown(runs))
    lines = [line for line in details_markdown(runs).splitlines() if line.startswith("| CoEvolving | 2 |")]
    rows = {cells[2]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}
    assert sorted(rows) == ["failure agent", "target"]
    records = [run["methods"]["CoEvolving"]["iterations"][2] for run in runs]

    def stat(values, digits=1):
        values = [v for v in values if v is not None]  # a run with no failures has no failure reward
        if not values:
            return "—"
        if len(values) == 1:
            return f"{values[0]:.{digits}f}"
        return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"

    target, failure = rows["target"], rows["failure agent"]
    column = {name: header.index(name) for name in header}
    assert target[column["Failures*"]] == stat([r["explore"]["target"]["failures"] for r in records])
    rewards = [r["explore"]["failure"]["failure_avg_reward"] for r in records]
    assert failure[column["Failure reward*"]] == stat([None if v is None else 100 * v for v in rewards])
    assert target[column["Hard neg."]] == stat([r["pairs"]["target"]["hard_negatives"] for r in records])
    by_kind = np.mean([r["pairs"]["failure"]["by_kind"]["expert_vs_target"] for r in records])
    assert failure[column["Pairs by kind"]] == f"expert_vs_target {by_kind:.0f}"
    assert target[column["DPO margin"]] == stat(
        [r["train"]["target"]["final_reward_margin"] for r in records], 2
    )
    cutoffs = [sum(r["eval"][s]["terminations"]["context_limit"] for s in SPLITS) for r in records]
    assert target[column["Eval cut-offs"]] == stat(cutoffs)
    assert failure[column["Eval cut-offs"]] == "—"
    assert not any(line.startswith("| SFT |") for line in details_markdown(runs).splitlines())


def test_multi_run_figures_plot_means_with_95_percent_interval_error_bars():
    runs = [make_results(seed=s) for s in (11, 12)]
    figure = reward_curves_figure(runs)
    seen_ax = figure.axes[0]
    eto = next(c for c in seen_ax.containers if c.get_label() == "ETO").lines[0]  # the errorbar's data line
    expected = [
        np.mean(
            [100 * run["methods"]["ETO"]["iterations"][k]["eval"]["test_seen"]["avg_reward"] for run in runs]
        )
        for k in range(4)
    ]
    np.testing.assert_allclose(np.asarray(eto.get_ydata(), dtype=float), expected)
    assert len(seen_ax.containers) == 2  # ETO's and CoEvolving's error bars; SFT is a line with a band
    bars = [c for c in failure_analysis_figure(runs).axes[0].containers if hasattr(c, "patches")]
    assert bars[0].get_label() == "ETO target" and bars[0].errorbar is not None
    heights = [patch.get_height() for patch in bars[0].patches]  # iterations 1..3
    counts = [
        [run["methods"]["ETO"]["iterations"][k]["explore"]["target"]["failures"] for run in runs]
        for k in (1, 2, 3)
    ]
    np.testing.assert_allclose(heights, [np.mean(c) for c in counts])
    # error bars: the 95 % t-interval of the mean over the seeds
    segments = bars[0].errorbar.lines[2][0].get_segments()
    for segment, values in zip(segments, counts, strict=True):
        low, high = scipy.stats.t.interval(
            0.95, len(values) - 1, loc=np.mean(values), scale=scipy.stats.sem(values)
        )
        np.testing.assert_allclose(sorted(segment[:, 1]), [low, high])


def test_cli_figures_writes_the_study_reports(tmp_path):
    runs = [make_results(seed=seed) for seed in (0, 1)]
    for run in runs:
        (tmp_path / str(run["seed"])).mkdir()
        (tmp_path / str(run["seed"]) / "results.json").write_text(json.dumps(run))
    proc = run_cli(tmp_path / "0", tmp_path / "1", "--figures", tmp_path / "docs")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "docs" / "details.md").read_text() == details_markdown(runs)
    assert_png(tmp_path / "docs" / "reward_curves.png", expect_w_gt_h=True)
    assert_png(tmp_path / "docs" / "failure_analysis.png", expect_w_gt_h=True)


def _grpo_results(step_rewards_per_iteration):
    iterations = [{"iteration": 0, "eval": {}}] + [
        {"iteration": k + 1, "train": {"target": {"step_rewards": rewards}}}
        for k, rewards in enumerate(step_rewards_per_iteration)
    ]
    return {
        "env": "builtin",
        "splits": [],
        "methods": {"SFT": {"iterations": [{"iteration": 0}]}, "GRPO": {"iterations": iterations}},
    }


def test_grpo_steps_figure_plots_every_step_and_its_moving_average_over_seeds(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rewards = rng.uniform(size=(2, 3, 4))  # seeds x iterations x steps per iteration
    runs = [_grpo_results(r.tolist()) for r in rewards]
    figure = grpo_steps_figure(runs)
    per_step, smoothed = [line for line in figure.axes[0].lines]
    means = 100 * rewards.reshape(2, 12).mean(axis=0)
    np.testing.assert_allclose(per_step.get_xdata(), np.arange(1, 13))
    np.testing.assert_allclose(per_step.get_ydata(), means, err_msg=f"seed {seed}")
    windows = [means[max(0, i - STEP_WINDOW + 1) : i + 1].mean() for i in range(12)]
    np.testing.assert_allclose(smoothed.get_ydata(), windows, err_msg=f"seed {seed}")
    assert smoothed.get_label().startswith("GRPO")
    paths = write_reports(runs[0], tmp_path)
    assert "grpo_steps" in paths
    assert_png(paths["grpo_steps"], expect_w_gt_h=True)


def _signed_stat(values):
    """The paired table's cell, computed here: "+mean ± std" (sample std) of the values present."""
    values = [v for v in values if v is not None]
    if len(values) == 1:
        return f"{values[0]:+.1f}"
    return f"{np.mean(values):+.1f} ± {np.std(values, ddof=1):.1f}"


def test_paired_table_is_each_method_minus_the_baseline_of_the_same_seed():
    seed = fresh_seed()
    runs = [make_results(seed=seed + i) for i in range(3)]
    del runs[1]["methods"]["ETO"]["iterations"][-1]["eval"]["test_unseen"]  # that seed's cell is missing
    header, rows = parse_table(table_markdown_paired(runs, "SFT"))
    assert sorted(rows) == ["CoEvolving", "ETO"], f"seed {seed}"
    for method in ("ETO", "CoEvolving"):
        for column, split, key in [
            ("Seen", "test_seen", "avg_reward"),
            ("Unseen", "test_unseen", "avg_reward"),
            ("Unseen SR (%)", "test_unseen", "success_rate"),
        ]:
            diffs = []
            for run in runs:
                mine = run["methods"][method]["iterations"][-1]["eval"].get(split)
                base = run["methods"]["SFT"]["iterations"][-1]["eval"][split]
                diffs.append(None if mine is None else 100 * (mine[key] - base[key]))
            cell = rows[method][header.index(column) - 1]
            assert cell == _signed_stat(diffs), f"seed {seed}: {method} {column}"
    with pytest.raises(ValueError, match="baseline method 'RFT' is not among"):
        table_markdown_paired(runs, "RFT")


def _grpo_iteration(rng, iteration, rounds):
    train = {
        "steps": 10,
        "updates": int(rng.integers(5, 20)),
        "avg_reward": float(rng.uniform()),
        "success_rate": float(rng.uniform()),
        "equal_reward_fraction": float(rng.uniform()),
        "final_kl": float(rng.uniform(0, 0.1)),
        "final_clip_fraction": float(rng.uniform(0, 0.1)),
    }
    record = {"iteration": iteration, "eval": {}, "train": {"target": train}}
    if rounds is not None:
        record["coevolve"] = [
            {
                "round": r,
                "signals": {"boundary": int(rng.integers(0, 30)), "forgetting": int(rng.integers(0, 5))},
                "explored": int(rng.integers(0, 24)),
                "synthesized": int(rng.integers(0, 24)),
                "verified": int(rng.integers(0, 24)),
                "pool_size": int(rng.integers(0, 60)),
            }
            for r in rounds
        ]
    return record


def test_grpo_details_summarise_steps_and_rounds_over_seeds():
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(2):
        runs.append(
            {
                "env": "builtin",
                "splits": [],
                "methods": {
                    "SFT": {"iterations": [{"iteration": 0, "eval": {}}]},
                    "GRPO": {"iterations": [_grpo_iteration(rng, k, None) for k in (1, 2)]},
                    "CoEvolve": {
                        "iterations": [_grpo_iteration(rng, k, [2 * k - 2, 2 * k - 1]) for k in (1, 2)]
                    },
                },
            }
        )
    markdown = grpo_details_markdown(runs)
    header, rows = parse_table(markdown)
    assert "| SFT |" not in markdown
    lines = [line for line in markdown.splitlines() if line.startswith("| CoEvolve | 2 |")]
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    column = {name: header.index(name) for name in header}
    records = [run["methods"]["CoEvolve"]["iterations"][1] for run in runs]

    def stat(values, digits=1):
        return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"

    train = [r["train"]["target"] for r in records]
    assert cells[column["Sampled reward"]] == stat([100 * t["avg_reward"] for t in train]), f"seed {seed}"
    assert cells[column["All-equal groups (%)"]] == stat([100 * t["equal_reward_fraction"] for t in train])
    assert cells[column["KL"]] == stat([t["final_kl"] for t in train], 3)
    assert cells[column["Rounds"]] == "2 ± 0"
    verified = [sum(r["verified"] for r in rec["coevolve"]) for rec in records]
    assert cells[column["Verified"]] == stat(verified, 0)
    assert cells[column["Pool"]] == stat([rec["coevolve"][-1]["pool_size"] for rec in records], 0)
    boundary = np.mean([sum(r["signals"]["boundary"] for r in rec["coevolve"]) for rec in records])
    forgetting = np.mean([sum(r["signals"]["forgetting"] for r in rec["coevolve"]) for rec in records])
    assert cells[column["Signals"]] == f"boundary {boundary:.0f}, forgetting {forgetting:.0f}"
    grpo = [line for line in markdown.splitlines() if line.startswith("| GRPO | 1 |")]
    assert grpo and grpo[0].rstrip(" |").endswith("— | — | — | — | — | —")
    assert grpo_details_markdown(make_results(seed=seed)) == ""  # no GRPO-trained method
    assert markdown in details_markdown(runs)


def test_figure_two_paired_by_seed_against_a_direct_difference():
    seed = fresh_seed()
    methods = ("SFT", "ETO", "CoEvolving", "CoEvolving (frozen failure agent)")
    runs = [make_results(seed=seed + k, methods=methods) for k in range(4)]
    agent, baseline = "CoEvolving failure agent", "CoEvolving (frozen failure agent) failure agent"
    contrast = failure_contrast(runs, agent, baseline)
    assert sorted(contrast["iterations"]) == [1, 2, 3]
    for iteration, cell in contrast["iterations"].items():
        mine = [r["methods"]["CoEvolving"]["iterations"][iteration]["explore"]["failure"] for r in runs]
        base = [
            r["methods"]["CoEvolving (frozen failure agent)"]["iterations"][iteration]["explore"]["failure"]
            for r in runs
        ]
        both = [(m, b) for m, b in zip(mine, base, strict=True) if m["failures"] and b["failures"]]
        reward = np.array([100 * (m["failure_avg_reward"] - b["failure_avg_reward"]) for m, b in both])
        got = [v for v in cell["failure_reward"]["per_seed"] if v is not None]
        np.testing.assert_allclose(got, reward, err_msg=str(seed))
        if len(reward) < 2:  # seeds where either agent had no failure have no reward difference
            assert cell["failure_reward"]["low"] is None, seed
        else:
            half = scipy.stats.t.ppf(0.975, len(reward) - 1) * reward.std(ddof=1) / math.sqrt(len(reward))
            assert cell["failure_reward"]["low"] == pytest.approx(reward.mean() - half, abs=1e-6), seed
        failures = [m["failures"] - b["failures"] for m, b in zip(mine, base, strict=True)]
        assert cell["failures"]["mean"] == pytest.approx(np.mean(failures)), seed
    text = table_markdown_failure_contrasts(runs)
    assert "Figure 2 paired over 4 seeds" in text and "ETO target" in text
    assert table_markdown_failure_contrasts([make_results(seed=seed, methods=("SFT", "ETO"))]) == ""
    with pytest.raises(ValueError, match="'ETO target' is missing from runs \\[0\\]"):
        failure_contrast([make_results(seed=seed, methods=("SFT", "CoEvolving"))], agent, "ETO target")
