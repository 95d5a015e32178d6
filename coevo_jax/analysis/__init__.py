"""Tools any run's workdir may need, behind one entry point: `python -m coevo_jax.analysis TOOL [ARGS ...]`.

- `preference_sweep`: what each preference-phase setting of a sweep of runs did against its SFT policy.
- `sampled_eval`: a run's saved policies sampled on its test tasks, paired per task against a baseline policy.
- `dev_eval`: a run's saved policies played greedily on held-out train tasks (a check off the test splits).
- `hard_negatives`: how many hard negatives a run's pair phases trained on, at several reward thresholds.
- `grpo_logprob_gap`: the sampler's and the GRPO step's log-probs of the same sampled tokens, per dtype pair.

Scripts that only one study needs live in that study's folder (`studies/<name>/`).
"""
