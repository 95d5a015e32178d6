"""CoEvolve (arXiv 2604.15840): weakness signals from rollouts, signal-guided re-exploration, task synthesis
and verification by execution, and the task pool they feed.

* `patterns`: each environment's action patterns (the rare signal's unit).
* `signals`: the forgetting, boundary and rare signals, pure functions of rollout records.
"""
