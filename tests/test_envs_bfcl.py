"""BFCL multi-turn on the real data of the installed `bfcl-eval`: experts, BFCL's checker as the reward, turns,
the step limit, per-turn accuracy, miss_func / miss_param, safe decoding, splits, docs, the rollout loop and
the main job with a tiny policy."""

import ast
import importlib.util
import json
import pathlib
import sys

import pytest
from seeds import fresh_seed

from coevo_jax import envs
from coevo_jax.data.record_reader import read_trajectories
from coevo_jax.envs.bfcl import BfclEnv, backend
from coevo_jax.envs.bfcl.backend import function_signatures
from coevo_jax.envs.bfcl.calls import decode_action
from coevo_jax.envs.bfcl.data import (
    BFCL_VERSION,
    CATEGORIES,
    MULTI_TURN_CLASSES,
    PYTHON_HINT,
    bfcl_module,
    class_docs,
    load_category,
)
from coevo_jax.envs.bfcl.docs import compact_docs, render_docs, signature
from coevo_jax.envs.bfcl.experts import END_TURN, NO_CALL, expert_steps, keyword_call
from coevo_jax.experiment import rollouts
from coevo_jax.experiment.config import ExperimentConfig
from coevo_jax.experiment.run import check_env_config, run
from coevo_jax.react import format_reply
from coevo_jax.rollout import RolloutConfig, ScriptedActor, run_rollouts

BASE_0 = "multi_turn_base_0"  # TwitterAPI + GorillaFileSystem, 4 turns, every turn has calls


@pytest.fixture(scope="module")
def env():
    environment = envs.make("bfcl", category="multi_turn_base")
    yield environment
    environment.close()


def expert_actions(env, task_id):
    return [step.action for step in expert_steps(env.task(task_id))]


def play(env, task_id, actions):
    """Resets `task_id` and plays `actions`; the last step's (observation, reward, done, info)."""
    env.reset(task_id)
    result = None
    for action in actions:
        assert result is None or not result[2], "the episode ended early"
        result = env.step(action)
    return result


def turn_actions(env, task_id):
    """The expert's actions grouped by turn (each turn's last action is `[]`)."""
    turns, current = [], []
    for action in expert_actions(env, task_id):
        current.append(action)
        if action == "[]":
            turns.append(current)
            current = []
    return turns


# -- experts and the reward -------------------------------------------------------------------------------------
@pytest.mark.parametrize("category", CATEGORIES)
def test_bfcls_checker_scores_every_expert_of_every_task_one(category):
    """All 800 tasks: BFCL's ground truth, replayed through the backends, passes BFCL's checker (reward 1.0)."""
    environment = BfclEnv(category=category)
    kept = {split: environment.expert_trajectories(split) for split in ("train", "test")}
    assert [len(kept["train"]), len(kept["test"])] == [150, 50]  # none left out: each scored 1.0
    for split, trajectories in kept.items():
        assert [t.task_id for t in trajectories] == environment.tasks(split)
        for trajectory in trajectories:
            assert trajectory.reward == 1.0 and trajectory.prompt_len == 3 and trajectory.env == "bfcl"
            assert trajectory.messages[-1].content.endswith("Action: []")
    task_id = kept["test"][-1].task_id
    play(environment, task_id, expert_actions(environment, task_id))
    assert environment.episode_metrics() == {"turn_accuracy": 1.0, "graded_score": 1.0}
    environment.close()


def _call_forms(call_text: str) -> str:
    """How a ground-truth call passes its arguments: keyword, positional or positional+keyword."""
    call = ast.parse(call_text, mode="eval").body
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Name), call_text
    for node in [*call.args, *(k.value for k in call.keywords)]:
        ast.literal_eval(node)  # every value is a literal
    assert all(k.arg is not None for k in call.keywords), call_text
    return "+".join(kind for kind, nodes in (("positional", call.args), ("keyword", call.keywords)) if nodes)


# Ground-truth calls with positional arguments, per category (bfcl-eval 2026.3.23): positional only, mixed.
POSITIONAL_CALLS = {"positional": 38, "positional+keyword": 2}


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_ground_truth_written_as_bfcl_stores_it_scores_one(category):
    """All 800 tasks: each turn's ground-truth calls, verbatim, as one action (then `[]`), through
    `env.step`: accepted, and BFCL's checker gives the episode reward 1.0. The calls use three forms:
    keyword arguments, positional ones, and positional before keyword ones; all values are literals."""
    environment = BfclEnv(category=category)
    forms, scores = [], {}
    for task_id in environment.tasks("all"):
        environment.reset(task_id)
        for calls in environment.task(task_id).ground_truth:
            forms += [_call_forms(call) for call in calls]
            if calls:
                observation, _, _, info = environment.step(f"[{', '.join(calls)}]")
                assert "error" not in info, (task_id, observation)
            _, reward, done, _ = environment.step("[]")
        assert done
        scores[task_id] = reward
    environment.close()
    assert len(scores) == 200 and set(scores.values()) == {1.0}
    counts = {form: forms.count(form) for form in set(forms)}
    assert set(counts) == {"", "keyword", *POSITIONAL_CALLS}  # "": a call without arguments
    assert {form: counts[form] for form in POSITIONAL_CALLS} == POSITIONAL_CALLS


def test_expert_steps_name_positional_arguments_and_end_every_turn():
    assert keyword_call("sort('final_report.pdf')") == "sort(file_name='final_report.pdf')"
    assert keyword_call("mv(source='a',destination='b')") == "mv(source='a', destination='b')"
    task = load_category("multi_turn_miss_param")["multi_turn_miss_param_0"]
    steps = expert_steps(task)
    assert steps.count(END_TURN) == sum(bool(a) for a in task.ground_truth)
    assert steps.count(NO_CALL) == sum(not a for a in task.ground_truth) == 1
    assert sum(s.action == "[]" for s in steps) == task.num_turns


def test_a_wrong_action_sequence_scores_zero(env):
    turns = turn_actions(env, BASE_0)
    flat = [a for turn in turns for a in turn]
    assert play(env, BASE_0, flat)[1] == 1.0

    # The last turn skipped: its request is never served.
    _, reward, done, info = play(env, BASE_0, [a for turn in turns[:-1] for a in turn] + ["[]"])
    assert done and reward == 0.0 and info["checker_error"] == "multi_turn:empty_turn_model_response"
    assert info["turns_passed"] == [True, True, True, False] and info["turn_accuracy"] == 0.75

    # One extra directory in the first turn: the file system's state differs from the ground truth's.
    extra = [turns[0][0][:-1] + ", mkdir(dir_name='extra')]", *turns[0][1:]]
    _, reward, _, info = play(env, BASE_0, extra + [a for turn in turns[1:] for a in turn])
    assert reward == 0.0 and info["checker_error"] == "multi_turn:instance_state_mismatch"
    assert info["turns_passed"] == [False, False, False, False]  # the extra directory stays

    # The right calls with a wrong value: grep finds nothing, not the ground truth's line.
    wrong = [a.replace("pattern='budget analysis'", "pattern='no such text'") for a in flat]
    assert wrong != flat
    _, reward, _, info = play(env, BASE_0, wrong)
    assert reward == 0.0 and info["checker_error"] == "multi_turn:execution_response_mismatch"
    assert info["turns_passed"] == [True, False, True, True]


def test_per_turn_results_agree_with_bfcls_verdict_on_perturbed_episodes():
    """Reward 1.0 exactly when every turn passes, over episodes with one turn's calls dropped or changed."""
    seed = fresh_seed()
    outcomes = set()
    for category in CATEGORIES:
        environment = BfclEnv(category=category)
        for number in range(seed % 7, 200, 23):
            task_id = f"{category}_{number}"
            turns = turn_actions(environment, task_id)
            broken = (seed + number) % len(turns)
            if number % 2:
                turns[broken] = ["[]"]
            else:
                turns[broken] = [a.replace("'", "'x", 1) for a in turns[broken]]
            _, reward, done, info = play(environment, task_id, [a for turn in turns for a in turn])
            assert done and reward == float(all(info["turns_passed"])), (task_id, info)
            assert environment.episode_metrics()["turn_accuracy"] == info["turn_accuracy"]
            outcomes.add(reward)
        environment.close()
    assert outcomes == {0.0, 1.0}  # a dropped [] on an irrelevance turn changes nothing: both occur


# -- turns, steps and observations ------------------------------------------------------------------------------
def test_an_empty_list_ends_the_turn_and_the_next_user_turn_follows(env):
    task = env.task(BASE_0)
    text = env.reset(BASE_0)
    assert text.startswith("Functions you can call:\n") and text.endswith(f"User: {task.questions[0]}")
    for turn in range(1, task.num_turns):
        action = ("[]", "", "```[]```")[turn % 3]  # BFCL's decoder reads all three as no call
        observation, reward, done, info = env.step(action)
        assert (observation, reward, done, info) == (
            f"User: {task.questions[turn]}",
            0.0,
            False,
            {"turn": turn},
        )
    observation, reward, done, info = env.step("[]")
    assert done and reward == 0.0 and info["turns_passed"] == [False] * task.num_turns
    with pytest.raises(RuntimeError, match="without an episode"):
        env.step("[]")


def test_calls_run_in_order_and_their_outputs_are_the_observation(env):
    env.reset(BASE_0)
    observation, reward, done, _ = env.step("[cd(folder='document'), pwd(), ls()]")
    assert observation.splitlines() == [
        """cd(folder='document') -> {"current_working_directory": "document"}""",
        """pwd() -> {"current_working_directory": "/workspace/document"}""",
        """ls() -> {"current_directory_content": ["final_report.pdf", "previous_report.pdf"]}""",
    ]
    assert (reward, done) == (0.0, False)


def test_a_turn_holds_twenty_steps_and_a_twenty_first_force_quits(env):
    task = env.task(BASE_0)
    assert env.max_steps(BASE_0) == 21 * task.num_turns
    env.reset(BASE_0)
    for step in range(20):
        observation, _, done, _ = env.step("[pwd()]" if step % 2 else "not a call")  # errors count too
        assert not done
    observation, reward, done, info = env.step("[]")  # the 21st step may still end the turn
    assert not done and observation == f"User: {task.questions[1]}"
    for _ in range(20):
        assert not env.step("[pwd()]")[2]
    observation, reward, done, info = env.step("[pwd()]")
    assert done and reward == 0.0 and observation.startswith("Forced to quit")
    assert info["checker_error"] == "multi_turn:force_terminated" and len(info["turns_passed"]) == 4


MALFORMED = [
    ("ls(", "not valid Python"),
    ("Let me list the files first.", "not valid Python"),
    ("[1, 2]", "every element of the list must be a function call"),
    ("{'folder': 'document'}", "every element of the list must be a function call"),
    ("[os.system('touch /tmp/bfcl_pwned')]", "'os.system' is not a function name"),
    ("[__import__('os').system('touch /tmp/bfcl_pwned')]", "is not a function name"),
    ("[eval(source='1')]", "'eval' is not one of the functions of this task"),
    ("[open(file='/etc/passwd')]", "'open' is not one of the functions of this task"),
    ("[send_message(receiver_id='1', message='x')]", "'send_message' is not one of the functions"),
    ("[cd('document', folder='temp')]", "argument folder is given both by position and as folder="),
    ("[ls(True, False)]", "ls takes only 1 (a) positional arguments but got 2"),
    ("[pwd('document')]", "pwd takes no positional arguments but got 1"),
    ("[cd(*['document'])]", "* arguments are not accepted"),
    ("[cd(**{'folder': 'document'})]", "** arguments are not accepted"),
    ("[cd(folder=open('x'))]", "is not a literal value"),
    ("[cd(folder='docu' + 'ment')]", "is not a literal value"),
    ("[cd(folder=(lambda: 'document')())]", "is not a literal value"),
    ("[cd(open('x'))]", "cd: argument folder: \"open('x')\" is not a literal value"),
    ("[cd('docu' + 'ment')]", "cd: argument folder: \"'docu' + 'ment'\" is not a literal value"),
    ("[cd(os.sep)]", "cd: argument folder: 'os.sep' is not a literal value"),
    ("[cd((lambda: 'document')())]", "is not a literal value"),
    ("[cd(folder='document'), ls(True, True)]", "ls takes only 1"),  # nothing runs, cd neither
]


@pytest.mark.parametrize("action, message", MALFORMED)
def test_a_malformed_or_refused_action_is_an_error_observation_and_runs_nothing(env, action, message):
    env.reset(BASE_0)
    before = env.step("[pwd(), ls(a=True)]")[0]
    observation, reward, done, info = env.step(action)
    assert observation.startswith("Error: ") and message in observation and "error" in info
    assert (reward, done) == (0.0, False)
    assert env.step("[pwd(), ls(a=True)]")[0] == before  # nothing changed
    assert not pathlib.Path("/tmp/bfcl_pwned").exists()


def test_positional_arguments_bind_to_the_parameters_in_order():
    """As Python binds them, and as BFCL's executor runs its ground truth; the canonical call names them."""
    documented = {d["name"] for name in MULTI_TURN_CLASSES for d in class_docs()[name]}
    assert set(function_signatures()) == documented
    cases = {
        "sort('final_report.pdf')": "sort(file_name='final_report.pdf')",
        "mv('a.txt', 'b')": "mv(source='a.txt', destination='b')",
        "ls(True)": "ls(a=True)",
        "post_tweet('Hi', tags=['#t'], mentions=['@m'])": "post_tweet(content='Hi', tags=['#t'], mentions=['@m'])",
        "post_tweet('Hi', mentions=['@m'])": "post_tweet(content='Hi', mentions=['@m'])",
        "logarithm(8.0, 2.0, precision=4)": "logarithm(value=8.0, base=2.0, precision=4)",
        "cd(documents)": "cd(folder='documents')",  # a bare name is its text, as for keyword arguments
    }
    allowed = {"sort", "mv", "ls", "post_tweet", "logarithm", "cd"}
    for action, canonical in cases.items():
        assert decode_action(action, allowed).calls == (canonical,), action
        assert keyword_call(action) == canonical
    # The bounds hold however the argument is passed.
    assert "exponent must be at most 1000" in decode_action("power(10, 1000000000)", {"power"}).error
    # Only the task's functions, positional or not.
    assert "'sort' is not one of the functions" in decode_action("sort('a')", {"ls"}).error
    with pytest.raises(ValueError, match="positional arguments"):
        keyword_call("mv('a', 'b', 'c')")
    environment = BfclEnv()
    environment.reset(BASE_0)
    observation = environment.step("[cd('document'), sort('final_report.pdf')]")[0]
    assert observation.splitlines()[1].startswith("sort(file_name='final_report.pdf') -> ")
    assert "Error" not in observation
    environment.close()


def test_code_in_an_argument_is_only_text():
    decoded = decode_action(
        """[echo(content="'); __import__('os').system('touch /tmp/bfcl_pwned'); ('")]""", {"echo"}
    )
    assert decoded.calls == ("""echo(content="'); __import__('os').system('touch /tmp/bfcl_pwned'); ('")""",)
    environment = BfclEnv()
    environment.reset(BASE_0)
    observation = environment.step("[echo(content=\"__import__('os').system('touch /tmp/bfcl_pwned')\")]")[0]
    assert "__import__('os').system('touch /tmp/bfcl_pwned')" in observation
    assert not pathlib.Path("/tmp/bfcl_pwned").exists()
    # BFCL's decoder reads a bare name as its text; the argument bounds refuse a call that would not end.
    assert decode_action("cd(folder=document)", {"cd"}).calls == ("cd(folder='document')",)
    assert "at most 1000" in decode_action("[power(base=10, exponent=1000000000)]", {"power"}).error
    environment.close()


def test_long_observations_are_cut_at_max_observation_chars():
    task_id = "multi_turn_long_context_0"
    full, capped = (
        BfclEnv(category="multi_turn_long_context"),
        BfclEnv(category="multi_turn_long_context", max_observation_chars=200),
    )
    first_turn = expert_actions(full, task_id)[0]
    long_output = [
        play(e, task_id, [first_turn, "[]", "[cd(folder='temp'), cat(file_name='final_report.pdf')]"])[0]
        for e in (full, capped)
    ]
    assert len(long_output[0]) > 1000
    assert long_output[1] == long_output[0][:200] + " ... (truncated)"
    assert play(capped, task_id, expert_actions(capped, task_id))[1] == 1.0  # the reward is unaffected
    with pytest.raises(ValueError, match="max_observation_chars"):
        BfclEnv(max_observation_chars=0)


# -- miss_func, miss_param and the irrelevance check ------------------------------------------------------------
def test_miss_func_offers_a_held_back_function_only_from_the_turn_that_adds_it():
    environment = BfclEnv(category="multi_turn_miss_func")
    task = environment.task("multi_turn_miss_func_0")
    assert list(task.added_functions) == [3] and [d["name"] for d in task.added_functions[3]] == ["sort"]
    assert task.ground_truth[2] == () and task.questions[3] == ""
    text = environment.reset(task.task_id)
    assert (
        "\n- ls(" in text and "\n- sort(" not in text and "\n- sort(" in compact_docs(task.added_functions[3])
    )
    observations = [environment.step(a)[0] for a in expert_actions(environment, task.task_id)[:5]]
    assert all("sort(" not in o for o in observations[:-1])
    added = observations[-1]
    message = bfcl_module("constants.default_prompts").DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    assert added.startswith("New functions you can call:\n") and "\n- sort(file_name: str)" in added
    assert added.endswith(f"User: {message}") and message.startswith("I have updated some more functions")
    environment.close()


@pytest.mark.parametrize(
    "category, task_id, call",
    [
        ("multi_turn_miss_func", "multi_turn_miss_func_0", "[sort(file_name='final_report.pdf')]"),
        ("multi_turn_miss_param", "multi_turn_miss_param_0", "[pwd()]"),
    ],
)
def test_a_call_where_the_answer_is_none_fails_the_irrelevance_check(category, task_id, call):
    """The call changes no state, so only the irrelevance check (which BFCL's runner leaves out) fails it."""
    results = {}
    for irrelevance in (True, False):
        environment = BfclEnv(category=category, irrelevance_check=irrelevance)
        turns = turn_actions(environment, task_id)
        empty = [len(t) == 1 for t in turns].index(True)
        turns[empty] = [call, "[]"]
        results[irrelevance] = play(environment, task_id, [a for turn in turns for a in turn])
        environment.close()
    _, reward, _, info = results[True]
    assert reward == 0.0 and info["checker_error"] == "multi_turn:irrelevance_error:decoder_success"
    assert info["turns_passed"].count(False) == 1
    assert results[False][1] == 1.0 and all(results[False][3]["turns_passed"])


def test_an_action_bfcl_could_not_decode_is_no_call_for_the_irrelevance_check():
    environment = BfclEnv(category="multi_turn_miss_param")
    turns = turn_actions(environment, "multi_turn_miss_param_0")
    empty = [len(t) == 1 for t in turns].index(True)
    turns[empty] = ["Which file do you mean?", "[]"]
    assert play(environment, "multi_turn_miss_param_0", [a for turn in turns for a in turn])[1] == 1.0
    turns[empty] = ["[no_such_function()]", "[]"]  # a call list, refused: still an attempt
    assert play(environment, "multi_turn_miss_param_0", [a for turn in turns for a in turn])[1] == 0.0
    environment.close()


# -- tasks, splits, docs ------------------------------------------------------------------------------------------
def test_task_ids_are_bfcls_and_the_splits_are_fixed_by_task_number():
    numbers = {}
    for category in CATEGORIES:
        environment = BfclEnv(category=category)
        train, test = environment.tasks("train"), environment.tasks("test")
        assert sorted(train + test, key=lambda t: int(t.rsplit("_", 1)[1])) == [
            f"{category}_{n}" for n in range(200)
        ]
        assert len(train) == 150 and len(test) == 50 and not set(train) & set(test)
        assert BfclEnv(category=category).tasks("test") == test  # a fresh instance: the same lists
        assert environment.tasks("all") == [f"{category}_{n}" for n in range(200)]  # CoEvolve's protocol
        numbers[category] = [int(t.rsplit("_", 1)[1]) for t in test]
    assert all(n == list(range(3, 200, 4)) for n in numbers.values())  # same scenarios in every category
    environment = BfclEnv()
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        environment.tasks("dev")
    with pytest.raises(ValueError, match="unknown task id 'multi_turn_miss_func_0'"):
        environment.reset("multi_turn_miss_func_0")
    with pytest.raises(ValueError, match="must be a string"):
        environment.reset(0)
    with pytest.raises(ValueError, match="unknown category"):
        BfclEnv(category="multi_turn")
    with pytest.raises(ValueError, match="unknown docs style"):
        BfclEnv(docs="xml")


def test_docs_full_is_bfcls_json_and_compact_a_signature_line_each():
    environment = BfclEnv(docs="full")
    task = environment.task(BASE_0)
    text = environment.reset(BASE_0)
    docs = json.loads(text.removeprefix("Functions you can call:\n").rsplit("\n\nUser: ", 1)[0])
    assert docs == list(task.functions) and len(docs) == 14 + 18  # TwitterAPI + GorillaFileSystem
    assert all(d["description"].endswith(PYTHON_HINT) for d in docs)
    compact = render_docs(task.functions, "compact")
    assert [line.split("(")[0] for line in compact.splitlines() if line.startswith("- ")] == [
        f"- {d['name']}" for d in docs
    ]
    assert len(compact) * 10 < len(render_docs(task.functions, "full"))
    climate = next(
        d
        for d in load_category("multi_turn_base")["multi_turn_base_50"].functions
        if d["name"] == "adjustClimateControl"
    )
    assert signature(climate) == (
        "adjustClimateControl(temperature: float, unit: 'celsius' | 'fahrenheit' = 'celsius', "
        "fanSpeed: int = 50, mode: 'auto' | 'cool' | 'heat' | 'defrost' = 'auto')"
    )
    environment.close()


# -- backends, the rollout loop, the package -----------------------------------------------------------------------
def test_episodes_share_no_backend_and_leave_no_instance_behind():
    def instances():
        return {k for k in vars(backend.executor_module()) if k.startswith("coevo_")}

    before = instances()
    first, second = BfclEnv(), BfclEnv()
    first.reset(BASE_0)
    second.reset(BASE_0)
    first.step("[mkdir(dir_name='only_in_first')]")
    assert "only_in_first" not in second.step("[ls()]")[0]
    first.reset(BASE_0)  # a new episode of the same task starts from the task's state again
    assert "only_in_first" not in first.step("[ls()]")[0]
    play(first, BASE_0, expert_actions(first, BASE_0))
    first.close()
    second.close()
    assert instances() <= before  # (other tests' environments may still hold an episode)


def test_the_rollout_loop_keeps_each_episodes_turn_accuracy(env, tmp_path):
    task_ids = env.tasks("test")[:3]
    plans = {t: expert_actions(env, t) for t in task_ids}
    plans[task_ids[1]] = plans[task_ids[1]][:-2] + ["[]"]  # the last turn's calls left out

    def reply(request):
        step = (len(request.messages) - 3) // 2
        return format_reply("I call functions.", plans[request.task_id][step])

    trajectories, stats = run_rollouts(
        lambda: BfclEnv(),
        ScriptedActor(reply, num_slots=2),
        task_ids,
        str(tmp_path / "r.jsonl"),
        RolloutConfig(agent="expert", show_progress=False),
    )
    accuracy = [t.extra["metrics"]["turn_accuracy"] for t in trajectories]
    turns = env.task(task_ids[1]).num_turns
    assert [t.reward for t in trajectories] == [1.0, 0.0, 1.0] and accuracy == [1.0, (turns - 1) / turns, 1.0]
    mean = pytest.approx(sum(accuracy) / 3)
    assert rollouts.summarize(trajectories)["metrics"] == {"turn_accuracy": mean, "graded_score": mean}
    cut, _ = run_rollouts(
        lambda: BfclEnv(),
        ScriptedActor(reply, num_slots=2),
        task_ids[:1],
        str(tmp_path / "cut.jsonl"),
        RolloutConfig(agent="expert", show_progress=False, max_steps=2),  # first turn played only
    )
    first = env.task(task_ids[0])
    assert cut[0].extra["terminate_reason"] == "max_steps"
    assert cut[0].extra["metrics"]["turn_accuracy"] == 1 / first.num_turns


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpmath", None)
    with pytest.raises(ModuleNotFoundError, match=rf"pip install --no-deps bfcl-eval=={BFCL_VERSION}"):
        bfcl_module("eval_checker.multi_turn_eval.multi_turn_checker")
    assert importlib.util.find_spec("bfcl_eval") is not None


def _config(name: str) -> dict:
    path = pathlib.Path(__file__).parent.parent / "configs" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config().to_dict()


def test_the_smollm2_config_builds_its_environment_and_fits_the_experts_it_measured():
    cfg = ExperimentConfig.from_mapping(_config("bfcl_smollm2"))
    check_env_config(cfg)
    environment = envs.make(cfg.env.name, **dict(cfg.env.kwargs))
    assert len(environment.tasks(cfg.env.train_split)) >= cfg.env.expert_tasks
    assert all(len(environment.tasks(split)) >= cfg.env.eval_tasks for split in cfg.env.eval_splits)
    assert cfg.model.source == "smollm2" and cfg.max_length == cfg.rollout.cache_len == 3072
    environment.close()


def _tiny_bfcl_config() -> ExperimentConfig:
    """`configs/tiny.py`'s one-layer policy on BFCL, SFT only: 2 experts, one test episode."""
    config = _config("tiny")
    config["methods"] = ("sft",)
    config["env"] = {
        "name": "bfcl",
        "kwargs": {"category": "multi_turn_base", "max_observation_chars": 200},
        "train_split": "train",
        "eval_splits": ("test",),
        "expert_tasks": 2,
        "explore_tasks": 1,
        "eval_tasks": 1,
    }
    config["model"] = {**config["model"], "vocab_size": 1024}  # the two experts: 1,913 and 1,381 tokens
    config["sft"] = {**config["sft"], "epochs": 1}
    return ExperimentConfig.from_mapping(config)


@pytest.mark.slow  # SFT on two experts, then one greedy episode to the context limit: 1-5 min on 2 busy cores
def test_the_main_job_plays_bfcl_with_a_tiny_policy(tmp_path):
    results = run(_tiny_bfcl_config(), str(tmp_path))
    evaluation = results["methods"]["SFT"]["iterations"][0]["eval"]["test"]
    assert evaluation["episodes"] == 1 and results["counts"]["experts"] == 2
    assert evaluation["terminations"] and "metrics" in evaluation
    (path,) = tmp_path.rglob("sft_target_test.jsonl")
    (trajectory,) = read_trajectories(path)
    assert trajectory.task_id == "multi_turn_base_3" and len(trajectory.messages) > 3  # it played steps
    assert trajectory.extra["metrics"] == {"turn_accuracy": 0.0, "graded_score": 0.0}


def test_episodes_do_not_share_a_backend_method_s_default_list():
    """TwitterAPI.post_tweet's default `mentions=[]` is stored in the tweet, and `mention` appends to it: an
    earlier episode's mention must not show up in a later episode's tweet."""
    task = envs.make("bfcl").task("multi_turn_base_90")
    first, second = backend.new_model_name(), backend.new_model_name()
    try:
        posted = json.loads(backend.execute(task, ["post_tweet(content='first')"], first)[0][0])
        backend.execute(task, [f"mention(tweet_id={posted['id']}, mentioned_usernames=['@x'])"], first)
        later = json.loads(backend.execute(task, ["post_tweet(content='second')"], second)[0][0])
    finally:
        backend.drop_instances(first)
        backend.drop_instances(second)
    assert later["mentions"] == [] and later["tags"] == []


def test_the_state_key_is_the_backends_state_with_the_turn():
    """Equal play, equal keys; a call that changes a backend changes the key, a read-only call does not."""
    env, other = envs.make("bfcl"), envs.make("bfcl")
    env.reset("multi_turn_base_90")
    other.reset("multi_turn_base_90")
    start = env.state_key()
    assert start == other.state_key()
    env.step("[get_zipcode_based_on_city(city='Rivermist')]")  # reads, changes no backend
    assert json.loads(env.state_key())[2] == json.loads(start)[2]
    env.step("[post_tweet(content='hello')]")
    other.step("[post_tweet(content='hello')]")
    assert env.state_key() == other.state_key() != start
    env.step("[]")  # ends the user turn: the next turn's state
    assert json.loads(env.state_key())[0] == 1
    env.close()
    other.close()
