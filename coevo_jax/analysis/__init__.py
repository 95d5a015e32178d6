"""Analysis that published numbers rest on, each module an entry point: `python -m coevo_jax.analysis.<tool>`.

Most read a run's working directory (its config, experts, saved policies and records; the replaying tools
open it with `experiment.finished_run.open_run`). Two read the environments' own expert data.

- `dev_eval`: a run's saved policies played greedily on held-out train tasks (a check off the test splits).
- `sampled_eval`: a run's saved policies sampled on its test tasks, paired per task against a baseline policy.
- `grpo_paired_baseline`: every GRPO step replayed with the SFT policy on the same tasks and sampling seeds.
- `grpo_logprob_gap`: the sampler's and the GRPO step's log-probs of the same sampled tokens, per dtype pair.
- `dpo_lr_probe`: ETO's DPO phase at several learning rates from a run's SFT policy, judged on held-out tasks.
- `preference_sweep`: what each preference-phase setting of a sweep of runs did, one row per run and method.
- `coevolve_round`: CoEvolve rounds on each environment's experts replayed as fake rollouts.
- `room_recall`: built-in episodes whose thoughts put a thing in another room than the task text gave.
- `bfcl_sizes`: BFCL's task and expert lengths in SmolLM2 tokens, replay and checker times.
"""
