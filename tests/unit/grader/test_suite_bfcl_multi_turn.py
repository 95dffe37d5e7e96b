"""The ``bfcl_multi_turn`` suite: conversations run as BFCL's prompting inference runs them, scores equal to BFCL's own
verdict, model-written text never evaluated, conversations isolated from each other, splits and params as the other
suites'.

The model is a script (:class:`Scripted`) that answers each turn from a list. BFCL's verdict is computed as BFCL's eval
runner computes it: its ``_evaluate_single_multi_turn_entry`` and its prompting decoder (``default_decode_execute_prompting``
and the functions it calls), compiled unchanged from the installed ``bfcl_eval`` source (their modules' imports pull in
vendor SDKs), run on the model's raw answers with BFCL's ``multi_turn_checker``. Nothing of BFCL is mocked; the
security tests wrap BFCL's executor to record what reaches it, and still run it.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from importlib.resources import files
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING, MAXIMUM_STEP_LIMIT
from bfcl_eval.constants.enums import ReturnFormat
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as checker_module
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response

from grader.suites import Item, TurnLimitReached, get_suite, suite_converse
from grader.suites.bfcl import openai_tools
from grader.suites.bfcl_multi_turn import (
    BFCL_CATEGORY,
    CATEGORIES,
    MODEL_KEY_PREFIX,
    allowed_names,
    class_functions,
    functions_by_turn,
    load_category,
    question_text,
    run_conversation,
)
from services.common.contracts import Harness
from services.common.errors import Unprocessable
from services.common.openai_protocol import ChatCompletionRequest, ChatTool

SUITE = get_suite("bfcl_multi_turn")
HARNESS = SUITE.default_harness
FIDELITY_SAMPLE: dict[str, int | None] = {"base": 20, "miss_func": 6, "miss_param": 6, "long_context": 6}
if os.environ.get("BFCL_MULTI_TURN_FIDELITY_ALL"):  # every distinct conversation (about 100 s on two cores)
    FIDELITY_SAMPLE = dict.fromkeys(CATEGORIES, None)


def _bfcl_source_functions(module: str, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions ``names`` of the installed ``bfcl_eval/<module>``, compiled in ``namespace``."""
    tree = ast.parse((files("bfcl_eval") / module).read_text())
    chosen = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in chosen} == names, "bfcl_eval's source no longer defines these functions"
    exec(compile(ast.Module(body=chosen, type_ignores=[]), module, "exec"), namespace)  # noqa: S102 - BFCL's own code, on scripted answers
    return namespace


BFCL = _bfcl_source_functions("model_handler/utils.py", {"default_decode_execute_prompting", "ast_parse", "resolve_ast_call", "resolve_ast_by_type",
                                                           "decoded_output_to_execution_list", "parse_nested_value"},
                              {"ast": ast, "re": re, "ReturnFormat": ReturnFormat})
BFCL.update(_bfcl_source_functions("eval_checker/eval_runner.py", {"_evaluate_single_multi_turn_entry"},
                                   {"multi_turn_checker": multi_turn_checker, "is_empty_execute_response": is_empty_execute_response}))
BFCL_HANDLER = SimpleNamespace(decode_execute=lambda result, has_tool_call_tag: BFCL["default_decode_execute_prompting"](result, has_tool_call_tag))


def _drop_instances(prefix: str) -> None:
    for name in [n for n in vars(multi_turn_utils) if n.startswith(prefix)]:
        del vars(multi_turn_utils)[name]


def bfcl_verdict(item: Item, answers: list[list[str]]) -> bool:
    """BFCL's verdict on the model's raw answers (per turn, every answer), step for step as its eval runner."""
    model_name = f"bfcl_reference_{uuid.uuid4().hex}"
    prompt_entry = {"id": item.id, "initial_config": item.entry["initial_config"], "involved_classes": item.entry["involved_classes"]}
    try:
        return BFCL["_evaluate_single_multi_turn_entry"](BFCL_HANDLER, item.id, answers, json.loads(item.answer), prompt_entry, model_name,
                                                         BFCL_CATEGORY[item.entry["category"]])["valid"]
    finally:
        _drop_instances(model_name)


def bfcl_decoded(answers: list[list[str]]) -> list[list[list[str]]]:
    """The calls BFCL's eval runner decodes from the raw answers (failed and empty decodings skipped)."""
    out = []
    for turn in answers:
        steps = []
        for answer in turn:
            try:
                decoded = BFCL["default_decode_execute_prompting"](answer, False)
            except Exception:  # noqa: BLE001, S112 - as BFCL: an answer that does not decode is skipped
                continue
            if not is_empty_execute_response(decoded):
                steps.append(decoded)
        out.append(steps)
    return out


# ----------------------------------------------------------------------------- a scripted model


RESULTS = "[{'role': 'tool'"  # how BFCL's execution results message (a user message) starts


class Scripted:
    """A model that answers from a script: ``script[turn][step]``, then ``""`` (no call: the turn ends). The turn is read
    from the request: the user messages that are not execution results. Records every request and, per turn, its answers
    (``answers``, BFCL's raw model result). ``hook(turn, step)`` runs before each answer."""

    def __init__(self, script: list[list[str]], hook: Callable[[int, int], None] | None = None) -> None:
        self.script, self.hook = script, hook
        self.requests: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []
        self.answers: list[list[str]] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        self.requests.append((json.loads(json.dumps(messages)), tools))
        turn = sum(1 for m in messages if m["role"] == "user" and not m["content"].startswith(RESULTS)) - 1
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user" and not m["content"].startswith(RESULTS))
        step = sum(1 for m in messages[last_user:] if m["role"] == "assistant")
        if self.hook:
            self.hook(turn, step)
        while len(self.answers) <= turn:
            self.answers.append([])
        answer = self.script[turn][step] if turn < len(self.script) and step < len(self.script[turn]) else ""
        self.answers[turn].append(answer)
        return answer


def keyword_call(call: str, involved_classes: list[str]) -> str:
    """A ground-truth call with its positional arguments named (BFCL's ground truth has some, ``sort('report.pdf')``;
    its decoder drops positional arguments, so a model has to name them), from the backend method's signature."""
    node = ast.parse(call, mode="eval").body
    owner = [cls for c in involved_classes if hasattr(cls := getattr(import_module(CLASS_FILE_PATH_MAPPING[c]), c), node.func.id)][-1]
    params = [p for p in inspect.signature(getattr(owner, node.func.id)).parameters if p != "self"]
    args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)} | {k.arg: ast.literal_eval(k.value) for k in node.keywords}
    return f"{node.func.id}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def ground_truth(item: Item) -> list[list[str]]:
    return [[keyword_call(c, item.entry["involved_classes"]) for c in turn] for turn in json.loads(item.answer)]


def as_script(turns: list[list[str]], *, one_call_per_step: bool = False) -> list[list[str]]:
    """Per turn, the answers that make these calls: all at once, or one per step (the last step taking the rest when
    there are more calls than BFCL's step limit allows steps: one long-context turn has 34)."""
    if one_call_per_step:
        return [[f"[{c}]" for c in calls[:MAXIMUM_STEP_LIMIT - 1]] + ([f"[{', '.join(calls[MAXIMUM_STEP_LIMIT - 1:])}]"] if calls[MAXIMUM_STEP_LIMIT - 1:] else [])
                for calls in turns]
    return [[f"[{', '.join(calls)}]"] if calls else [] for calls in turns]


def _changed(turns: list[list[str]]) -> list[list[str]]:
    """The first call with a string argument, that argument changed."""
    turns = [list(t) for t in turns]
    for calls in turns:
        for i, call in enumerate(calls):
            node = ast.parse(call, mode="eval").body
            args = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            key = next((k for k, v in args.items() if isinstance(v, str)), None)
            if key is not None:
                args[key] += "_changed"
                calls[i] = f"{node.func.id}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
                return turns
    return turns


def _dropped(turns: list[list[str]]) -> list[list[str]]:
    """The last call of the last turn that has calls, left out."""
    turns = [list(t) for t in turns]
    last = max(i for i, t in enumerate(turns) if t)
    turns[last] = turns[last][:-1]
    return turns


def scripts(item: Item) -> dict[str, list[list[str]]]:
    truth = ground_truth(item)
    return {"ground_truth": as_script(truth), "ground_truth_call_by_call": as_script(truth, one_call_per_step=True), "nothing": [],
            "changed_argument": as_script(_changed(truth)), "dropped_call": as_script(_dropped(truth)),
            "fenced_ground_truth": [[f"```\n{a}\n```" for a in t] for t in as_script(truth)],
            "prose_first": [["Sure, let me do that.", *t] if t else [] for t in as_script(truth)]}  # prose ends the turn: nothing runs


def items(category: str, size: int | None = None) -> list[Item]:
    """The first ``size`` items of ``category`` (seed 0); all of them by default."""
    distinct = len({question_text(e["question"]) for e in load_category(category)}) if size is None else size
    return SUITE.generate({"categories": [category]}, 0, distinct, split="fidelity")


def leftover_instances() -> list[str]:
    return [n for n in vars(multi_turn_utils) if n.startswith((MODEL_KEY_PREFIX, "bfcl_reference_"))]


# ----------------------------------------------------------------------------- fidelity


@pytest.mark.parametrize("category", CATEGORIES)
def test_scores_agree_with_bfcl_eval_runner_item_by_item(category: str) -> None:
    chosen = items(category, FIDELITY_SAMPLE[category])
    agree, valid, disagreements, started = Counter(), Counter(), [], time.perf_counter()
    for item in chosen:
        for kind, script in scripts(item).items():
            model = Scripted(script)
            transcript = run_conversation(item, HARNESS, model)
            ours = SUITE.score(json.dumps(transcript.calls), item)
            theirs = bfcl_verdict(item, model.answers)
            agree[kind] += ours == float(theirs)
            valid[kind] += theirs
            if ours != float(theirs):
                disagreements.append((item.id, kind, ours, theirs))
            if kind.startswith("ground_truth"):  # the calls we executed are the ones BFCL decodes from the same answers
                assert transcript.calls == bfcl_decoded(model.answers), (item.id, kind)
    print(f"\n{category}: {len(chosen)} items in {time.perf_counter() - started:.1f}s; per script: agreed/total, BFCL-valid")
    for kind in agree:
        print(f"  {kind:26s} {agree[kind]}/{len(chosen)}  valid {valid[kind]}")
    assert not disagreements, disagreements[:5]
    # not vacuous: the ground truth passes, no calls never do, perturbed ground truth mostly fails
    assert valid["ground_truth"] == valid["ground_truth_call_by_call"] == valid["fenced_ground_truth"] == len(chosen)
    assert valid["nothing"] == valid["prose_first"] == 0
    assert valid["changed_argument"] + valid["dropped_call"] <= 0.2 * len(chosen)
    assert not leftover_instances()


def test_converse_is_the_conversation_scored() -> None:
    item = items("base", 10)[0]
    assert suite_converse(SUITE) is not None
    assert SUITE.converse(item, HARNESS, Scripted(scripts(item)["ground_truth"])) == 1.0
    assert SUITE.converse(item, HARNESS, Scripted([])) == 0.0
    assert SUITE.score(None, item) == 0.0
    per_turn = [[calls] if calls else [] for calls in ground_truth(item)]  # per turn, per step, the calls
    assert SUITE.score(json.dumps(per_turn), item) == 1.0
    assert SUITE.score(json.dumps(per_turn[:-1]), item) == 0.0  # a turn short: BFCL's forced quit
    for malformed in ({"calls": []}, ground_truth(item), [[["cd(folder='x')", 3]]]):
        with pytest.raises(ValueError):
            SUITE.score(json.dumps(malformed), item)


# ----------------------------------------------------------------------------- the conversation's shape


def _entry(bfcl_id: str) -> Item:
    category = next(c for c in CATEGORIES if bfcl_id.startswith(BFCL_CATEGORY[c] + "_"))
    return next(i for i in items(category) if i.id == bfcl_id)


def _results(message: dict[str, Any]) -> list[dict[str, str]]:
    assert message["role"] == "user" and message["content"].startswith(RESULTS)
    return ast.literal_eval(message["content"])


def test_messages_grow_with_execution_results_and_tools_are_the_involved_functions() -> None:
    item = _entry("multi_turn_base_0")
    truth = ground_truth(item)
    model = Scripted(as_script(truth, one_call_per_step=True))
    assert SUITE.converse(item, HARNESS, model) == 1.0
    docs = [doc for cls in item.entry["involved_classes"] for doc in class_functions(cls)]
    assert all(tools == openai_tools(docs) for _, tools in model.requests)
    assert len(model.requests) == sum(len(t) + 1 for t in truth)  # each call a step, then an answer with no call ends the turn
    first, _ = model.requests[0]
    assert first == [{"role": "system", "content": HARNESS.system_prompt}, {"role": "user", "content": item.entry["turns"][0][0]["content"]}]
    second, _ = model.requests[1]
    assert second[:2] == first and second[2] == {"role": "assistant", "content": f"[{truth[0][0]}]"}
    assert _results(second[3]) == [{"role": "tool", "name": "cd(folder='document')", "content": '{"current_working_directory": "document"}'}]
    for (before, _), (after, _) in zip(model.requests, model.requests[1:], strict=False):
        assert after[:len(before)] == before and len(after) == len(before) + 2  # the answer, then results or the next user turn
    next_turn, _ = model.requests[len(truth[0]) + 1]
    assert next_turn[-2] == {"role": "assistant", "content": ""} and next_turn[-1] == {"role": "user", "content": item.entry["turns"][1][0]["content"]}
    # a user template applies to the user's turns, not to execution results
    templated = Scripted(as_script(truth))
    SUITE.converse(item, HARNESS.model_copy(update={"user_template": "Task: {{ question }}", "system_prompt": None}), templated)
    messages, _ = templated.requests[-1]
    assert messages[0]["content"] == "Task: " + item.entry["turns"][0][0]["content"]
    assert [m["content"].startswith("Task: ") for m in messages if m["role"] == "user"] == [True, False] * len(truth)


def test_miss_func_adds_the_held_out_function_at_its_turn() -> None:
    item = _entry("multi_turn_miss_func_0")
    assert item.entry["missed_function"] == {"3": ["sort"]}
    model = Scripted(as_script(ground_truth(item)))
    assert SUITE.converse(item, HARNESS, model) == 1.0
    for messages, tools in model.requests:
        turn = sum(1 for m in messages if m["role"] == "user" and not m["content"].startswith(RESULTS)) - 1
        names = [t["function"]["name"] for t in tools or []]
        assert ("sort" in names) == (turn >= 3), turn
        if turn >= 3:
            assert names[-1] == "sort"  # appended, as BFCL extends the function list
    turn3 = next(messages for messages, _ in model.requests if sum(1 for m in messages if m["role"] == "user" and not m["content"].startswith(RESULTS)) == 4)
    sort_doc = next(doc for doc in class_functions("GorillaFileSystem") if doc["name"] == "sort")
    assert turn3[-1] == {"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=[sort_doc])}
    assert json.loads(item.answer)[2] == []  # the turn that asks for sort before it exists: calling nothing is right


def test_every_turns_tools_pass_inference_validation() -> None:
    """Every function offered at any turn of any entry is a tool inference accepts, and the largest set of them with a
    first request fits a request."""
    tools: dict[str, dict[str, Any]] = {}
    largest: list[dict[str, Any]] = []
    offered_sets = {tuple(doc["name"] for doc in functions): functions for category in CATEGORIES for item in items(category)
                    for functions in functions_by_turn(item.entry)}
    for functions in offered_sets.values():
        offered = openai_tools(functions)
        tools.update((json.dumps(t), t) for t in offered)
        largest = max(largest, offered, key=lambda ts: len(json.dumps(ts)))
    for tool in tools.values():
        assert ChatTool.model_validate(tool).model_dump(exclude_none=True)["function"]["name"] == tool["function"]["name"]
    assert len({t["function"]["name"] for t in tools.values()}) > 100
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "system", "content": HARNESS.system_prompt},
                                                                              {"role": "user", "content": "Hello"}], "tools": largest, "tool_choice": "none"})
    assert len(request.tool_dicts() or []) == len(largest)


# ----------------------------------------------------------------------------- limits


def test_turn_limit_propagates_and_leaves_no_instances() -> None:
    item = _entry("multi_turn_base_0")
    script = as_script(ground_truth(item), one_call_per_step=True)
    calls = 0

    def limited(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise TurnLimitReached("the benchmark allows 3 model turns per item")
        return Scripted(script)(messages, tools)

    with pytest.raises(TurnLimitReached):
        SUITE.converse(item, HARNESS, limited)
    assert calls == 4 and not leftover_instances()


def test_bfcls_step_limit_ends_the_conversation_as_in_bfcl() -> None:
    item = _entry("multi_turn_base_0")
    truth = as_script(ground_truth(item))
    # still calling after 20 steps in the first turn: BFCL forces the model to quit and the entry fails (a turn short)
    model = Scripted([["[pwd()]"] * 100, *truth[1:]])
    transcript = run_conversation(item, HARNESS, model)
    assert transcript.forced_quit == 0 and len(model.requests) == MAXIMUM_STEP_LIMIT + 1 and len(transcript.calls) == 1
    assert SUITE.converse(item, HARNESS, Scripted(model.script)) == 0.0 == float(bfcl_verdict(item, model.answers))
    # in the last turn: BFCL scores the turns as they are (here the ground truth, then harmless calls)
    model = Scripted([*truth[:-1], truth[-1] + ["[pwd()]"] * 100])
    transcript = run_conversation(item, HARNESS, model)
    assert transcript.forced_quit == len(truth) - 1 and len(model.answers[-1]) == MAXIMUM_STEP_LIMIT + 1
    assert SUITE.converse(item, HARNESS, Scripted(model.script)) == 1.0 == float(bfcl_verdict(item, model.answers))
    assert not leftover_instances()


def test_a_conversation_that_outgrows_a_request_ends() -> None:
    item = _entry("multi_turn_base_0")
    model = Scripted([[f"[echo(content={'x' * 15_000!r})]"] * 5])  # each step adds 15,000 characters, and 30,000 of result (call and output)
    with pytest.raises(TurnLimitReached, match="no longer fits"):
        SUITE.converse(item, HARNESS, model)
    assert len(model.requests) == 2  # with the tools (about 20,000 characters), a third request would pass 100,000


# ----------------------------------------------------------------------------- hostile answers


HOSTILE = [
    "[__import__('os').system('touch {marker}')]",
    "[ls.__class__.__bases__]",
    "[cd(folder=open('/etc/passwd').read())]",
    "[cd(folder=__import__('os').system('touch {marker}'))]",
    "[eval(source=\"__import__('os').system('touch {marker}')\")]",
    "[exec(\"__import__('os').system('touch {marker}')\")]",
    "[__import__(name='os')]",
    "[cd(**{{'folder': __import__('os').system('touch {marker}')}})]",
    "[cd(folder=ls.__globals__)]",
    "[ls.__init__.__globals__['subprocess'].run(args='touch {marker}', shell=True)]",
    "[ls(a=True), __import__('os').system('touch {marker}')]",
    "[cd(folder=lambda: __import__('os').system('touch {marker}'))]",
    "[cd(folder='x' + __import__('os').getcwd())]",
    "[cd(folder=[__import__('os').system('touch {marker}')])]",
    "[cd(folder={{'k': __import__('os').system('touch {marker}')}})]",
    "[_load_scenario(scenario={{}})]",
    "[cd(folder=1e999)]",
    "[cd(folder={{1, 2}})]",
    "[cd(folder=b'x')]",
    "[cd(folder=\"x'); __import__('os').system('touch {marker}'); ('\")]",
    "[echo(content='ls(\\\\'), __import__(\\'os\\').system(\\'touch {marker}\\'), (\\'')]",
    "[post_tweet(content=\"\\\"), __import__('os').system('touch {marker}'), (\\\"\", tags=['cd(', \"mv('\"])]",
]


@pytest.fixture()
def executed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Every (model name, call strings) that reaches BFCL's executor, from the conversation or from the checker; the real
    executor still runs them."""
    seen: list[tuple[str, list[str]]] = []
    real = multi_turn_utils.execute_multi_turn_func_call
    lock = threading.Lock()

    def recording(func_call_list: list[str], *args: Any, **kwargs: Any) -> Any:
        with lock:
            seen.append((kwargs.get("model_name", args[2] if len(args) > 2 else ""), list(func_call_list)))
        return real(func_call_list, *args, **kwargs)

    monkeypatch.setattr(multi_turn_utils, "execute_multi_turn_func_call", recording)
    monkeypatch.setattr(checker_module, "execute_multi_turn_func_call", recording)
    return seen


def _is_canonical(call: str, allowed: frozenset[str]) -> bool:
    """Whether ``call`` is ``name(k=repr(literal), ...)`` exactly, ``name`` one of ``allowed``."""
    node = ast.parse(call, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in allowed and not node.args):
        return False
    return call == f"{node.func.id}({', '.join(f'{k.arg}={ast.literal_eval(k.value)!r}' for k in node.keywords)})"


def _calls_in(answer: str) -> list[str] | None:
    """The source of each call of an answer that parses as a list of calls; ``None`` if it is not one."""
    try:
        body = ast.parse(answer, mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(body, ast.List) and all(isinstance(e, ast.Call) for e in body.elts)):
        return None
    return [ast.get_source_segment(answer, e) or "" for e in body.elts]


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_answers_are_never_evaluated(template: str, tmp_path: Path, executed: list[tuple[str, list[str]]]) -> None:
    marker = tmp_path / "pwned"
    answer = template.format(marker=marker)
    item = _entry("multi_turn_base_0")
    allowed = allowed_names(item.entry["involved_classes"])
    model = Scripted([[answer, answer]])
    assert SUITE.converse(item, HARNESS, model) == 0.0
    assert not marker.exists()
    model_calls = [c for name, calls in executed if "ground_truth" not in name for c in calls]
    assert all(_is_canonical(c, allowed) for c in model_calls), model_calls
    elements = _calls_in(answer)
    first_step = next((calls for name, calls in executed if "ground_truth" not in name), [])
    after = model.requests[1][0][-1]
    if elements is None:  # not a list of calls: the turn ends
        assert not after["content"].startswith(RESULTS)
    else:  # each refused call got an error back, each other one its result
        feedback = _results(after)
        assert len(feedback) == len(elements)
        assert sum(r["content"].startswith("Error during execution:") for r in feedback) >= len(elements) - len(first_step)
    # the same calls given to score() directly are vetted the same way
    executed.clear()
    first_turn = [[e] for e in elements or [answer]]  # each call a step
    assert SUITE.score(json.dumps([first_turn] + [[] for _ in range(len(item.entry["turns"]) - 1)]), item) == 0.0
    assert not marker.exists()
    assert all(_is_canonical(c, allowed) for name, calls in executed if "ground_truth" not in name for c in calls)


def test_a_string_value_reaches_the_backend_as_a_string(executed: list[tuple[str, list[str]]]) -> None:
    item = _entry("multi_turn_base_0")
    value = "x'); __import__('os').system('touch /nonexistent/pwned'); ('"
    model = Scripted([[f"[cd(folder={value!r}), mkdir(dir_name='ls(')]"]])
    SUITE.converse(item, HARNESS, model)
    assert executed[0][1] == [f"cd(folder={value!r})", "mkdir(dir_name='ls(')"]
    feedback = _results(model.requests[1][0][-1])
    assert feedback[0]["name"] == f"cd(folder={value!r})" and value in feedback[0]["content"]  # the backend's error about that folder


# ----------------------------------------------------------------------------- isolation


def test_concurrent_conversations_do_not_share_backends() -> None:
    chosen = [_entry(i) for i in ("multi_turn_base_0", "multi_turn_base_1", "multi_turn_long_context_0", "multi_turn_miss_param_0")]
    work = [item for item in chosen for _ in range(4)]
    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(lambda item: SUITE.converse(item, HARNESS, Scripted(as_script(ground_truth(item), one_call_per_step=True))), work))
    assert scores == [1.0] * len(work)
    assert not leftover_instances()


def test_a_conversation_interleaved_with_another_keeps_its_own_state() -> None:
    item = _entry("multi_turn_base_0")  # turn 0 creates document/temp and moves a file into it: a second run on shared state would fail
    inner: list[float] = []

    def run_another(turn: int, step: int) -> None:
        if turn == 1 and step == 0 and not inner:
            inner.append(SUITE.converse(item, HARNESS, Scripted(as_script(ground_truth(item)))))

    assert SUITE.converse(item, HARNESS, Scripted(as_script(ground_truth(item)), hook=run_another)) == 1.0
    assert inner == [1.0] and not leftover_instances()


# ----------------------------------------------------------------------------- splits and params


def test_items_carry_bfcl_ids_conversations_and_ground_truth() -> None:
    item = _entry("multi_turn_base_0")
    entry = next(e for e in load_category("base") if e["id"] == "multi_turn_base_0")
    assert item.question == "\n".join(turn[0]["content"] for turn in entry["question"])
    assert json.loads(item.answer) == entry["ground_truth"]
    assert item.entry["turns"] == entry["question"] and item.entry["involved_classes"] == ["TwitterAPI", "GorillaFileSystem"]
    assert json.loads(json.dumps(item.entry)) == item.entry
    assert SUITE.generate({}, 0, 5, split="validation") == SUITE.generate({"categories": ["base"]}, 0, 5, split="validation")


def test_same_seed_same_items_and_splits_are_disjoint() -> None:
    every = {"categories": list(CATEGORIES)}
    val = SUITE.generate(every, 1, 40, split="validation")
    assert [i.id for i in val] == [i.id for i in SUITE.generate({"categories": list(reversed(CATEGORIES))}, 1, 40, split="validation")]
    assert [i.id for i in val] != [i.id for i in SUITE.generate(every, 2, 40, split="validation")]
    test = SUITE.generate(every, 7, 200, split="test", exclude=frozenset(i.question for i in val))
    space, exact = SUITE.item_space(every)
    train = SUITE.generate(every, 3, space - 240, split="train", exclude=frozenset(i.question for i in val + test))
    questions = [{i.question for i in split} for split in (val, test, train)]
    assert [len(q) for q in questions] == [40, 200, space - 240] and exact
    assert not (questions[0] & questions[1]) and not (questions[0] & questions[2]) and not (questions[1] & questions[2])
    assert min(Counter(i.entry["category"] for i in val[:20]).get(c, 0) for c in CATEGORIES) >= 4  # taken in turn (a repeat is skipped)
    assert SUITE.item_space({}) == (200, True)
    assert 400 < space < 800  # long_context and miss_func mostly repeat a base conversation: each is one item


def test_too_many_items_or_bad_params_name_the_field() -> None:
    with pytest.raises(Unprocessable) as exc:
        SUITE.generate({"categories": ["miss_param"]}, 0, 201, split="test")
    assert exc.value.extra["field"] == "suite.splits.test.size"
    for params, field in (({"categories": []}, "suite.params.categories"), ({"categories": ["multi_turn_base"]}, "suite.params.categories"),
                          ({"categories": ["base", "base"]}, "suite.params.categories"), ({"categories": "base"}, "suite.params.categories"),
                          ({"categories": ["base"], "max_steps": 5}, "suite.params")):
        with pytest.raises(Unprocessable) as exc:
            SUITE.check_params(params)
        assert exc.value.extra["field"] == field, params
    SUITE.check_params({})
    SUITE.check_params({"categories": ["long_context", "miss_func"]})


def test_default_harness_is_bfcls_prompting_format() -> None:
    assert isinstance(HARNESS, Harness) and HARNESS.temperature == 0.0 and HARNESS.max_tokens >= 512
    assert "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]" in (HARNESS.system_prompt or "")
    assert "Continue to output functions to call" in (HARNESS.system_prompt or "")
