"""The HTML report's data: a run's pairs, test-set episodes and GRPO groups as one compact JSON-able dict.

Pure functions of what `run_files` read. Every message text is stored once (`Interned.text`) and every
episode once (`Interned.episode`): pairs, comparisons and groups refer to episodes by index, episodes to
texts by index, so a prompt shared by thousands of episodes costs its length once and the page compares two
turns by comparing two integers. Nothing is cut here: the page clips long texts on display only.

* `first_divergence`: the first turn where two episodes of a task differ, as the page marks it.
* `pair_counts`: per method, iteration and agent, the pairs by kind and the hard negatives (results.json).
* `page_data`: everything the page's browsers show (see `html` for the page itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coevo_jax.data.pair_pool import PreferencePair
from coevo_jax.data.records import Trajectory
from coevo_jax.reporting.results import sorted_iterations
from coevo_jax.reporting.run_files import PairPhase, eval_policy

ADVANTAGES_NOT_KEPT = (
    "The workdir does not keep each episode's GRPO advantage (only each step's records, in "
    "<method>/history.json): the episodes are shown with their rewards."
)
POLICY_LOGPS_NOT_KEPT = (
    "The run keeps the reference policy's log-probs of a pair's two sides (where the phase computed them), "
    "not the trained policy's, so no DPO margin can be shown."
)


def first_divergence(a: Trajectory, b: Trajectory) -> int | None:
    """The index of the first turn (action and the observation after it) where `a` and `b` differ, a turn
    that only one of them has included; None when their turns are the same."""
    turns_a, turns_b = a.turns, b.turns
    for index, (x, y) in enumerate(zip(turns_a, turns_b, strict=False)):
        if x != y:
            return index
    return None if len(turns_a) == len(turns_b) else min(len(turns_a), len(turns_b))


class Interned:
    """The page's text and episode tables: `text(s)` and `episode(t)` give the index of their one copy."""

    def __init__(self):
        self.texts: list[str] = []
        self.episodes: list[dict] = []
        self._texts: dict[str, int] = {}
        self._episodes: dict[tuple, int] = {}

    def text(self, value: str | None) -> int:
        """The index of `value` in `texts`; -1 for None (no observation after the last action)."""
        if value is None:
            return -1
        if value not in self._texts:
            self._texts[value] = len(self.texts)
            self.texts.append(value)
        return self._texts[value]

    def episode(self, trajectory: Trajectory) -> int:
        """The index of `trajectory` in `episodes`: {id, task, agent, it, r (reward), p (prompt texts), pr
        (their roles' initials), t ([action, observation] texts per turn), end (why it ended)}."""
        entry = {
            "id": trajectory.traj_id,
            "task": trajectory.task_id,
            "agent": trajectory.agent,
            "it": trajectory.iteration,
            "r": round(trajectory.reward, 6),
            "p": [self.text(m.content) for m in trajectory.prompt],
            "pr": "".join(m.role[0] for m in trajectory.prompt),
            "t": [[self.text(turn.action), self.text(turn.observation)] for turn in trajectory.turns],
            "end": str(trajectory.extra.get("terminate_reason", "")),
        }
        key = (entry["id"], entry["r"], tuple(entry["p"]), tuple(map(tuple, entry["t"])))
        if key not in self._episodes:
            self._episodes[key] = len(self.episodes)
            self.episodes.append(entry)
        return self._episodes[key]


def pair_counts(results: Mapping) -> list[dict]:
    """Per method, iteration (>= 1) and agent that trained on pairs: {method, iteration, agent, pairs,
    hard_negatives, by_kind}, from results.json (what each phase recorded, kept pairs or not)."""
    rows = []
    for title, method in results["methods"].items():
        for it in sorted_iterations(method):
            for agent, counts in sorted((it.get("pairs") or {}).items(), key=lambda kv: kv[0] != "target"):
                rows.append(
                    {
                        "method": title,
                        "iteration": it["iteration"],
                        "agent": agent,
                        "pairs": int(counts.get("pairs", 0)),
                        "hard_negatives": int(counts.get("hard_negatives", 0)),
                        "by_kind": dict(counts.get("by_kind") or {}),
                    }
                )
    return rows


def _pair_entry(phase_index: int, pair: PreferencePair, logps, table: Interned) -> dict:
    return {
        "ph": phase_index,
        "c": table.episode(pair.chosen),
        "r": table.episode(pair.rejected),
        "kind": pair.kind,
        "hn": pair.hard_negative,
        "l": [pair.lambda_dpo, pair.lambda_sft],
        "d": first_divergence(pair.chosen, pair.rejected),
        "ref": list(logps) if logps is not None else None,
    }


def _pairs(phases: Sequence[PairPhase], titles: Mapping[str, str], table: Interned) -> dict:
    """The pair browser's phases (each with whether its pairs were kept) and pairs."""
    entries, pairs = [], []
    for index, phase in enumerate(phases):
        entries.append(
            {
                "policy": phase.policy,
                "method": titles.get(phase.method, phase.method),
                "it": phase.iteration,
                "agent": phase.agent,
                "kept": phase.pairs is not None,
                "n": int(phase.report.get("num_pairs", 0)),
            }
        )
        pairs += [_pair_entry(index, pair, logps, table) for pair, logps in phase.pairs or ()]
    return {"phases": entries, "pairs": pairs}


def _policy_label(policy: str, titles: Mapping[str, str], method: str, iteration: int) -> str:
    """How the page names a policy in its comparison menus."""
    if iteration == 0:
        return "Zero-shot (untrained)" if policy == "base" else "SFT (every method's iteration 0)"
    return f"{titles.get(method, method)}, iteration {iteration}"


def _evals(
    results: Mapping, names: Mapping[str, str], splits: Sequence[str], episodes_of, table: Interned
) -> list[dict]:
    """Each evaluated policy once (SFT's serves every method's iteration 0), with its episodes per split."""
    titles = {name: title for title, name in names.items()}
    out, seen = [], set()
    for title, method in results["methods"].items():
        name = names.get(title)
        for it in sorted_iterations(method) if name else ():
            policy = eval_policy(name, it["iteration"])
            if policy in seen:
                continue
            seen.add(policy)
            found = {split: episodes_of(policy, split) for split in splits}
            if any(found.values()):
                out.append(
                    {
                        "policy": policy,
                        "label": _policy_label(policy, titles, name, it["iteration"]),
                        "method": title,
                        "it": it["iteration"],
                        "splits": {s: [table.episode(t) for t in e] for s, e in found.items() if e},
                    }
                )
    return out


def _grpo(steps: Mapping[str, list[tuple[int, list[Trajectory]]]], titles, table: Interned) -> list[dict]:
    """Per GRPO-trained method and step, each task's group of K episodes (in sample order)."""
    out = []
    for method, found in steps.items():
        entries = []
        for step, episodes in found:
            groups: dict[str, list[Trajectory]] = {}
            for episode in sorted(episodes, key=lambda t: (t.task_id, int(t.sampling.get("sample", 0)))):
                groups.setdefault(episode.task_id, []).append(episode)
            entries.append(
                {
                    "step": step,
                    "groups": [
                        {"task": task, "eps": [table.episode(e) for e in g]} for task, g in groups.items()
                    ],
                }
            )
        out.append({"method": titles.get(method, method), "steps": entries})
    return out


def page_data(
    results: Mapping,
    names: Mapping[str, str],
    phases: Sequence[PairPhase],
    episodes_of,
    grpo_steps: Mapping[str, list[tuple[int, list[Trajectory]]]],
) -> dict:
    """The page's JSON: texts and episodes (interned), the pair phases and pairs, each evaluated policy's
    test-set episodes, the GRPO groups, and the notes on what the run did not keep.

    `names` maps results.json's method titles to the config's method names (`run_files.method_names`);
    `episodes_of(policy, split)` gives a policy's test-set episodes or None (`run_files.eval_episodes`)."""
    titles = {name: title for title, name in names.items()}
    table = Interned()
    pairs = _pairs(phases, titles, table)
    missing = [p for p in pairs["phases"] if not p["kept"]]
    notes = [POLICY_LOGPS_NOT_KEPT]
    if missing:
        listed = ", ".join(f"{p['method']} iteration {p['it']} {p['agent']}" for p in missing)
        notes.insert(
            0,
            f"The workdir has no pairs file for {listed} (a run begun before the job kept its pairs).",
        )
    return {
        "splits": list(results["splits"]),
        **pairs,
        "pair_notes": notes,
        "evals": _evals(results, names, results["splits"], episodes_of, table),
        "grpo": _grpo(grpo_steps, titles, table),
        "grpo_note": ADVANTAGES_NOT_KEPT,
        "texts": table.texts,
        "episodes": table.episodes,
    }
