"""The ``bfcl`` suite: our scorer agrees with BFCL's own decoder and checker, splits are deterministic and
disjoint, tools are converted as BFCL's OpenAI handler converts them, and tools reach the model's prompt.

BFCL's decoder (``default_decode_ast_prompting``), format check (``is_function_calling_format_output``) and
tools conversion (``convert_to_tool`` with the Python hint) live in modules whose imports pull in tree-sitter
parsers, vendor SDKs and directories created inside site-packages; these tests compile those functions,
unchanged, from the installed ``bfcl_eval`` source and call them as BFCL's eval runner does
(``_evaluate_single_ast_entry``). The AST checker is BFCL's ``ast_checker`` itself, as the suite imports it.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections import Counter
from importlib.resources import files
from typing import Any

import pytest
from bfcl_eval.constants.enums import Language, ModelStyle, ReturnFormat
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
from inference_service.chat import TOOLS_HEADER, ChatRenderer
from pydantic import ValidationError

from grader.scoring import score_item
from grader.suites import Item, get_suite, suite_tools
from grader.suites.bfcl import BFCL_CATEGORY, CATEGORIES, CHECKER_MODEL, ast_checker, decode_calls, load_category
from services.common.errors import Unprocessable
from services.common.openai_protocol import MAX_PROMPT_CHARS, ChatCompletionRequest
from tests.conftest import prepared_models

SUITE = get_suite("bfcl")
ALL = {"categories": list(CATEGORIES)}


def _bfcl_source_functions(module: str, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The top-level functions ``names`` of the installed ``bfcl_eval/<module>``, compiled in ``namespace``."""
    tree = ast.parse((files("bfcl_eval") / module).read_text())
    chosen = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in chosen} == names, "bfcl_eval's source no longer defines these functions"
    exec(compile(ast.Module(body=chosen, type_ignores=[]), module, "exec"), namespace)  # noqa: S102 - BFCL's own code, on our test inputs
    return namespace


BFCL = _bfcl_source_functions("model_handler/utils.py", {"default_decode_ast_prompting", "ast_parse", "resolve_ast_call", "resolve_ast_by_type",
                                                           "convert_to_tool", "_cast_to_openai_type"},
                              {"ast": ast, "re": re, "copy": copy, "json": json, "ReturnFormat": ReturnFormat, "ModelStyle": ModelStyle,
                               "GORILLA_TO_OPENAPI": GORILLA_TO_OPENAPI})
BFCL.update(_bfcl_source_functions("utils.py", {"is_function_calling_format_output", "add_language_specific_hint_to_function_doc",
                                                "extract_test_category_from_id", "_func_doc_language_specific_pre_processing",
                                                "_get_language_specific_hint", "is_java", "is_js"}, {"json": json}))


def bfcl_valid(output: str, item: Item) -> bool:
    """BFCL's verdict on ``output``, step for step as its eval runner: decode, format check, ``ast_checker``.
    (Where the checker raises, BFCL's runner would stop; that counts as invalid here, as our scorer scores 0.)"""
    try:
        decoded = BFCL["default_decode_ast_prompting"](output, ReturnFormat.PYTHON, False)
    except Exception:  # noqa: BLE001 - BFCL: "Invalid syntax. Failed to decode AST."
        return False
    if not BFCL["is_function_calling_format_output"](decoded):
        return False
    try:
        return ast_checker(item.entry["function"], decoded, item.entry["possible_answer"], Language.PYTHON,
                           BFCL_CATEGORY[item.entry["category"]], CHECKER_MODEL)["valid"]
    except Exception:  # noqa: BLE001
        return False


# ----------------------------------------------------------------------------- rendering model outputs


def _first(allowed: list[Any]) -> Any:
    """The first allowed value that is not BFCL's "may be omitted" marker ``""`` (``None``: omit the argument)."""
    return next((_pick(v) for v in allowed if v != ""), None)


def _pick(value: Any) -> Any:
    """A concrete value from a possible answer: nested dicts hold lists of allowed values too."""
    if isinstance(value, dict) and all(isinstance(v, list) for v in value.values()):
        return {k: v for k, v in ((k, _first(vs)) for k, vs in value.items()) if v is not None}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_pick(v) for v in value]
    return value


def _calls(item: Item) -> list[tuple[str, dict[str, Any]]]:
    """The item's expected calls, one concrete choice each, with tool names as the model sees them (``.`` → ``_``)."""
    calls = []
    for answer in item.entry["possible_answer"]:
        (name, params), = answer.items()
        calls.append((name.replace(".", "_"), {p: v for p, v in ((p, _first(allowed)) for p, allowed in params.items()) if v is not None}))
    return calls


class _Source(str):
    """A value written as this source text (its ``repr`` is the text itself, unquoted)."""

    def __repr__(self) -> str:
        return str(self)


def _render(calls: list[tuple[str, dict[str, Any]]]) -> str:
    return "[" + ", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args in calls) + "]"


def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1000
    if isinstance(value, str):
        return value + " elsewhere"
    return "wrong"


def outputs(item: Item) -> dict[str, str]:
    """Model outputs of several kinds for ``item``: right, reordered, and wrong in one way each."""
    calls = _calls(item)
    name, args = calls[0]
    function = next(f for f in item.entry["function"] if f["name"].replace(".", "_") == name)
    required = [p for p in function["parameters"]["required"] if p in args]
    with_arithmetic = [(n, {k: _Source(f"{v - 1} + 1") if type(v) is int else v for k, v in a.items()}) for n, a in calls]
    right = _render(calls)
    return {
        "right": right,
        "args_reordered": _render([(n, dict(reversed(a.items()))) for n, a in reversed(calls)]),
        "wrong_name": _render([(name + "_v2", args), *calls[1:]]),
        "wrong_value": _render([(name, {**args, next(iter(args)): _wrong(next(iter(args.values())))} if args else {"x": 1}), *calls[1:]]),
        "missing_required": _render([(name, {k: v for k, v in args.items() if k != required[0]} if required else args), *calls[1:]]),
        "extra_call": _render([*calls, calls[0]]),
        "unparsable": right[:-2] + "((",
        "prose": "I cannot answer that with these functions.",
        "fenced": f"```python\n{right}\n```",
        "backticks_no_brackets": f"`{right[1:-1]}`",
        "arithmetic": _render(with_arithmetic),
        "dotted_name": _render([(n.replace("_", "."), a) for n, a in calls]),
    }


def _items(category: str) -> list[Item]:
    """Every item of ``category`` (one per distinct question)."""
    distinct = {entry["question"][0][-1]["content"] for entry in load_category(category)}
    return SUITE.generate({"categories": [category]}, 0, len(distinct), split="fidelity")


@pytest.mark.parametrize("category", CATEGORIES)
def test_scorer_agrees_with_bfcl_checker_item_by_item(category: str) -> None:
    items = _items(category)
    assert len(items) >= 30
    agree, valid, disagreements = Counter(), Counter(), []
    for item in items:
        for kind, output in outputs(item).items():
            ours, theirs = score_item(SUITE, output, item)[0], bfcl_valid(output, item)  # as the grader scores: 0.0 where decoding raises
            agree[kind] += ours == float(theirs)
            valid[kind] += theirs
            if ours != float(theirs):
                disagreements.append((item.id, kind, output, ours, theirs))
    print(f"\n{category}: {len(items)} items; per output kind: agreed/total, BFCL-valid")
    for kind in agree:
        print(f"  {kind:22s} {agree[kind]}/{len(items)}  valid {valid[kind]}")
    assert not disagreements, disagreements[:5]
    # the comparison is not vacuous: right answers mostly pass, wrong ones never do
    assert valid["right"] >= 0.9 * len(items) and valid["args_reordered"] >= 0.9 * len(items)
    assert valid["wrong_name"] == valid["unparsable"] == valid["prose"] == valid["extra_call"] == 0
    assert SUITE.score(None, items[0]) == 0.0


def test_decoder_matches_bfcl_on_odd_outputs() -> None:
    """Outputs that exercise every branch of BFCL's value resolver decode the same way, save BFCL's ``eval``."""
    same = [
        "[f(a=1, b='x')]", "f(a=-2.5)", "[f(a=+3)]", "[f(a=not 1)]", "[f(a=[1, (2, 3)], b={'k': None})]", "[f(a=x.y)]", "[f(a=g(1))]",
        "[f(a=g(k=1))]", "[a.b.c(x=...)]", "[f(a=d[0])]", "[f(a=2**10, b=7//2, c=-1 + 0.5, d='a' + 'b')]", "[f(1, 2)]", "[]", "[f(a=1), g()]",
        "'[f(a=1)]'", "[f(a=lambda: 1)]", "[f(a=-x)]", "[f(**k)]", "[f(a={**k})]", "[1]", "[f(a=1)] trailing", "[f(a=1/0)]", "[f(a=True + 1)]",
    ]
    for text in same:
        try:
            theirs: Any = BFCL["default_decode_ast_prompting"](text, ReturnFormat.PYTHON, False)
        except Exception as exc:  # noqa: BLE001
            theirs = type(exc)
        try:
            ours: Any = decode_calls(text)
        except Exception as exc:  # noqa: BLE001
            ours = type(exc)
        assert (ours if isinstance(ours, list) else "error") == (theirs if isinstance(theirs, list) else "error"), text
    # where BFCL evals model-written code, we refuse
    for text in ("[f(a=__import__('os').getpid() + 1)]", "[f(a='ab' * 2)]", "[f(a=9 ** 9 ** 9)]", "[f(a=1 << 100000)]"):
        with pytest.raises(ValueError):
            decode_calls(text)


# ----------------------------------------------------------------------------- splits


def test_same_seed_same_items_and_splits_are_disjoint() -> None:
    val = SUITE.generate(ALL, 1, 60, split="validation")
    assert [i.id for i in val] == [i.id for i in SUITE.generate({"categories": ["parallel", "simple", "multiple"]}, 1, 60, split="validation")]
    assert [i.id for i in val] != [i.id for i in SUITE.generate(ALL, 2, 60, split="validation")]
    test = SUITE.generate(ALL, 7, 300, split="test", exclude=frozenset(i.question for i in val))
    train = SUITE.generate(ALL, 3, 340, split="train", exclude=frozenset(i.question for i in val + test))
    questions = [{i.question for i in split} for split in (val, test, train)]
    assert [len(q) for q in questions] == [60, 300, 340]
    assert not (questions[0] & questions[1]) and not (questions[0] & questions[2]) and not (questions[1] & questions[2])
    assert Counter(i.entry["category"] for i in val[:30]) == {"simple": 10, "multiple": 10, "parallel": 10}


def test_items_carry_bfcl_ids_questions_and_answers() -> None:
    item = next(i for i in SUITE.generate({"categories": ["simple"]}, 0, 400, split="validation") if i.id == "simple_python_0")
    assert item.question == "Find the area of a triangle with a base of 10 units and height of 5 units."
    assert json.loads(item.answer) == [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]
    assert item.entry["question"] == [[{"role": "user", "content": item.question}]]
    assert item.entry["function"][0]["name"] == "calculate_triangle_area" and item.entry["category"] == "simple"
    assert SUITE.score("[calculate_triangle_area(base=10, height=5)]", item) == 1.0
    assert SUITE.score("[calculate_triangle_area(base=5, height=10)]", item) == 0.0


def test_too_many_items_or_bad_params_name_the_field() -> None:
    with pytest.raises(Unprocessable) as exc:
        SUITE.generate({"categories": ["parallel"]}, 0, 201, split="test")
    assert exc.value.extra["field"] == "suite.splits.test.size"
    for params, field in (({"categories": []}, "suite.params.categories"), ({"categories": ["live_simple"]}, "suite.params.categories"),
                          ({"categories": ["simple", "simple"]}, "suite.params.categories"), ({"categories": "simple"}, "suite.params.categories"),
                          ({"categories": ["simple"], "language": "java"}, "suite.params")):
        with pytest.raises(Unprocessable) as exc:
            SUITE.check_params(params)
        assert exc.value.extra["field"] == field, params
    SUITE.check_params({})
    SUITE.check_params({"categories": ["multiple"]})


# ----------------------------------------------------------------------------- tools


def test_tools_are_converted_as_bfcl_converts_them_for_openai() -> None:
    for category in CATEGORIES:
        for entry in load_category(category):
            item = Item(id=entry["id"], question="", answer="", entry={"function": entry["function"], "category": category})
            hinted = BFCL["add_language_specific_hint_to_function_doc"]([copy.deepcopy({"id": entry["id"], "function": entry["function"]})])[0]
            expected = BFCL["convert_to_tool"](hinted["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)
            tools = suite_tools(SUITE, item)
            assert tools == expected, entry["id"]
            request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "q"}], "tools": tools})
            assert request.tool_dicts() == tools
    assert suite_tools(get_suite("reasoning_gym"), Item(id="x", question="q", answer="a")) is None


def test_chat_completion_request_validates_tools() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    base = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    assert ChatCompletionRequest.model_validate({**base, "tools": [tool], "tool_choice": "auto"}).tool_dicts() == [tool]
    assert ChatCompletionRequest.model_validate(base).tool_dicts() is None
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"x": deep}}
    bad = [
        [{**tool, "type": "retrieval"}], [{"type": "function", "function": {**tool["function"], "name": "math.factorial"}}],
        [{"type": "function", "function": {**tool["function"], "parameters": {"type": "dict", "properties": {}}}}], [tool] * 129, [],
        [{"type": "function", "function": {**tool["function"], "parameters": deep}}],
        [{"type": "function", "function": {**tool["function"], "description": "x" * MAX_PROMPT_CHARS}}],
    ]
    for tools in bad:
        with pytest.raises(ValidationError):
            ChatCompletionRequest.model_validate({**base, "tools": tools})


@pytest.fixture(scope="module")
def renderer() -> ChatRenderer:
    from transformers import AutoTokenizer

    return ChatRenderer(AutoTokenizer.from_pretrained(prepared_models() / "smollm2-135m-instruct"))


def tokens(renderer: ChatRenderer, messages: list[dict], tools: list[dict] | None = None) -> int:
    return len(renderer.tokenizer(renderer.render(messages, tools), add_special_tokens=False)["input_ids"])


def test_tools_reach_the_prompt_and_are_counted(renderer: ChatRenderer) -> None:
    item = next(i for i in SUITE.generate({"categories": ["multiple"]}, 0, 5, split="validation"))
    tools = SUITE.tools(item)
    messages = [{"role": "system", "content": SUITE.default_harness.system_prompt or ""}, {"role": "user", "content": item.question}]
    text = renderer.render(messages, tools)
    assert TOOLS_HEADER in text and all(json.dumps(t, ensure_ascii=False) in text for t in tools)
    assert text.index(SUITE.default_harness.system_prompt or "") < text.index(TOOLS_HEADER) < text.index(item.question)
    assert TOOLS_HEADER in renderer.render(messages[1:], tools)  # no system message: the tools make one
    assert tokens(renderer, messages, tools) > tokens(renderer, messages) + 100


def test_the_grader_holds_enough_for_the_tools(renderer: ChatRenderer) -> None:
    from grader.evaluations import prompt_upper_bound
    from services.common.harness import render_messages

    for item in SUITE.generate(ALL, 5, 12, split="validation"):
        tools = SUITE.tools(item)
        actual = tokens(renderer, render_messages(SUITE.default_harness, item.question), tools)
        assert actual <= prompt_upper_bound(SUITE.default_harness, item.question, tools), item.id
