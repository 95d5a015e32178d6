"""`python -m coevo_jax.experiment.export WORKDIR OUT_DIR`: a run's data as TFDS datasets, to publish and reuse.

    python -m coevo_jax.experiment.export workdir_tiny published/tiny [--what trajectories,pairs]

OUT_DIR is a TFDS data_dir (`tfds_builders`: array_record files, readable without TensorFlow). It gets
* `coevo_trajectories/1.2.0`: the run's experts and each finished exploration and evaluation, one split each
  (`experts`, `explore_<policy>_it<k>`, `eval_<policy>_<split>`, `explore_<method>_step<n>`: `run_data`);
* `coevo_preference_pairs/1.2.0`: the pairs each finished DPO phase trained on, one split per phase, named
  after the policy it trained (`eto_it1_target`, `coevo_it1_failure`, ...), with the phase's report. They
  are rebuilt (runs from before the job kept them in `pairs/` export too) by replaying the run's own method
  code over its stage records (the same builders with the same arguments) and checked against the report
  each phase recorded.
Each dataset's metadata names the workdir file or stage every split came from; the trajectories' also holds
the run's config.

Reuse: `--config.env.experts_path=OUT_DIR:experts` trains a run on the published experts;
`data.sources.read_pair_source("OUT_DIR:eto_it1_target")` gives a phase's pairs for a DPO phase.

Everything is read and checked before anything is written (a bad record: `DataFormatError` naming its file
and record); the datasets are written in a temporary directory inside OUT_DIR and moved into place once all
are complete, so a refused or failed export leaves nothing behind. A dataset already in OUT_DIR is never
overwritten (refused). Empty splits (TFDS writes none) and rollout files of unfinished stages are reported
as left out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

from coevo_jax.experiment import run_data

WHAT = ("trajectories", "pairs")


def _collect(workdir: str, what: Sequence[str]) -> tuple[dict, dict, list[str]]:
    """({what: {split: items}}, {what: metadata}, what is left out), read from the workdir; empty splits
    are left out (TFDS writes none)."""
    config, _ = run_data.read_run(workdir)
    splits, metadata, left_out = {}, {}, []
    if "trajectories" in what:
        found = run_data.trajectory_splits(workdir)
        kept = {s: v for s, v in found.items() if v.trajectories}
        splits["trajectories"] = {s: v.trajectories for s, v in kept.items()}
        metadata["trajectories"] = {
            "sources": {s: v.source for s, v in kept.items()},
            "config": config.to_json(),
        }
        left_out += [f"{v.source}: no trajectories" for s, v in found.items() if s not in kept]
        exported = {v.source for v in found.values()}
        left_out += [f"{p}: stage not finished" for p in run_data.unfinished_files(workdir, exported)]
    if "pairs" in what:
        found = run_data.pair_splits(workdir)
        kept = {s: v for s, v in found.items() if len(v.dataset)}
        splits["pairs"] = {s: v.dataset for s, v in kept.items()}
        metadata["pairs"] = {"stages": {s: v.stage for s, v in kept.items()}}
        left_out += [f"{v.stage}: no pairs" for s, v in found.items() if s not in kept]
    return splits, metadata, left_out


def _move_into_place(built: dict[str, str], targets: dict[str, str]) -> None:
    """Renames each built version directory to its target; on any failure undoes what it moved and removes
    the directories it created, then raises."""
    created = [d for d in dict.fromkeys(map(os.path.dirname, targets.values())) if not os.path.exists(d)]
    moved = []
    try:
        for what, path in built.items():
            os.makedirs(os.path.dirname(targets[what]), exist_ok=True)
            os.rename(path, targets[what])
            moved.append(targets[what])
    except BaseException:
        for path in moved:
            shutil.rmtree(path, ignore_errors=True)
        for path in reversed(created):
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
        raise


def export_run(workdir: str, out_dir: str, what: Sequence[str] = WHAT) -> dict:
    """Writes the run's datasets into out_dir (see the module docstring); returns what was written:
    {"datasets": {version directory: {split: records}}, "left_out": [...]}."""
    from coevo_jax.data import tfds_builders

    if not what or any(w not in WHAT for w in what):
        raise ValueError(f"what {list(what)}: one or more of {WHAT}")
    builders = {"trajectories": tfds_builders.CoevoTrajectories, "pairs": tfds_builders.CoevoPreferencePairs}
    writers = {
        "trajectories": tfds_builders.write_trajectories_dataset,
        "pairs": tfds_builders.write_pairs_dataset,
    }
    workdir, out_dir = os.path.abspath(workdir), os.path.abspath(out_dir)
    targets = {w: os.path.join(out_dir, builders[w].name, str(builders[w].VERSION)) for w in what}
    taken = [path for path in targets.values() if os.path.exists(path)]
    if taken:
        raise FileExistsError(f"{', '.join(taken)}: already exported; choose another OUT_DIR or remove it")
    splits, metadata, left_out = _collect(workdir, what)
    splits = {w: s for w, s in splits.items() if s}
    out_dir_existed = os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".export-", dir=out_dir)
    try:
        built = {w: writers[w](s, scratch, metadata=metadata[w]) for w, s in splits.items()}
        written = {targets[w]: tfds_builders.split_sizes(path, builders[w].name) for w, path in built.items()}
        _move_into_place(built, {w: targets[w] for w in built})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not out_dir_existed and not os.listdir(out_dir):
            os.rmdir(out_dir)
    return {"datasets": written, "left_out": left_out}


def describe(report: dict) -> str:
    """The export's report as text: each dataset's directory, its splits and their record counts."""
    lines = []
    for path, sizes in report["datasets"].items():
        lines.append(f"{path}: {len(sizes)} splits, {sum(sizes.values())} records")
        width = max(map(len, sizes), default=0)
        lines += [f"  {split:<{width}}  {count}" for split, count in sizes.items()]
    if not report["datasets"]:
        lines.append("nothing to export")
    lines += [f"left out: {item}" for item in report["left_out"]]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m coevo_jax.experiment.export", description=__doc__.split("\n")[0]
    )
    parser.add_argument("workdir", help="a run's workdir (finished or partial)")
    parser.add_argument("out_dir", help="the TFDS data_dir to write the datasets in")
    parser.add_argument(
        "--what", default=",".join(WHAT), help=f"comma-separated, any of {', '.join(WHAT)} (default: both)"
    )
    args = parser.parse_args(argv)
    what = [w.strip() for w in args.what.split(",") if w.strip()]
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    try:
        report = export_run(args.workdir, args.out_dir, what)
    except (OSError, ValueError) as error:  # DataFormatError is a ValueError naming file, record and field
        print(f"export refused: {error}", file=sys.stderr)
        return 1
    print(describe(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
