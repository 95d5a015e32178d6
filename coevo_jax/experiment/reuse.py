"""A new run seeded with another run's finished stages: sweep one method's settings without redoing the rest.

    python -m coevo_jax.main --config=C --config.dpo.learning_rates='(5e-6,)' --workdir=NEW --reuse_from=OLD

`seed_workdir` copies into a new workdir the records and outputs (saved policy, rollout file, a pair phase's
kept pairs) of every stage of OLD that the config's differences cannot change, with the experts and a scratch
policy's tokenizer, and writes `reused.json` (source, changed fields, stages). The run then skips those
stages as done, so its results are those of a fresh run with the new config, minus the time.

Which stages a difference can change, judged by the policy a stage trains, explores with or evaluates:
* `methods` and `iterations` change which stages run, never what one computes (an iteration's stages are
  named by it and read only earlier ones);
* `FAMILY_FIELDS`: fields only some policy families read (a family is the name's prefix before `_it<k>`;
  `sft_target` and `sft_failure` are `sft`), e.g. `dpo.*` only the pair-trained families;
* `EXPLORATION_FIELDS` (sampling temperature, explored tasks, ...): every `explore/` stage and every family
  but SFT, whose training and greedy evaluations never sample;
* `EVALUATION_FIELDS` (which test splits, how many of their tasks): the `eval/` stages only, since no policy
  trains or explores on an evaluation task; so a finished run's policies can be evaluated on other splits
  (e.g. `dev`) without retraining them;
* every other field (the model, the environment, SFT, sampling, the seed, ...) can change every stage, and
  nothing is reused.
Families not listed, and `STATEFUL_FAMILIES` (GRPO and CoEvolve keep their step state and task pool outside the stage records), are
never reused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable, Mapping

from coevo_jax.atomic_files import atomic_path
from coevo_jax.coevolve import ABLATIONS
from coevo_jax.experiment.experts import EXPERTS_FILE
from coevo_jax.experiment.stages import pairs_file, stage_outputs
from coevo_jax.experiment.store import (
    CONFIG_FILE,
    STAGES_FILE,
    config_differences,
    read_json,
    write_json_atomic,
)
from coevo_jax.experiment.tokenizer import TOKENIZER_DIR

REUSED_FILE = "reused.json"
RUN_SHAPE_FIELDS = ("methods", "iterations")
FAMILY_FIELDS: dict[str, tuple[str, ...]] = {
    "base": (),
    "sft": (),
    "rft": ("sft.rft_epochs", "match_exploration"),
    "eto": ("dpo", "match_exploration"),
    # eq. 9's SFT term (`sft_per_token`) is in the target's objective only
    "coevo": ("dpo", "sft_per_token"),
    "coevo_positive": ("dpo", "sft_per_token"),
    "coevo_frozen": ("dpo", "sft_per_token"),
    "coevo_expert_pairs": ("dpo", "sft_per_token"),
    "coevo_frozen_after_1": ("dpo", "sft_per_token"),
    "best_of_4": ("dpo",),
    "grpo": ("grpo",),
    **{method: ("grpo", "coevolve") for method in ABLATIONS},
}
STATEFUL_FAMILIES = frozenset({"grpo", *ABLATIONS})
# Fields only explorations read (greedy evaluations and behavioural cloning do not): they change every
# `explore/` stage and every policy trained on explorations, but not the SFT policies or their evaluations.
EXPLORATION_FIELDS = ("rollout.temperature", "rollout.top_p", "rollout.samples_per_task", "env.explore_tasks")
# Fields only greedy evaluations read: which splits and tasks are evaluated. Training tasks, experts and
# explorations are drawn without them (`run.run`), so they change the `eval/` stages and nothing else.
EVALUATION_FIELDS = ("env.eval_splits", "env.eval_tasks", "env.eval_task_subset", "env.eval_every_iteration")
_FAMILY = re.compile(r"(?P<family>.+)_it\d+_(?:target|failure)")


def policy_family(policy: str) -> str | None:
    """'base' for the untrained starting parameters, 'sft' for the base policies, the method for
    `<method>_it<k>_<agent>`, None for any other name."""
    if policy == "base":
        return "base"
    if policy in ("sft_target", "sft_failure"):
        return "sft"
    match = _FAMILY.fullmatch(policy)
    return match.group("family") if match else None


def _reads(family: str, field: str) -> bool:
    return any(field == f or field.startswith(f + ".") for f in FAMILY_FIELDS[family])


def family_local(field: str) -> bool:
    """True when `field` is read by some policy families or stage kinds only (or by no stage at all)."""
    return (
        field in RUN_SHAPE_FIELDS
        or field in EXPLORATION_FIELDS
        or field in EVALUATION_FIELDS
        or any(_reads(family, field) for family in FAMILY_FIELDS)
    )


def _stage_reads(name: str, family: str, field: str) -> bool:
    """Whether stage `name` of a `family` policy can depend on `field`."""
    if field in EXPLORATION_FIELDS:  # SFT's own training and greedy evaluations never explore
        return family not in ("base", "sft") or name.startswith("explore/")
    if field in EVALUATION_FIELDS:
        return name.startswith("eval/")
    return _reads(family, field)


def reusable_stages(stage_names: Iterable[str], changed: Iterable[str]) -> list[str]:
    """The stages whose results `changed` (dotted config fields) cannot change, in the given order."""
    changed = list(changed)
    if not all(family_local(field) for field in changed):
        return []
    kept = []
    for name in stage_names:
        try:
            policy, _ = stage_outputs(name)
        except ValueError:
            continue
        family = policy_family(policy)
        reusable = family in FAMILY_FIELDS and family not in STATEFUL_FAMILIES
        if reusable and not any(_stage_reads(name, family, field) for field in changed):
            kept.append(name)
    return kept


def _copy(source: str, target: str) -> None:
    """Copies a file or a directory tree to `target` atomically (a temporary, then a rename)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(target):
        shutil.rmtree(target)
    with atomic_path(target) as tmp:
        if os.path.isdir(source):
            shutil.copytree(source, tmp)
        else:
            shutil.copyfile(source, tmp)


def seed_workdir(
    source: str,
    workdir: str,
    config_json: Mapping,
    *,
    defaults: Mapping | None = None,
    execution_fields: tuple[str, ...] = (),
) -> dict:
    """Copies `source`'s reusable stages into the new `workdir` (see the module docstring); returns the
    reuse record (also `workdir/reused.json`). A workdir this already seeded from `source` is left as it
    is (the run resumes); one holding any other run, or a source that shares nothing, is an error."""
    source, workdir = os.path.abspath(source), os.path.abspath(workdir)
    record_path = os.path.join(workdir, REUSED_FILE)
    if os.path.exists(os.path.join(workdir, STAGES_FILE)) or os.path.exists(
        os.path.join(workdir, CONFIG_FILE)
    ):
        if os.path.exists(record_path) and read_json(record_path).get("source") == source:
            return read_json(record_path)
        raise ValueError(f"{workdir}: already holds a run; --reuse_from only seeds a new workdir")
    for name in (CONFIG_FILE, STAGES_FILE, EXPERTS_FILE):
        if not os.path.isfile(os.path.join(source, name)):
            raise FileNotFoundError(f"{os.path.join(source, name)}: missing; is {source} a run's workdir?")
    source_config = read_json(os.path.join(source, CONFIG_FILE))
    changed = sorted(
        set(config_differences(source_config, dict(config_json), dict(defaults or {})))
        - set(execution_fields)
    )
    blocking = [field for field in changed if not family_local(field)]
    if blocking:
        raise ValueError(
            f"{source}/{CONFIG_FILE}: {', '.join(blocking)} differ, and every stage depends on them; "
            "nothing can be reused (start the workdir without --reuse_from)"
        )
    source_stages = read_json(os.path.join(source, STAGES_FILE))
    names = reusable_stages(source_stages, changed)
    outputs = [EXPERTS_FILE] + ([TOKENIZER_DIR] if os.path.isdir(os.path.join(source, TOKENIZER_DIR)) else [])
    outputs += [stage_outputs(name)[1] for name in names]
    kept_pairs = [pairs_file(stage_outputs(name)[0]) for name in names if name.startswith("train/")]
    outputs += [path for path in kept_pairs if os.path.isfile(os.path.join(source, path))]  # the pair phases'
    for relative in outputs:
        if not os.path.exists(os.path.join(source, relative)):
            raise FileNotFoundError(f"{os.path.join(source, relative)}: a finished stage's output is missing")
    for relative in outputs:
        _copy(os.path.join(source, relative), os.path.join(workdir, relative))
    record = {"source": source, "changed": changed, "stages": names}
    write_json_atomic(record_path, record)
    # last: until the stage records exist the workdir holds no run, and a rerun copies again
    write_json_atomic(os.path.join(workdir, STAGES_FILE), {name: source_stages[name] for name in names})
    return record


def read_record(workdir: str) -> dict | None:
    """The reuse record of a workdir seeded by `seed_workdir`, or None."""
    path = os.path.join(workdir, REUSED_FILE)
    return read_json(path) if os.path.exists(path) else None


def describe(record: Mapping) -> str:
    """One line for the log: how many stages came from where, and why the rest did not."""
    return (
        f"reused {len(record['stages'])} finished stages of {record['source']} "
        f"(changed: {', '.join(record['changed']) or 'nothing'}): {json.dumps(record['stages'])}"
    )
