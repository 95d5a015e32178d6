"""Kill-and-resume drill: `python launch/kill_resume_drill.py --workdir DIR [--config configs/tiny.py:drill]`.

Runs the main job once uninterrupted (DIR/uninterrupted) and once more in DIR/killed, SIGKILLed at five
points in turn (`launch/kill_at.py`: an SFT update, a policy save, an evaluation episode, an exploration
episode, a DPO update), each resumed by the next process with the same command, the last one unpatched.
Then compares the two workdirs: every saved policy's parameters (checksum of the restored arrays), every
trajectory file (as a set of records keyed by trajectory id) and `results.json`.

Differences that are legitimate and therefore left out of the comparison:
* `final_tokens_per_second` in results.json: a throughput measured with the wall clock.
* the line order of trajectory files: lines are appended as episodes finish, and a resumed rollout
  finishes its remaining episodes in another order.
* the last bits of the sampler's log-probs kept in trajectory records (`tokens.logprobs`): float32 values
  whose rounding depends on what else shared the decode batch (the attention window is the longest row's,
  the shared prompt prefix is the first two prompts'), and a resumed rollout batches its remaining episodes
  differently. They are compared to within LOGPROB_ATOL; token ids, texts and rewards exactly.
Also checks that a resume redoes nothing: every stage recorded when a process died keeps its record to the
end, and no trajectory file holds an episode twice.
Prints a table per kill point and exits 1 on any other difference (or a kill that did not happen).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WALL_CLOCK_FIELDS = ("final_tokens_per_second",)
LOGPROB_ATOL = 1e-5  # a float32 ulp at |log p| ~ 8 is 1e-6
# (point, call), in the order the run reaches them; each call counts from the start of its own process.
# SFT's 4th update comes right after the asynchronous save of its step-2 checkpoint began, which the kill
# usually leaves uncommitted (the phase restarts); ETO's 5th comes after a committed one (the phase restores).
KILLS = (("sft", 4), ("save", 2), ("eval", 3), ("explore", 3), ("dpo", 5))


@dataclasses.dataclass
class Kill:
    point: str
    call: int
    returncode: int | None = None
    detail: str = ""
    done: dict = dataclasses.field(default_factory=dict)  # stage records when the process died
    left: str = ""  # partial state the kill left for the resume
    stage: str = ""  # the first stage, in the uninterrupted run's order, not among `done`


def child_env(devices: int) -> dict:
    """The environment of every main-job process: the same device count whatever the caller's XLA_FLAGS."""
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def _job_flags(config: str, workdir: str) -> list[str]:
    return [f"--config={config}", f"--workdir={workdir}"]


def _run(command: list[str], env: dict, log_path: str) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def _stage_records(workdir: str) -> dict:
    """stages.json: {stage: its record}, in the order the stages finished."""
    path = os.path.join(workdir, "stages.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def killed_and_resumed(config: str, workdir: str, env: dict) -> list[Kill]:
    """Runs the kill chain in `workdir`; the last process (no kill) must finish."""
    kills, log_path = [], workdir + ".log"
    for point, call in KILLS:
        kill, note = Kill(point, call), os.path.join(os.path.dirname(workdir), f"kill_{point}.json")
        command = [sys.executable, os.path.join(ROOT, "launch", "kill_at.py"), point, str(call), note]
        kill.returncode = _run(command + _job_flags(config, workdir), env, log_path).wait()
        if os.path.exists(note):
            with open(note) as f:
                kill.detail = json.load(f)["detail"]
        kill.done, kill.left = _stage_records(workdir), left_behind(workdir)
        kills.append(kill)
    final = _run([sys.executable, "-m", "coevo_jax.main", *_job_flags(config, workdir)], env, log_path)
    if final.wait() != 0:
        raise RuntimeError(f"the last resume failed (exit {final.returncode}); see {log_path}")
    return kills


def left_behind(workdir: str) -> str:
    """What a killed process left for the next: mid-phase checkpoints, uncommitted saves, torn lines."""
    found = []
    partial = os.path.join(workdir, "partial")
    for stage in sorted(os.listdir(partial)) if os.path.isdir(partial) else []:
        state = os.path.join(partial, stage, "state")
        names = os.listdir(state) if os.path.isdir(state) else []
        steps = sorted(int(n) for n in names if n.isdigit())
        found.append(f"{stage}: checkpoint {steps[-1]}" if steps else f"{stage}: no checkpoint")
        found += [f"{stage}: uncommitted {n.split('.')[0]}" for n in names if not n.isdigit()]
    policies = os.path.join(workdir, "policies")
    if os.path.isdir(policies):
        found += [f"policies/{n}" for n in sorted(os.listdir(policies)) if "tmp" in n]
    rollouts = os.path.join(workdir, "rollouts")
    for name in sorted(os.listdir(rollouts)) if os.path.isdir(rollouts) else []:
        with open(os.path.join(rollouts, name), "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            episodes = data.count(b"\n")
            found.append(f"{name}: {episodes} episodes + a torn line")
    return "; ".join(found) or "-"


def _first_missing(order: list[str], done: list[str]) -> str:
    return next((name for name in order if name not in done), "(none)")


def saved_policies(workdir: str) -> dict[str, dict]:
    """Each saved policy of `workdir` restored as a tree of NumPy arrays (no mesh needed), by name."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    out, root = {}, os.path.join(workdir, "policies")
    with ocp.PyTreeCheckpointer() as checkpointer:
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            metadata = checkpointer.metadata(path).item_metadata.tree
            restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
            out[name] = checkpointer.restore(path, restore_args=restore_args)
    return out


def policy_checksums(workdir: str) -> dict[str, str]:
    """sha256 of each saved policy's restored arrays (paths, dtypes, shapes and bytes)."""
    import jax
    import numpy as np

    out = {}
    for name, tree in saved_policies(workdir).items():
        digest = hashlib.sha256()
        for key, leaf in sorted(jax.tree_util.tree_flatten_with_path(tree)[0], key=lambda kv: str(kv[0])):
            leaf = np.ascontiguousarray(leaf)
            digest.update(f"{jax.tree_util.keystr(key)}:{leaf.dtype}:{leaf.shape}".encode())
            digest.update(leaf.tobytes())
        out[name] = digest.hexdigest()
    return out


def trajectory_files(workdir: str) -> dict[str, dict[str, dict]]:
    """Each trajectory file under rollouts/ as {trajectory id: its record}."""
    return {name: {r["id"]: r for r in records} for name, records in _trajectory_lines(workdir).items()}


def duplicated_episodes(workdir: str) -> list[str]:
    """'file: id' of every episode a trajectory file holds more than once (a resume must append only what
    its killed process had not finished)."""
    found = []
    for name, records in _trajectory_lines(workdir).items():
        ids = [r["id"] for r in records]
        found += [f"{name}: {i}" for i in sorted({i for i in ids if ids.count(i) > 1})]
    return found


def _trajectory_lines(workdir: str) -> dict[str, list[dict]]:
    out, root = {}, os.path.join(workdir, "rollouts")
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name)) as f:
            out[name] = [json.loads(line) for line in f if line.strip()]
    return out


def same_trajectories(a: dict[str, dict] | None, b: dict[str, dict] | None) -> bool:
    """Whether two trajectory files hold the same records: exactly, but for the sampler's log-probs,
    which may differ in their last bits (see the module docstring)."""
    if a is None or b is None or set(a) != set(b):
        return False
    return all(_same_record(a[key], b[key]) for key in a)


def _same_record(a: dict, b: dict) -> bool:
    tokens_a, tokens_b = a.get("tokens") or {}, b.get("tokens") or {}
    logprobs_a, logprobs_b = tokens_a.get("logprobs"), tokens_b.get("logprobs")
    if logprobs_a is not None and logprobs_b is not None:
        if len(logprobs_a) != len(logprobs_b) or any(
            abs(x - y) > LOGPROB_ATOL for x, y in zip(logprobs_a, logprobs_b, strict=True)
        ):
            return False
        a = {**a, "tokens": {k: v for k, v in tokens_a.items() if k != "logprobs"}}
        b = {**b, "tokens": {k: v for k, v in tokens_b.items() if k != "logprobs"}}
    return a == b


def _same_output(kind: str, first, second) -> bool:
    return first == second if kind == "policy" else same_trajectories(first, second)


def _without_wall_clock(data):
    if isinstance(data, dict):
        return {k: _without_wall_clock(v) for k, v in data.items() if k not in WALL_CLOCK_FIELDS}
    if isinstance(data, list):
        return [_without_wall_clock(v) for v in data]
    return data


def differences(a, b, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{prefix}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{prefix}[{i}]")
        ]
    return [] if a == b else [prefix or "."]


def _stage_outputs(stage: str) -> tuple[str, str]:
    """('policy' or 'rollouts', name) of what a stage writes (the names `Stages` gives them)."""
    kind, _, rest = stage.partition("/")
    if kind == "train":
        return "policy", rest
    if kind == "explore":
        policy, iteration = rest.split("/")
        return "rollouts", f"{policy}_{iteration}_explore.jsonl"
    policy, split = rest.split("/")
    return "rollouts", f"{policy}_{split}.jsonl"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="new or empty directory for both runs")
    parser.add_argument("--config", default=os.path.join(ROOT, "configs", "tiny.py") + ":drill")
    parser.add_argument("--devices", type=int, default=2, help="CPU devices of every process (host platform)")
    args = parser.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if os.listdir(args.workdir):
        raise SystemExit(f"{args.workdir}: not empty")
    env, start = child_env(args.devices), time.perf_counter()
    whole, killed = os.path.join(args.workdir, "uninterrupted"), os.path.join(args.workdir, "killed")
    baseline = _run(  # alongside the kill chain: nothing of one depends on the other
        [sys.executable, "-m", "coevo_jax.main", *_job_flags(args.config, whole)], env, whole + ".log"
    )
    try:
        kills = killed_and_resumed(args.config, killed, env)
    except BaseException:  # a failed chain does not leave the uninterrupted run going on its own
        baseline.kill()
        raise
    if baseline.wait() != 0:
        raise RuntimeError(f"the uninterrupted run failed (exit {baseline.returncode}); see {whole}.log")
    order, done_at_end = list(_stage_records(whole)), _stage_records(killed)
    for kill in kills:
        kill.stage = _first_missing(order, kill.done)

    policies = (policy_checksums(whole), policy_checksums(killed))
    rollouts = (trajectory_files(whole), trajectory_files(killed))
    with open(os.path.join(whole, "results.json")) as f, open(os.path.join(killed, "results.json")) as g:
        results = differences(_without_wall_clock(json.load(f)), _without_wall_clock(json.load(g)))

    same_files = {n: same_trajectories(rollouts[0].get(n), r) for n, r in rollouts[1].items()}
    failed = bool(results) or policies[0] != policies[1] or set(rollouts[0]) != set(same_files)
    failed |= not all(same_files.values())
    redone = sorted({s for kill in kills for s, record in kill.done.items() if done_at_end.get(s) != record})
    duplicated = duplicated_episodes(killed)
    failed |= bool(redone or duplicated)
    print(f"| point | killed at | stage | left behind | resumed ok | stage output identical |\n|{'---|' * 6}")
    for kill in kills:
        resumed = kill.returncode == -9 and kill.stage in done_at_end
        kind, name = _stage_outputs(kill.stage) if kill.stage != "(none)" else ("", "")
        found = policies if kind == "policy" else rollouts
        same = bool(name) and name in found[0] and _same_output(kind, found[0].get(name), found[1].get(name))
        failed |= not (resumed and same)
        where = kill.detail or f"not killed (exit {kill.returncode})"
        row = (kill.point, f"call {kill.call}: {where}", kill.stage, kill.left, _yes(resumed), _yes(same))
        print(f"| {' | '.join(row)} |")
    print()
    same_policies = sum(policies[0].get(n) == h for n, h in policies[1].items())
    same_rollouts = sum(same_files.values())
    print(f"policies identical: {same_policies}/{len(policies[0])} ({', '.join(policies[0])})")
    exact = f"as sets of records, log-probs to {LOGPROB_ATOL}"
    print(f"trajectory files identical ({exact}): {same_rollouts}/{len(rollouts[0])}")
    ignored = ", ".join(WALL_CLOCK_FIELDS)
    print(f"results.json identical (ignoring {ignored}): {_yes(not results)} {' '.join(results[:10])}")
    print(f"finished stages redone by a resume: {len(redone)} {' '.join(redone)}")
    print(f"episodes written twice: {len(duplicated)} {' '.join(duplicated[:10])}")
    print(f"drill wall time: {time.perf_counter() - start:.0f} s")
    return int(failed)


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


if __name__ == "__main__":
    sys.exit(main())
