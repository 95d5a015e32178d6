"""`studies.smollm2.bfcl_sizes` on multi_turn_base: the sizes `configs/bfcl_smollm2.py` is chosen from."""

import json

from studies.smollm2 import bfcl_sizes


def test_p90_is_a_rank_of_the_sorted_values():
    assert bfcl_sizes._p90(list(range(10, 0, -1))) == 9
    assert bfcl_sizes._p90([5]) == 5


def test_multi_turn_base_sizes_in_smollm2_tokens(tmp_path):
    args = ["--categories", "multi_turn_base", "--max-observation-chars", "1000", "--out", str(tmp_path)]
    (row,) = bfcl_sizes.main(args)
    assert json.loads((tmp_path / "bfcl_sizes.json").read_text())["rows"] == [row]
    compact, full = row["lengths"]
    assert (compact["docs"], full["docs"], compact["max_observation_chars"]) == ("compact", "full", 1000)
    # the config's figures: task text 836 tokens, an expert episode 1,833 (p90 2,317, max 2,821), full docs 6.9k
    assert round(compact["task_text_tokens_mean"]) == 836
    assert round(compact["expert_tokens_mean"]) == 1833
    assert (compact["expert_tokens_p90"], compact["expert_tokens_max"]) == (2317, 2821)
    assert round(full["task_text_tokens_mean"], -2) == 6900
    assert row["check_ms_per_task"] > 0 and row["instruction_tokens"] > 0
