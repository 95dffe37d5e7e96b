"""The ``bfcl`` suite: function calling from the Berkeley Function Calling Leaderboard (PyPI ``bfcl-eval``).

``params`` = ``{"categories": [...]}``, a non-empty subset of ``simple``, ``multiple``, ``parallel``
(default: all three). The data are BFCL v4's ``simple_python`` (400 items: one function offered, one call
expected), ``multiple`` (200: 2-4 functions offered, one call) and ``parallel`` (200: one function, several
calls), read from the installed package; nothing is downloaded.

The model is offered the item's functions as OpenAI ``tools``, converted as BFCL's OpenAI handler does
(:func:`openai_tools`), and answers in BFCL's prompting format, a Python-like list of calls
``[func(a=1, b="x")]``. The answer is decoded into calls (:func:`decode_calls`, BFCL's decoder without its
``eval``) and checked by BFCL's own ``ast_checker`` against the item's possible answers: score 1.0 if valid,
else 0.0. An answer that does not decode raises (the grader scores it 0.0 and records why, as BFCL records a
decoding error).
"""

from __future__ import annotations

import ast
import copy
import json
import operator
import sys
import types
from functools import lru_cache
from importlib.resources import files
from typing import Any

from bfcl_eval.constants.enums import Language
from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

from grader.suites.base import Item, draw_round_robin, register_suite
from services.common.contracts import Harness
from services.common.errors import Unprocessable

CATEGORIES = ("simple", "multiple", "parallel")
BFCL_CATEGORY = {"simple": "simple_python", "multiple": "multiple", "parallel": "parallel"}  # our name -> BFCL's test category
PYTHON_HINT = " Note that the provided function is in Python 3 syntax."  # BFCL appends it to every Python function's description
CHECKER_MODEL = "crucible"  # the model name the AST checker is given (see _import_ast_checker)


def _import_ast_checker() -> Any:
    """BFCL's ``ast_checker``, imported with a one-entry model registry.

    ``bfcl_eval.eval_checker.ast_eval.ast_checker`` imports ``bfcl_eval.constants.model_config`` only to read
    ``MODEL_CONFIG_MAPPING[model].underscore_to_dot``; that module imports every vendor handler of the
    leaderboard (anthropic, cohere, google-genai, ... SDKs). A stand-in registry with the one model we name,
    ``underscore_to_dot=True`` (our tool names have ``.`` replaced by ``_``, as for BFCL's OpenAI models), is
    put in ``sys.modules`` for the import only; the checker's code runs unchanged.
    """
    name = "bfcl_eval.constants.model_config"
    registry = types.ModuleType(name)
    registry.MODEL_CONFIG_MAPPING = {CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=True)}  # type: ignore[attr-defined]
    previous = sys.modules.get(name)
    sys.modules[name] = registry
    try:
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    finally:
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
    return ast_checker


ast_checker = _import_ast_checker()


@lru_cache(maxsize=len(CATEGORIES))
def load_category(category: str) -> tuple[dict[str, Any], ...]:
    """The BFCL entries of ``category`` in file order: ``{"id", "question": [[{role, content}]], "function": [doc],
    "ground_truth": [{name: {param: [allowed values]}}]}`` (questions joined with their possible answers by id)."""
    data = files("bfcl_eval") / "data"
    stem = f"BFCL_v4_{BFCL_CATEGORY[category]}.json"
    answers = {row["id"]: row["ground_truth"] for row in map(json.loads, (data / "possible_answer" / stem).read_text().splitlines())}
    return tuple({**row, "ground_truth": answers[row["id"]]} for row in map(json.loads, (data / stem).read_text().splitlines()))


# ----------------------------------------------------------------------------- tools


def _openai_properties(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL's ``_cast_to_openai_type`` with its ``GORILLA_TO_OPENAPI`` mapping: BFCL types to JSON-schema
    types (``dict`` → ``object``, ``float`` → ``number`` with ``format: float``, ``tuple`` → ``array``,
    unknown → ``string``), one level into ``items`` and recursively into ``properties``. Mutates and returns."""
    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            if value["type"] == "float":
                value["format"] = "float"
                value["description"] += " This is a float type value."
            value["type"] = GORILLA_TO_OPENAPI.get(value["type"], "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _openai_properties(value["properties"])
            elif "items" in value:
                items = value["items"]
                items["type"] = GORILLA_TO_OPENAPI[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = GORILLA_TO_OPENAPI[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _openai_properties(items["properties"])
    return properties


def openai_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI ``tools`` (``[{"type": "function", "function": {name, description, parameters}}]``) for BFCL
    function docs, as BFCL prepares them for its OpenAI chat-completions handler: the Python hint appended to
    the description, ``.`` in names replaced by ``_`` (OpenAI names match ``^[a-zA-Z0-9_-]{1,64}$``),
    ``parameters.type`` ``object`` and the parameter types cast (:func:`_openai_properties`). ``functions``
    is not modified."""
    tools = []
    for function in copy.deepcopy(functions):
        function["description"] += PYTHON_HINT
        function["name"] = function["name"].replace(".", "_")
        function["parameters"]["type"] = "object"
        function["parameters"]["properties"] = _openai_properties(function["parameters"]["properties"])
        tools.append({"type": "function", "function": function})
    return tools


# ----------------------------------------------------------------------------- decoding

_MAX_INT_BITS = 10_000  # bound on integers computed from the answer's arithmetic (a model's `9**9**9` must not hang the grader)
_NUMBER = (int, float, complex)  # bool is an int
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}


def _arithmetic(node: ast.expr) -> Any:
    """The value of a constant arithmetic expression: numbers under the binary and unary operators, and ``+`` on
    two strings. Raises ``ValueError`` for anything else (names, calls, containers) and for integers past
    :data:`_MAX_INT_BITS` bits (checked before a power or shift is computed)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (*_NUMBER, str)):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        operand = _arithmetic(node.operand)
        if not isinstance(operand, _NUMBER):
            raise ValueError("a unary operator on a non-number")
        return _UNARY[type(node.op)](operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        if isinstance(left, str) and isinstance(right, str) and isinstance(node.op, ast.Add):
            return left + right
        if not (isinstance(left, _NUMBER) and isinstance(right, _NUMBER)):
            raise ValueError("arithmetic on a non-number")
        if isinstance(left, int) and isinstance(right, int):
            if isinstance(node.op, ast.Pow) and right > 0 and abs(left) > 1 and abs(left).bit_length() * right > _MAX_INT_BITS:
                raise ValueError("integer power too large")
            if isinstance(node.op, ast.LShift) and right > _MAX_INT_BITS:
                raise ValueError("shift too large")
        value = _BINARY[type(node.op)](left, right)
        if isinstance(value, int) and value.bit_length() > _MAX_INT_BITS:
            raise ValueError("integer too large")
        return value
    raise ValueError(f"not a constant arithmetic expression: {ast.unparse(node)}")


def _value(node: ast.expr) -> Any:
    """An argument's value as BFCL's ``resolve_ast_by_type`` gives it: literals as Python values, any unary
    operator on a constant negates it (as BFCL does), names and calls without keywords as their source text,
    calls with keywords as nested ``{name: {arg: value}}``, subscripts as ``"a[b]"``. Binary operations are
    computed by :func:`_arithmetic` where BFCL uses ``eval``. Raises ``ValueError`` for other nodes (lambdas:
    BFCL's handling of them always raises)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.operand, ast.Constant):
            raise ValueError(f"unsupported unary operand: {ast.unparse(node)}")
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking in an argument")
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.BinOp):
        return _arithmetic(node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _call(node) if node.keywords else ast.unparse(node)
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Subscript):
        return f"{ast.unparse(node.value)}[{ast.unparse(node.slice)}]"
    raise ValueError(f"unsupported argument: {ast.unparse(node)}")


def _call(node: ast.Call) -> dict[str, dict[Any, Any]]:
    """``{dotted name: {keyword: value}}`` as BFCL's ``resolve_ast_call``: positional arguments are ignored."""
    parts = []
    func = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return {".".join(reversed(parts)): {kw.arg: _value(kw.value) for kw in node.keywords}}


def decode_calls(text: str) -> list[dict[str, dict[Any, Any]]]:
    """The calls in a completion in BFCL's Python prompting format, decoded as BFCL's
    ``default_decode_ast_prompting`` does: backticks, newlines and spaces stripped from the ends, the text
    wrapped in ``[...]`` unless it already starts/ends so, parsed as one Python expression whose elements must
    all be calls. Returns ``[{name: {arg: value}}, ...]`` (BFCL's format check always passes on it). Raises
    ``SyntaxError`` or ``ValueError`` (and, on degenerate input, ``TypeError``/``RecursionError``) when the
    text is not such a list.

    Differs from BFCL in one way, on purpose: BFCL ``eval``s binary operations (``2*5``), which would run
    model-written code in the grader; here only constant arithmetic is computed (:func:`_arithmetic`), so other
    operations that Python would accept (``abs(-2)*3``, ``"ab"*2``, ``[1]+[2]``) fail to decode.
    """
    text = text.strip("`\n ")
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    body = ast.parse(text.strip().strip("'"), mode="eval").body
    if isinstance(body, ast.Call):
        return [_call(body)]
    if not isinstance(body, (ast.List, ast.Tuple, ast.Set)):
        raise ValueError("not a list of calls")
    calls = []
    for element in body.elts:
        if not isinstance(element, ast.Call):
            raise ValueError(f"not a call: {ast.unparse(element)}")
        calls.append(_call(element))
    return calls


# ----------------------------------------------------------------------------- the suite


def _categories(params: dict[str, Any]) -> list[str]:
    """The chosen categories in :data:`CATEGORIES` order (the order in ``params`` does not change the items)."""
    chosen = params.get("categories", list(CATEGORIES))
    return [c for c in CATEGORIES if c in chosen]


@register_suite
class BfclSuite:
    """BFCL simple/multiple/parallel; the default harness is BFCL's system prompt for prompting models
    (answer only with the list of calls), greedy decoding, the whole completion as the answer."""

    name = "bfcl"
    default_harness = Harness(
        system_prompt=(
            "You are an expert in composing functions. You are given a question and a set of possible functions. Based on the question, you will "
            "need to make one or more function/tool calls to achieve the purpose. If none of the functions can be used, point it out. If the given "
            "question lacks the parameters required by the function, also point it out. You should only return the function calls in your response."
            "\n\nIf you decide to invoke any of the function(s), you MUST put it in the format of "
            "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n"
            "You SHOULD NOT include any other text in the response."
        ),
        user_template="{{ question }}",
        max_tokens=256,
        temperature=0.0,
        answer_extraction="strip",
    )

    def check_params(self, params: dict[str, Any]) -> None:
        unknown = sorted(set(params) - {"categories"})
        if unknown:
            raise Unprocessable(f"unknown bfcl params {unknown}; the only one is 'categories'", field="suite.params")
        chosen = params.get("categories", list(CATEGORIES))
        if not isinstance(chosen, list) or not chosen or not all(isinstance(c, str) for c in chosen) or len(set(chosen)) != len(chosen) \
                or not set(chosen) <= set(CATEGORIES):
            raise Unprocessable(f"suite.params.categories must be a non-empty list of distinct names among {list(CATEGORIES)}; got {chosen!r}",
                                field="suite.params.categories")

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` items: each chosen category's entries shuffled by ``random.Random(seed)``, then taken from the
        categories in turn (so any prefix is spread evenly over them), skipping questions in ``exclude`` and
        repeats. Raises ``Unprocessable`` (field ``suite.splits.<split>.size``) if fewer remain."""
        drawn = draw_round_robin([(c, load_category(c)) for c in _categories(params)], seed, size, key=lambda e: e["question"][0][-1]["content"],
                                 exclude=exclude)
        items = [Item(id=entry["id"], question=entry["question"][0][-1]["content"], answer=json.dumps(entry["ground_truth"]),
                      entry={"question": entry["question"], "function": entry["function"], "possible_answer": entry["ground_truth"], "category": category})
                 for category, entry in drawn]
        if len(items) < size:
            raise Unprocessable(f"bfcl {_categories(params)}: only {len(items)} distinct {split} items exist outside the excluded set; ask for fewer",
                                field=f"suite.splits.{split}.size")
        return items

    def tools(self, item: Item) -> list[dict[str, Any]]:
        """The item's functions as OpenAI ``tools`` (:func:`openai_tools`)."""
        return openai_tools(item.entry["function"])

    def score(self, answer: str | None, item: Item) -> float:
        """1.0 if the decoded calls pass BFCL's ``ast_checker`` for the item's category, else 0.0 (also for ``None``).
        Raises what :func:`decode_calls` raises on an answer that is not a list of calls, and what the checker raises
        on an odd value (the grader scores such an answer 0.0 and records why)."""
        if answer is None:
            return 0.0
        calls = decode_calls(answer)
        result = ast_checker(item.entry["function"], calls, item.entry["possible_answer"], Language.PYTHON,
                             BFCL_CATEGORY[item.entry["category"]], CHECKER_MODEL)
        return 1.0 if result["valid"] else 0.0

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """Distinct questions of the chosen categories (exact)."""
        return len({e["question"][0][-1]["content"] for c in _categories(params) for e in load_category(c)}), True
