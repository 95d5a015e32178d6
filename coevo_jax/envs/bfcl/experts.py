"""Expert demonstrations from BFCL's ground truth (its possible answer for each turn).

A turn whose answer has calls is one step making all of them (in the answer's order, as `calls` rewrites
them: every argument named, BFCL's few positional ones included), then `[]`; a turn whose answer is no call
(miss_func before the function is added, miss_param's incomplete requests, three base requests nothing can
serve) is `[]` alone. Thoughts are templated. The environment replays them through the real backends, so
the observations are the real outputs, and keeps those BFCL's checker scores 1.0.
"""

from __future__ import annotations

from coevo_jax.envs.base import ExpertStep
from coevo_jax.envs.bfcl.backend import function_signatures
from coevo_jax.envs.bfcl.calls import call_kwargs, call_source, parse_call_list
from coevo_jax.envs.bfcl.data import BfclTask

END_TURN = ExpertStep("That completes the request, so I end my turn.", "[]")
NO_CALL = ExpertStep(
    "I cannot do this with the functions and information I have, so I make no call and end my turn.", "[]"
)


def keyword_call(call_text: str) -> str:
    """One ground-truth call of any backend function as `calls` rewrites it (every argument named)."""
    calls = parse_call_list(call_text)
    if len(calls) != 1:
        raise ValueError(f"bfcl: ground-truth call {call_text!r} is not one function call")
    return call_source(*call_kwargs(calls[0], function_signatures()))


def _thought(calls: list[str]) -> str:
    names = list(dict.fromkeys(call.split("(", 1)[0] for call in calls))
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"To do this I call {listed}."


def expert_steps(task: BfclTask) -> list[ExpertStep]:
    """The ground truth of `task` as steps (see the module docstring)."""
    steps = []
    for answer in task.ground_truth:
        if not answer:
            steps.append(NO_CALL)
            continue
        calls = [keyword_call(call) for call in answer]
        steps += [ExpertStep(_thought(calls), f"[{', '.join(calls)}]"), END_TURN]
    return steps
