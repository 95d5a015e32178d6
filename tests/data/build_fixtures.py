"""Regenerate the real-data test fixtures in tests/data/ from /work/shared/data (run by hand, not by pytest).

* eto_icl/*: verbatim copies of ETO's in-context examples and instruction turns (Yifan-Song793/ETO).
* intercode/ic_sql_gpt-4_sample.json: 7 verbatim GPT-4 episodes from InterCode-SQL (princeton-nlp/intercode,
  MIT; Spider content CC BY-SA 4.0), picked for variety: 1, 5 and 10 turns; rewards 1.0, 0.67, 0.25, 0.0, 0.
* eto_records.jsonl: the above converted to trajectory records (ETO's prompt layout) by coevo_jax.data.converters.
* eto_conversations.json: the same trajectories in ETO's own conversation format (`id`, `conversations`,
  `reward`), as ETO / FastChat users would bring them.

    PYTHONPATH=. python tests/data/build_fixtures.py [/work/shared/data]
"""

import json
import os
import shutil
import sys

from coevo_jax.data.converters import read_icl_examples, read_intercode_trajectories
from coevo_jax.data.formats import write_eto_conversations
from coevo_jax.data.records import write_trajectories

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS = ("alfworld", "sciworld", "webshop")
INTERCODE_KEYS = ("0", "8", "12", "40", "70", "73", "111")


def main(shared: str) -> None:
    os.makedirs(os.path.join(HERE, "eto_icl"), exist_ok=True)
    for env in ENVS:
        for suffix in ("_icl.json", "_inst.txt"):
            shutil.copyfile(
                os.path.join(shared, "eto/prompts", env + suffix), os.path.join(HERE, "eto_icl", env + suffix)
            )
    with open(os.path.join(shared, "intercode/trajectories/ic_sql_multiturn_gpt-4_10_turns.json")) as f:
        episodes = json.load(f)
    os.makedirs(os.path.join(HERE, "intercode"), exist_ok=True)
    sample_path = os.path.join(HERE, "intercode", "ic_sql_gpt-4_sample.json")
    with open(sample_path, "w") as f:
        json.dump({k: episodes[k] for k in INTERCODE_KEYS}, f, indent=1)
        f.write("\n")
    trajectories = []
    for env in ENVS:
        with open(os.path.join(HERE, "eto_icl", env + "_inst.txt")) as f:
            instruction = f.read()
        trajectories += read_icl_examples(
            os.path.join(HERE, "eto_icl", env + "_icl.json"), env_name=env, instruction=instruction
        )
    trajectories += read_intercode_trajectories(sample_path)
    write_trajectories(os.path.join(HERE, "eto_records.jsonl"), trajectories)
    write_eto_conversations(os.path.join(HERE, "eto_conversations.json"), trajectories)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data")
