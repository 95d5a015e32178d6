"""BFCL multi-turn sizes and costs: prompt and expert lengths in SmolLM2 tokens, replay and checker time.

    python -m studies.smollm2.bfcl_sizes                       # all four categories, both docs styles
    python -m studies.smollm2.bfcl_sizes --categories multi_turn_base

For each category, docs style (`compact`, `full`) and observation cap (`--max-observation-chars`, default none
and 1,000 characters): the task text (function docs and first user turn) in
characters and tokens, and every task's expert trajectory tokenized as training sees it (SmolLM2-135M-Instruct's
tokenizer and chat template; the tokenizer only, read from the bundled GGUF: no model is loaded): mean, p90
and max tokens. Per category: expert replay time per task (reset, steps through BFCL's backends and the final
check), BFCL's checkers alone (`multi_turn_checker` and `multi_turn_irrelevance_checker`), the per-turn
results, and `backend.check` (both), each re-running the task from fresh backends. Why: the BFCL config's
sequence and cache lengths and its observation cap are chosen from these sizes (`configs/bfcl_smollm2.py`).
Prints a table and writes `bfcl_sizes.json` under `--out` (default: the current directory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from coevo_jax.checkpoint_formats.bundled import smollm2_gguf_path
from coevo_jax.data.chat_format import chat_format_for, tokenize_trajectory
from coevo_jax.envs.base import record_expert_trajectory
from coevo_jax.envs.bfcl import BfclEnv, backend
from coevo_jax.envs.bfcl.data import CATEGORIES
from coevo_jax.envs.bfcl.experts import expert_steps, keyword_call
from coevo_jax.tokenization.gguf import load_gguf_tokenizer


def _p90(values):
    """The 90th percentile as the value at rank int(0.9 * (n - 1)) of the sorted values (no interpolation)."""
    return sorted(values)[int(0.9 * (len(values) - 1))]


def _expert_turns(task):
    """The expert's executed steps per turn (one step of the answer's calls) and whether it acted."""
    turns = [[tuple(keyword_call(call) for call in answer)] if answer else [] for answer in task.ground_truth]
    return task, turns, [bool(answer) for answer in task.ground_truth]


def _lengths(category, docs, cap, tokenizer, chat_format) -> dict:
    env = BfclEnv(category=category, docs=docs, max_observation_chars=cap)
    ids = env.tasks("train") + env.tasks("test")
    task_chars, task_tokens, lengths = [], [], []
    start = time.perf_counter()
    for task_id in ids:
        text = env.reset(task_id)
        task_chars.append(len(text))
        task_tokens.append(len(tokenizer(text, add_special_tokens=False)["input_ids"]))
        trajectory = record_expert_trajectory(env, task_id, expert_steps(env.task(task_id)))
        assert trajectory.reward == 1.0, task_id
        lengths.append(len(tokenize_trajectory(tokenizer, chat_format, trajectory).input_ids))
    return {
        "docs": docs,
        "max_observation_chars": cap,
        "task_text_chars_mean": statistics.mean(task_chars),
        "task_text_tokens_mean": statistics.mean(task_tokens),
        "task_text_tokens_max": max(task_tokens),
        "expert_tokens_mean": statistics.mean(lengths),
        "expert_tokens_p90": _p90(lengths),
        "expert_tokens_max": max(lengths),
        "expert_replay_ms_per_task": 1000 * (time.perf_counter() - start) / len(ids),
    }


def _ms_per_task(fn, played) -> float:
    start = time.perf_counter()
    for args in played:
        fn(*args)
    return 1000 * (time.perf_counter() - start) / len(played)


def _bfcl_checker(task, turns, attempted):
    """BFCL's two checkers alone, as `backend.check` calls them."""
    checker, name = backend.checker_module(), backend.new_model_name()
    truth = [list(answer) for answer in task.ground_truth]
    model = [[list(step) for step in turn] for turn in turns]
    try:
        assert checker.multi_turn_checker(model, truth, task.checker_entry(), task.category, name)["valid"]
    finally:
        backend.drop_instances(name)
    markers = [[["<call>"]] if acted else [] for acted in attempted]
    assert checker.multi_turn_irrelevance_checker(markers, truth)["valid"]


def measure(category: str, caps, tokenizer, chat_format) -> dict:
    """Every size and time of one category (see the module docstring)."""
    rows = [
        _lengths(category, docs, cap, tokenizer, chat_format) for docs in ("compact", "full") for cap in caps
    ]
    env = BfclEnv(category=category)
    played = [_expert_turns(env.task(task_id)) for task_id in env.tasks("train") + env.tasks("test")]
    return {
        "category": category,
        "instruction_chars": len(env.instruction),
        "instruction_tokens": len(tokenizer(env.instruction, add_special_tokens=False)["input_ids"]),
        "lengths": rows,
        "bfcl_checker_ms_per_task": _ms_per_task(_bfcl_checker, played),
        "turn_results_ms_per_task": _ms_per_task(backend.turn_results, played),
        "check_ms_per_task": _ms_per_task(backend.check, played),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Measures every category; returns the rows it writes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=CATEGORIES)
    parser.add_argument(
        "--max-observation-chars", nargs="+", type=int, default=[0, 1000], help="observation caps (0: none)"
    )
    parser.add_argument("--out", default=".", help="directory of bfcl_sizes.json")
    args = parser.parse_args(argv)
    tokenizer = load_gguf_tokenizer(smollm2_gguf_path())
    chat_format = chat_format_for(tokenizer)
    caps = [None if cap == 0 else cap for cap in args.max_observation_chars]
    rows = [measure(category, caps, tokenizer, chat_format) for category in args.categories]
    print(
        f"{'category':24} {'docs':8} {'obs cap':>7} {'task chars':>10} {'task tok':>8} {'expert tok mean':>15} "
        f"{'p90':>6} {'max':>6} {'replay ms':>9}"
    )
    for row in rows:
        for r in row["lengths"]:
            print(
                f"{row['category']:24} {r['docs']:8} {str(r['max_observation_chars']):>7} "
                f"{r['task_text_chars_mean']:10.0f} {r['task_text_tokens_mean']:8.0f} {r['expert_tokens_mean']:15.0f} "
                f"{r['expert_tokens_p90']:6d} {r['expert_tokens_max']:6d} {r['expert_replay_ms_per_task']:9.2f}"
            )
        print(
            f"{'':24} BFCL's checkers {row['bfcl_checker_ms_per_task']:.2f} ms/task, per-turn results "
            f"{row['turn_results_ms_per_task']:.2f} ms/task, backend.check (both) {row['check_ms_per_task']:.2f} "
            f"ms/task; instruction {row['instruction_chars']} chars, {row['instruction_tokens']} tokens"
        )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bfcl_sizes.json")
    with open(path, "w") as f:
        json.dump({"machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows}, f, indent=2)
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
