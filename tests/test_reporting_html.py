"""The HTML report (`coevo_jax.reporting.html`): its data (turn alignment, the first diverging turn, what the
filters filter on, pair counts), the pairs file the job keeps and the report reads, and, slow, a tiny run's
page opened in headless Chromium: the table, the figures and the pairs are drawn and a filter narrows them.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from coevo_jax.data.pairs import build_eto_pairs
from coevo_jax.data.records import Message, Trajectory, trajectory_to_record
from coevo_jax.experiment import phases
from coevo_jax.experiment.stages import pairs_file, save_pairs
from coevo_jax.reporting import html, run_files
from coevo_jax.reporting.html_data import Interned, first_divergence, page_data, pair_counts

REPO_ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PROMPT = (
    Message("user", "You are in a house."),
    Message("assistant", "OK"),
    Message("user", "Heat the pie."),
)


def episode(
    traj_id, actions, reward, *, task="heat/1", agent="target", iteration=1, sample=0, last_obs=False
):
    """An episode of `actions`, each answered by the observation "saw <action>" (the last only if `last_obs`)."""
    messages = list(PROMPT)
    for i, action in enumerate(actions):
        messages.append(Message("assistant", f"Thought: go.\nAction: {action}"))
        if i + 1 < len(actions) or last_obs:
            messages.append(Message("user", f"Observation: saw {action}"))
    return Trajectory(
        traj_id,
        task,
        tuple(messages),
        reward,
        agent=agent,
        prompt_len=3,
        iteration=iteration,
        sampling={"sample": sample},
        extra={"terminate_reason": "done"},
    )


def test_the_first_divergence_is_the_first_turn_whose_action_or_observation_differs():
    a = episode("a", ["look", "take pie", "heat pie"], 1.0)
    assert first_divergence(a, a) is None
    assert first_divergence(a, episode("b", ["look", "take cup", "heat pie"], 0.5)) == 1
    assert first_divergence(a, episode("b", ["go north", "take pie", "heat pie"], 0.5)) == 0
    # the same actions, but one episode ends earlier: its missing turn is where they part
    assert first_divergence(a, episode("b", ["look", "take pie"], 0.5)) == 1
    assert first_divergence(episode("b", ["look"], 0.5), a) == 0  # "look" without an observation after it
    # an observation alone can differ (the environment answered differently)
    longer = episode("c", ["look", "take pie", "heat pie"], 1.0, last_obs=True)
    assert first_divergence(a, longer) == 2


def test_episodes_are_stored_once_with_their_turns_aligned_by_index():
    table = Interned()
    a = episode("a", ["look", "take pie"], 1.0)
    b = episode("b", ["look", "drop pie"], 0.0)
    assert table.episode(a) == table.episode(episode("a", ["look", "take pie"], 1.0)) == 0
    assert table.episode(b) == 1
    ea, eb = table.episodes
    assert [table.texts[i] for i in ea["p"]] == [m.content for m in PROMPT] and ea["pr"] == "uau"
    assert ea["p"] == eb["p"]  # the shared prompt is one set of texts
    assert ea["t"][0] == eb["t"][0] and ea["t"][1][0] != eb["t"][1][0]  # turn 1 the same, turn 2 not
    assert ea["t"][1][1] == -1  # no observation after the last action
    assert table.texts.count("Observation: saw look") == 1
    assert (ea["r"], ea["task"], ea["end"]) == (1.0, "heat/1", "done")


def _results():
    pairs = {"pairs": 5, "hard_negatives": 2, "by_kind": {"expert_vs_target": 5}}
    coevo = {
        "target": {
            "pairs": 7,
            "hard_negatives": 1,
            "by_kind": {"expert_vs_target": 4, "failure_vs_failure": 3},
        },
        "failure": {"pairs": 3, "hard_negatives": 0, "by_kind": {"failure_vs_failure": 3}},
    }
    return {
        "env": "builtin",
        "seed": 0,
        "splits": ["test_seen"],
        "config": {"methods": ["sft", "eto", "coevo"]},
        "methods": {
            "SFT": {"iterations": [{"iteration": 0, "eval": {"test_seen": {"avg_reward": 0.5}}}]},
            "ETO": {
                "iterations": [
                    {"iteration": 0, "eval": {}},
                    {"iteration": 1, "eval": {}, "pairs": {"target": pairs}},
                ]
            },
            "CoEvolving": {
                "iterations": [{"iteration": 1, "eval": {}, "pairs": coevo}, {"iteration": 0, "eval": {}}]
            },
        },
    }


def test_pair_counts_list_each_method_iteration_and_agent_that_trained_on_pairs():
    rows = pair_counts(_results())
    assert [(r["method"], r["iteration"], r["agent"], r["pairs"], r["hard_negatives"]) for r in rows] == [
        ("ETO", 1, "target", 5, 2),
        ("CoEvolving", 1, "target", 7, 1),
        ("CoEvolving", 1, "failure", 3, 0),
    ]
    assert rows[1]["by_kind"] == {"expert_vs_target": 4, "failure_vs_failure": 3}
    assert "failure_vs_failure" in html.pair_counts_html(_results())


def _workdir(tmp_path):
    """A workdir with results.json, stages.json, ETO's kept pairs (with reference log-probs), no pairs file
    for CoEvolving's target phase, two policies' test episodes, and a GRPO step."""
    results = _results()
    (tmp_path / "results.json").write_text(json.dumps(results))
    experts = [
        episode(f"x{t}", ["look", "take pie", "heat pie"], 1.0, task=f"heat/{t}", agent="expert")
        for t in (1, 2)
    ]
    explored = [
        episode("e1", ["look", "take cup"], 0.6, task="heat/1"),
        episode("e2", ["look", "take pie", "drop pie"], 0.2, task="heat/1", sample=1),
        episode("e3", ["go north"], 0.0, task="heat/2"),
    ]
    dataset = build_eto_pairs(experts, explored)
    save_pairs(
        str(tmp_path / pairs_file("eto_it1_target")), dataset.pairs, [(-1.5, -9.0), None, (-2.0, -3.0)]
    )
    stages = {
        "train/sft_target": {"steps": 3},
        "train/eto_it1_target": {"dataset": dataset.report.to_dict()},
        "train/coevo_it1_target": {"dataset": {"num_pairs": 7}},
    }
    (tmp_path / "stages.json").write_text(json.dumps(stages))
    rollouts = tmp_path / "rollouts"
    for policy, actions in (("sft_target", ["look"]), ("coevo_it1_target", ["look", "take pie"])):
        with open(rollouts / f"{policy}_test_seen.jsonl", "w") as file:
            for task in ("heat/7", "heat/8"):
                file.write(
                    json.dumps(trajectory_to_record(episode(f"{policy}/{task}", actions, 0.5, task=task)))
                    + "\n"
                )
    (tmp_path / "coevo").mkdir()
    (tmp_path / "coevo" / "history.json").write_text(json.dumps([{"step": 1}]))
    with open(rollouts / "coevo_step1_explore.jsonl", "w") as file:
        for sample in (1, 0):
            for task in ("heat/3", "heat/4"):
                ep = episode(
                    f"{task}/s{sample}", ["look"] * (sample + 1), 0.1 * sample, task=task, sample=sample
                )
                file.write(json.dumps(trajectory_to_record(ep)) + "\n")
    return results, dataset


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "rollouts").mkdir()
    return tmp_path


def test_the_page_data_holds_what_each_filter_filters_on(workdir):
    results, dataset = _workdir(workdir)
    names = run_files.method_names(results, run_files.run_config(str(workdir), results))
    assert names == {"SFT": "sft", "ETO": "eto", "CoEvolving": "coevo"}
    data = page_data(
        results,
        names,
        run_files.pair_phases(str(workdir)),
        lambda policy, split: run_files.eval_episodes(str(workdir), policy, split),
        run_files.grpo_steps(str(workdir), list(names.values())),
    )
    # pair phases: method (title), iteration, agent; whether the workdir kept their pairs
    assert [(p["method"], p["it"], p["agent"], p["kept"]) for p in data["phases"]] == [
        ("ETO", 1, "target", True),
        ("CoEvolving", 1, "target", False),
    ]
    assert "CoEvolving iteration 1 target" in data["pair_notes"][0]
    # each kept pair: its kind, hard-negative mark, weights, sides, first divergence and reference log-probs
    pairs = data["pairs"]
    assert len(pairs) == len(dataset) == 3
    for entry, pair in zip(pairs, dataset, strict=True):
        chosen, rejected = data["episodes"][entry["c"]], data["episodes"][entry["r"]]
        assert (chosen["id"], rejected["id"]) == (pair.chosen.traj_id, pair.rejected.traj_id)
        assert (entry["kind"], entry["hn"], entry["l"]) == (pair.kind, pair.hard_negative, [1.0, 0.0])
        assert entry["d"] == first_divergence(pair.chosen, pair.rejected)
        assert chosen["task"] == pair.task_id  # the task filter's field
    assert [p["hn"] for p in pairs] == [True, False, False]  # 0.6 >= the hard-negative threshold
    assert [p["ref"] for p in pairs] == [[-1.5, -9.0], None, [-2.0, -3.0]]
    assert [p["d"] for p in pairs] == [1, 2, 0]
    # the experts appear in several pairs, stored once
    assert len(data["episodes"]) == len({e["id"] for e in data["episodes"]})
    # test-set episodes: SFT's policy once, then the CoEvolving target, per split
    assert [(e["policy"], e["method"], e["it"]) for e in data["evals"]] == [
        ("sft_target", "SFT", 0),
        ("coevo_it1_target", "CoEvolving", 1),
    ]
    assert [data["episodes"][i]["task"] for i in data["evals"][1]["splits"]["test_seen"]] == [
        "heat/7",
        "heat/8",
    ]
    # GRPO: a step's episodes grouped by task, in sample order
    (grpo,) = data["grpo"]
    assert grpo["method"] == "CoEvolving" and [s["step"] for s in grpo["steps"]] == [1]
    groups = grpo["steps"][0]["groups"]
    assert [g["task"] for g in groups] == ["heat/3", "heat/4"]
    assert [data["episodes"][i]["id"] for i in groups[0]["eps"]] == ["heat/3/s0", "heat/3/s1"]
    assert "does not keep" in data["grpo_note"]


def test_kept_pairs_read_back_as_the_phase_built_them(workdir):
    _, dataset = _workdir(workdir)
    kept = run_files.read_pairs_file(str(workdir / pairs_file("eto_it1_target")))
    assert [pair for pair, _ in kept] == list(dataset)
    assert [logps for _, logps in kept] == [(-1.5, -9.0), None, (-2.0, -3.0)]


def test_reference_log_probs_are_kept_only_where_they_index_the_built_pairs(tmp_path):
    store = SimpleNamespace(scratch_dir=lambda name: str(tmp_path))
    np.savez(
        tmp_path / phases.REFERENCE_FILE,
        chosen=np.array([-1.0, -2.0, 0.0]),
        rejected=np.array([-3.0, -4.0, 0.0]),
        computed=np.array([True, True, False]),
    )
    summary = {"pairs": 3, "fit": {"dropped": 0}}
    assert phases.kept_reference_logps(store, "train/x", 3, summary) == [(-1.0, -3.0), (-2.0, -4.0), None]
    # a pair dropped for length: the cache's rows are the pairs that fit, not those built
    assert phases.kept_reference_logps(store, "train/x", 4, {"pairs": 3, "fit": {"dropped": 1}}) is None
    os.remove(tmp_path / phases.REFERENCE_FILE)
    assert phases.kept_reference_logps(store, "train/x", 3, summary) is None


def test_the_page_is_one_file_whose_json_no_text_can_break_out_of(workdir):
    results, _ = _workdir(workdir)
    evil = episode("z", ["say </script><script>alert(1)</script>"], 0.0)
    data = {"texts": [], "episodes": []}
    table = Interned()
    table.episode(evil)
    data.update(texts=table.texts, episodes=table.episodes)
    page = html.render_page(results, data, "title <b>")
    assert page.count("</script>") == 2  # the data's and the code's own
    body = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S).group(1)
    assert json.loads(body)["texts"] == table.texts
    assert "title &lt;b&gt;" in page and "__" + "DATA__" not in page and "__" + "STATIC__" not in page
    assert not re.search(r"""(src|href)=["']https?:""", page)  # nothing fetched from the network
    assert page.count("data:image/png;base64,") == 2  # Figures 3 and 2
    assert 'id="results-table"' in page and 'id="pair-counts"' in page


def _chromium_or_skip():
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return
    if os.environ.get("CI"):
        pytest.fail(
            f"{CHROMIUM} or {CHROMEDRIVER} is missing: .ci/run installs them (launch/install_chromium.sh)"
        )
    pytest.skip("no chromium: bash launch/install_chromium.sh installs it")


@pytest.mark.slow
def test_a_tiny_runs_report_opens_in_chromium_with_its_table_figures_and_pairs(tmp_path):
    _chromium_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import Select

    workdir, page = tmp_path / "run", tmp_path / "report.html"
    run = [sys.executable, "-m", "coevo_jax.main", "--config=configs/tiny.py", f"--workdir={workdir}"]
    run.append("--config.methods=('sft','eto','coevo')")
    subprocess.run(run, cwd=REPO_ROOT, check=True, capture_output=True)
    report = [sys.executable, "-m", "coevo_jax.reporting.report", str(workdir), "--html", str(page)]
    printed = subprocess.run(report, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stderr
    assert f"wrote {page} (" in printed and page.stat().st_size > 0

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1800"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        start = time.monotonic()
        driver.get(page.as_uri())
        assert driver.execute_script("return document.body.dataset.ready") == "1"
        print(f"opened in {time.monotonic() - start:.2f} s")
        rows = driver.find_elements("css selector", "#results-table tbody tr")
        assert [r.find_element("css selector", "td").text for r in rows] == ["SFT", "ETO", "CoEvolving"]
        figures = driver.find_elements("css selector", ".figures img")
        assert len(figures) == 2 and all(
            driver.execute_script("return arguments[0].naturalWidth", f) > 0 for f in figures
        )
        pairs = json.loads((workdir / "stages.json").read_text())
        counted = sum(
            r["dataset"]["num_pairs"] for n, r in pairs.items() if n.startswith("train/") and "dataset" in r
        )
        shown = driver.find_elements("css selector", "#pair-list .pair")
        assert counted > 0 and len(shown) == min(counted, 20)
        assert driver.find_element("id", "pair-count").text.startswith(f"{counted} of {counted} pairs")
        assert driver.find_elements("css selector", "#pair-list tr.diverge")  # first diverging turns marked
        assert driver.find_elements("css selector", "#eval-list .eval")  # SFT vs CoEvolving test episodes
        kinds = [o.get_attribute("value") for o in Select(driver.find_element("id", "f-kind")).options][1:]
        kind = min(
            kinds,
            key=lambda k: len(driver.find_elements("css selector", f'#pair-list .pair[data-kind="{k}"]')),
        )
        Select(driver.find_element("id", "f-kind")).select_by_value(kind)
        narrowed = driver.find_elements("css selector", "#pair-list .pair")
        assert narrowed and {card.get_attribute("data-kind") for card in narrowed} == {kind}
        assert driver.find_element("id", "pair-count").text != f"{counted} of {counted} pairs"
        Select(driver.find_element("id", "f-method")).select_by_visible_text("ETO")
        assert {
            c.get_attribute("data-method") for c in driver.find_elements("css selector", "#pair-list .pair")
        } <= {"ETO"}
        driver.save_screenshot(str(tmp_path / "report.png"))
        assert (tmp_path / "report.png").stat().st_size > 0
    finally:
        driver.quit()
