"""`run(config, workdir)`: the main job. Base SFT, then every configured method, then the reports.

The workdir holds everything (see `store`); rerunning with the same config and workdir resumes. The
config is checked (environment name, arguments and splits included) before anything is written there. After
each iteration of each method `results.json` is rewritten (atomically), so a long run can be watched and
an interrupted one still reports what it finished; at the end the Markdown table and the figures are
written next to it.

On N processes (`launch/local_processes.sh`, the SLURM and TPU scripts) every process calls `run` with the
same arguments on a workdir they share: each plays its share of every rollout, all train on the global
mesh, and process 0 alone writes the workdir's files (`experiment.processes`). A CoEvolve round shares its
explorations out and process 0 merges them into the pool every process reads (`experiment.coevolve_loop`).
"""

from __future__ import annotations

import logging
import os

from coevo_jax import envs
from coevo_jax.data.sources import check_trajectory_source
from coevo_jax.experiment import processes, reuse
from coevo_jax.experiment.config import EXECUTION_FIELDS, METHOD_TITLES, ExperimentConfig
from coevo_jax.experiment.experts import load_or_generate_experts
from coevo_jax.experiment.methods import EXPERT_PAIR_METHODS, FAILURE_AGENT_METHODS, METHOD_RUNNERS
from coevo_jax.experiment.policy import build_setup
from coevo_jax.experiment.stages import Stages
from coevo_jax.experiment.store import RunStore, write_json_atomic
from coevo_jax.experiment.task_subsets import ALL_WITH_EXPERTS, explored_tasks, pick_tasks, tasks_with_experts
from coevo_jax.experiment.tensorboard import ScalarWriter
from coevo_jax.reporting import mechanism, report
from coevo_jax.reporting.results import RESULTS_FILE

log = logging.getLogger(__name__)

SCALAR_KEYS = ("avg_reward", "success_rate", "failures", "failure_avg_reward")


def _env_factory(cfg: ExperimentConfig):
    kwargs = dict(cfg.env.kwargs)
    return lambda: envs.make(cfg.env.name, **kwargs)


def check_env_config(cfg: ExperimentConfig) -> None:
    """The environment part of the config checked without building anything: a registered name, keyword
    arguments its factory accepts, an expert file that exists. Runs before the workdir is written, so a
    wrong config leaves nothing behind for the corrected rerun to be refused over."""
    envs.check_kwargs(cfg.env.name, dict(cfg.env.kwargs))
    if cfg.env.experts_path:
        try:
            check_trajectory_source(cfg.env.experts_path)
        except (OSError, ValueError) as error:
            raise FileNotFoundError(f"env.experts_path {error}") from error


def _eval_scalars(writer: ScalarWriter, method: str, entry: dict) -> None:
    step = entry["iteration"]
    for split, summary in entry["eval"].items():
        writer.scalars(step, {k: summary[k] for k in SCALAR_KEYS[:2]}, prefix=f"eval/{method}/{split}")
    for agent, summary in entry.get("explore", {}).items():
        values = {k: summary[k] for k in SCALAR_KEYS if summary.get(k) is not None}
        writer.scalars(step, values, prefix=f"explore/{method}/{agent}")
    writer.flush()


class _NoScalars:
    """The TensorBoard writer of the processes other than process 0 (which alone writes the workdir)."""

    def scalars(self, step, values, prefix=""):
        pass

    def flush(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass


def _scalar_writer(logdir: str):
    return ScalarWriter(logdir) if processes.is_primary() else _NoScalars()


def _check_expert_coverage(cfg: ExperimentConfig, train_split: list[str], experts: list) -> None:
    """Refuses a run whose expert-pairing methods (ETO, co-evolution) could pair no explored episode: none of
    the explored train tasks has an expert trajectory; or that explores every train task with an expert
    (`ALL_WITH_EXPERTS`) when none has one."""
    train_tasks = explored_tasks(train_split, cfg.env.explore_tasks, experts)
    exploring = [m for m in cfg.methods if m not in ("zero_shot", "sft")]
    if cfg.env.explore_tasks == ALL_WITH_EXPERTS and exploring and not train_tasks:
        raise ValueError(
            f"{cfg.env.name}: env.explore_tasks = {ALL_WITH_EXPERTS} explores every train task that has an "
            f"expert, and none of the {len(train_split)} train tasks has one of the {len(experts)} expert "
            f"trajectories (env.expert_tasks, env.experts_path), so {', '.join(exploring)} would explore nothing"
        )
    expert_pairing = [m for m in cfg.methods if m in EXPERT_PAIR_METHODS]
    if expert_pairing and train_tasks and not tasks_with_experts(train_tasks, experts):
        raise ValueError(
            f"{cfg.env.name}: none of the {len(train_tasks)} explored train tasks (env.explore_tasks) has one "
            f"of the {len(experts)} expert trajectories (env.expert_tasks, env.experts_path), so "
            f"{', '.join(expert_pairing)} would build no expert pairs"
        )


def _log_mechanism(results: dict) -> None:
    """The log ends with what the co-evolution had to work with per iteration, and a warning for each method
    whose failure agent had too few pairs to learn from (`reporting.mechanism`)."""
    table = mechanism.mechanism_markdown(results, with_warnings=False)
    if table:
        log.info("\n%s", table)
    for line in mechanism.warnings(results):
        log.warning("%s", line)


def run(cfg: ExperimentConfig, workdir: str, *, reuse_from: str | None = None) -> dict:
    """Runs (or resumes) the experiment in `workdir`; returns the results dict also saved there.

    `reuse_from`: a finished (or partial) run's workdir whose stages the config's differences cannot change
    seed the new `workdir` (`experiment.reuse`); results.json records them under `reused`."""
    check_env_config(cfg)
    env_factory = _env_factory(cfg)
    env = env_factory()
    try:
        for split in (cfg.env.train_split, *cfg.env.eval_splits):
            env.tasks(split)  # ValueError naming an unknown split, before the workdir is touched
        if reuse_from:
            seed = lambda: reuse.seed_workdir(
                reuse_from,
                workdir,
                cfg.to_json(),
                defaults=ExperimentConfig().to_json(),
                execution_fields=EXECUTION_FIELDS,
            )
            processes.on_primary("reuse", seed)
        reused = reuse.read_record(workdir)
        if reuse_from:
            log.info(reuse.describe(reused))
        store = RunStore(workdir)
        config_check = dict(defaults=ExperimentConfig().to_json(), execution_fields=EXECUTION_FIELDS)
        store.check_config(cfg.to_json(), **config_check, record=False)  # refused before anything is written
        processes.barrier("workdir read")  # every process read the stage records before any is added
        train_split = list(env.tasks(cfg.env.train_split))
        eval_tasks = {
            split: pick_tasks(env.tasks(split), cfg.env.eval_tasks, cfg.env.eval_task_subset)
            for split in cfg.env.eval_splits
        }
        check = lambda e: _check_expert_coverage(cfg, train_split, e)  # noqa: E731
        experts = processes.primary_first(
            "experts", lambda: load_or_generate_experts(env, cfg.env, store.workdir, check)
        )
        store.check_config(cfg.to_json(), **config_check)
    finally:
        env.close()
    train_tasks = explored_tasks(train_split, cfg.env.explore_tasks, experts)
    paired = tasks_with_experts(train_tasks, experts)
    log.info(
        "%s: %d experts, %d train tasks (%d with an expert), eval %s",
        cfg.env.name,
        len(experts),
        len(train_tasks),
        len(paired),
        {s: len(t) for s, t in eval_tasks.items()},
    )
    setup = build_setup(cfg, store.workdir, experts)
    results = {
        "env": cfg.env.name,
        "seed": cfg.seed,
        "splits": list(cfg.env.eval_splits),
        "methods": {},
        "config": cfg.to_json(),
        "counts": {
            "experts": len(experts),
            "train_tasks": len(train_tasks),
            "train_tasks_with_experts": len(paired),
            **{f"{s}_tasks": len(t) for s, t in eval_tasks.items()},
        },
    }
    if reused is not None:
        results["reused"] = {"from": reused["source"], "stages": reused["stages"]}
    results_path = os.path.join(store.workdir, RESULTS_FILE)
    with _scalar_writer(os.path.join(store.workdir, "tensorboard")) as writer:
        stages = Stages(
            setup,
            store,
            env_factory,
            experts,
            train_tasks,
            eval_tasks,
            on_scalars=lambda tag, step, values: writer.scalars(step, values, prefix=tag),
        )
        if any(m in FAILURE_AGENT_METHODS for m in cfg.methods):
            stages.base_sfts()
        elif any(m != "zero_shot" for m in cfg.methods):  # every other method starts from the SFT target
            stages.base_sft("target")
        for method in cfg.methods:
            title = METHOD_TITLES[method]
            results["methods"][title] = {"iterations": []}

            def on_iteration(entry, title=title, method=method):
                iterations = results["methods"][title]["iterations"]
                iterations[:] = [e for e in iterations if e["iteration"] != entry["iteration"]] + [entry]
                _eval_scalars(writer, method, entry)
                if processes.is_primary():
                    write_json_atomic(results_path, results)

            METHOD_RUNNERS[method](stages, cfg.iterations, on_iteration)
    store.close()
    if processes.is_primary():
        paths = report.write_reports(results, store.workdir)
        log.info("reports: %s", ", ".join(str(p) for p in paths.values()))
        _log_mechanism(results)
    processes.barrier("reports")
    return results
