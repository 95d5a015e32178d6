"""The files of a run's workdir that the HTML report shows, read by their documented names.

The job (`coevo_jax.experiment`, above this package) writes them; these readers take only what a finished or
partial workdir has, and say `None` where it has nothing:

* `config.json` (also in results.json as `config`): `methods` lists the run's methods in run order, which
  is the order of results.json's method titles (`method_names`);
* `rollouts/<policy>_<split>.jsonl`: the greedy episodes of policy `<policy>` on a test split. A method's
  policy at iteration k >= 1 is `<method>_it<k>_target`; at iteration 0 every method's is `sft_target`,
  `zero_shot`'s `base` (`eval_policy`);
* `stages.json`: the finished stages; the record of stage `train/<policy>` of a pair phase has its pairs'
  report (`dataset`), `<policy>` being `<method>_it<k>_<agent>`;
* `pairs/<policy>.jsonl`: the pairs that phase trained on, one `data.formats.pair_to_record` line each, with
  `reference_logps` [chosen, rejected] where the phase kept the reference's log-probs (runs from before the
  job kept pairs have none);
* `rollouts/<run>_step<n>_explore.jsonl` and `<run>/history.json`: GRPO step n's episodes of the method
  `<run>` (`grpo` or a CoEvolve method) and the records of its finished steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence

from coevo_jax.data.formats import parse_pair_record
from coevo_jax.data.json_files import load_json_records
from coevo_jax.data.pair_pool import PreferencePair
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.data.records import Trajectory

CONFIG_FILE, STAGES_FILE = "config.json", "stages.json"
ROLLOUTS_DIR, PAIRS_DIR = "rollouts", "pairs"
PAIR_POLICY = re.compile(r"(?P<method>.+)_it(?P<iteration>\d+)_(?P<agent>target|failure)")


@dataclasses.dataclass(frozen=True)
class PairPhase:
    """One finished pair phase: the policy it trained, its method, iteration and agent, the report it recorded
    (`stages.json`), and its pairs with the reference's log-probs of each (None where not kept), or None
    when the workdir has no pairs file for it."""

    policy: str
    method: str
    iteration: int
    agent: str
    report: Mapping
    pairs: list[tuple[PreferencePair, tuple[float, float] | None]] | None


def read_json(path: str, default=None):
    """The JSON in `path`, or `default` when there is no such file."""
    if not os.path.isfile(path):
        return default
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def run_config(workdir: str, results: Mapping) -> dict:
    """The run's config: results.json's copy, else config.json, else {}."""
    return dict(results.get("config") or read_json(os.path.join(workdir, CONFIG_FILE), {}))


def method_names(results: Mapping, config: Mapping) -> dict[str, str]:
    """{results.json method title: the config's method name}: the titles follow `config.methods`' order."""
    return dict(zip(results["methods"], config.get("methods") or (), strict=False))


def eval_policy(method: str, iteration: int) -> str:
    """The policy whose evaluation is `method`'s at `iteration` (see the module docstring)."""
    if iteration == 0:
        return "base" if method == "zero_shot" else "sft_target"
    return f"{method}_it{iteration}_target"


def eval_episodes(workdir: str, policy: str, split: str) -> list[Trajectory] | None:
    """The greedy episodes of `policy` on `split`, None when the workdir has no such file."""
    path = os.path.join(workdir, ROLLOUTS_DIR, f"{policy}_{split}.jsonl")
    return read_trajectories(path) if os.path.isfile(path) else None


def read_pairs_file(path: str) -> list[tuple[PreferencePair, tuple[float, float] | None]]:
    """A pairs file's pairs (validated, `formats.parse_pair_record`), each with its reference log-probs."""
    out = []
    for index, record in enumerate(load_json_records(path)):
        pair = parse_pair_record(record, source=path, index=index)
        logps = record.get("reference_logps")
        out.append((pair, (float(logps[0]), float(logps[1])) if logps else None))
    return out


def pair_phases(workdir: str) -> list[PairPhase]:
    """The run's finished pair phases in the order they finished, with their pairs where kept."""
    phases = []
    for stage, record in (read_json(os.path.join(workdir, STAGES_FILE), {}) or {}).items():
        policy = stage.removeprefix("train/")
        match = PAIR_POLICY.fullmatch(policy)
        if stage == policy or match is None or not isinstance(record, dict) or "dataset" not in record:
            continue
        path = os.path.join(workdir, PAIRS_DIR, f"{policy}.jsonl")
        phases.append(
            PairPhase(
                policy=policy,
                method=match["method"],
                iteration=int(match["iteration"]),
                agent=match["agent"],
                report=record["dataset"],
                pairs=read_pairs_file(path) if os.path.isfile(path) else None,
            )
        )
    return phases


def grpo_steps(workdir: str, methods: Sequence[str]) -> dict[str, list[tuple[int, list[Trajectory]]]]:
    """{method: [(step, its episodes)]} of the GRPO-trained `methods`' finished steps, in step order."""
    out = {}
    for method in methods:
        history = read_json(os.path.join(workdir, method, "history.json"), [])
        steps = sorted({int(record["step"]) for record in history})
        files = [(s, os.path.join(workdir, ROLLOUTS_DIR, f"{method}_step{s}_explore.jsonl")) for s in steps]
        found = [(step, read_trajectories(path)) for step, path in files if os.path.isfile(path)]
        if found:
            out[method] = found
    return out
