"""The ``bfcl_multi_turn`` suite: multi-turn function calling from the Berkeley Function Calling Leaderboard (PyPI
``bfcl-eval``), the conversation driven by the grader, the score given by BFCL's own multi-turn checker.

``params`` = ``{"categories": [...]}``, a non-empty subset of ``base``, ``miss_func``, ``miss_param``,
``long_context`` (default: ``["base"]``): BFCL v4's ``multi_turn_*`` categories, 200 entries each, read from the
installed package with their function docs (``data/multi_turn_func_doc``) and their executable backends (``GorillaFileSystem``,
``TwitterAPI``, ``TradingBot``, ... in ``eval_checker/multi_turn_eval/func_source_code``); nothing is downloaded. An entry
is a conversation of user turns, the backends it involves with their initial state, and per turn the calls that fulfil
it (the ground truth). ``miss_func`` holds a function back until a later turn (before it the right answer is to call
nothing); ``miss_param`` leaves a needed value out of a turn (the user gives it in the next one); ``long_context``
loads the backends with long distracting contents.

**An item** (:class:`~grader.suites.base.Item`): ``id`` is BFCL's (``multi_turn_base_0``); ``question`` is the
conversation's user turns joined by newlines (what split exclusion and the contamination audit compare: ``long_context``
and most ``miss_func`` entries repeat a ``base`` conversation word for word, so a chosen set of categories holds each
conversation once); ``answer`` is the ground truth (JSON, per turn the calls); ``entry`` holds the turns, the involved
backends, their initial state and the held-out functions by turn.

**A conversation** (:meth:`BfclMultiTurnSuite.converse`, :func:`run_conversation`) runs as BFCL's multi-turn inference
runs a prompting model (``BaseHandler.inference_multi_turn_prompting`` with the OpenAI prompting handler): for each user
turn (at a ``miss_func`` entry's held-out turn, BFCL's message listing the functions added back, and from then on
those functions offered too) the user message is added and the model answers, step after step: an answer that decodes
(BFCL's Python-list format, parsed as BFCL parses it: :func:`parse_answer`) to one or more calls has its calls
executed on the conversation's own backend instances and the results added as one ``user`` message, BFCL's
``repr([{"role": "tool", "name": call, "content": result}, ...])``; an answer with no decodable call ends the turn. More
than BFCL's ``MAXIMUM_STEP_LIMIT`` (20) executed steps in one turn ends the conversation there (BFCL's forced quit:
the turns so far are scored, so a quit before the last turn fails). The model sees the available functions as OpenAI ``tools`` (converted as the
single-turn suite converts them, :func:`grader.suites.bfcl.openai_tools`) and the default harness's system prompt is
BFCL's multi-turn prompt without its function list. The grader meters each model call; past the benchmark's
``max_turns`` calls, or once the conversation no longer fits a request, :class:`~grader.suites.base.TurnLimitReached`
ends it (the item scores 0).

**The score** (:meth:`BfclMultiTurnSuite.score`) is BFCL's ``multi_turn_checker`` (``bfcl_eval.eval_checker.
multi_turn_eval.multi_turn_checker``, imported and run unchanged) on the calls executed per turn and step, against the
ground truth: after every turn it replays the model's calls and the ground truth's on fresh backends and compares their
states and results. 1.0 if valid, else 0.0; a conversation whose number of turns differs from the ground truth's (forced
quit) is invalid, as in BFCL's ``_evaluate_single_multi_turn_entry``.

**Security: model-written text is never evaluated.** BFCL's executor (``execute_multi_turn_func_call``) and its checker
run call strings through ``eval``. Only canonical strings built here reach them: the model's answer is parsed with
``ast`` (never executed); a call is accepted only if it is a plain name that is one of the involved classes'
documented functions and a public method of their backend class (held-out functions included: BFCL's executor runs
them too, and its own ground truth once calls one a turn early), and every keyword argument's value is a literal
(``ast.literal_eval`` of str, int, float (finite), bool, None, and lists, tuples and dicts of those); it is then
written anew as ``name(k=repr(value), ...)`` and parsed back to check it is that call (:func:`canonical_call`).
Positional arguments are dropped, as BFCL's decoder drops them. Any other call is not executed and the model gets
``Error during execution: ...`` for it, as BFCL answers a call that fails; such calls are not passed to the checker.
This departs from BFCL on purpose where BFCL reads model text loosely or evaluates it: a bare name or a call as an
argument value (BFCL passes the text on as a string, or executes a nested call with keywords), arithmetic (BFCL
``eval``s it), a dict of dicts (BFCL's executor writes it as a nested call). BFCL's executor then prefixes each
function name with its instance (a regular expression over the string): inside a canonical string it can only add
name characters to a string literal, never end it.

**Isolation.** BFCL keeps backend instances in ``multi_turn_utils``'s module globals, keyed by model name and entry id.
Each conversation and each scoring uses a fresh unique model name (``crucible_<uuid>``), so concurrent conversations
(the worker runs several threads) never share an instance, and removes its instances when it ends, however it ends.
Executions (and the checker) run under one lock: they take milliseconds, and BFCL's backends share some module state
(``VehicleControlAPI`` writes the long-context weather table in place).
"""

from __future__ import annotations

import ast
import inspect
import json
import math
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import import_module
from importlib.resources import files
from typing import Any

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING, MAXIMUM_STEP_LIMIT
from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, MULTI_TURN_FUNC_DOC_FILE_MAPPING
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker as _checker_module
from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

from grader.suites.base import Complete, Item, TurnLimitReached, draw_round_robin, register_suite
from grader.suites.bfcl import openai_tools
from services.common.contracts import Harness
from services.common.errors import Unprocessable
from services.common.harness import render_messages
from services.common.openai_protocol import MAX_PROMPT_CHARS, ChatTool

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
BFCL_CATEGORY = {c: f"multi_turn_{c}" for c in CATEGORIES}  # our name -> BFCL's test category
DEFAULT_CATEGORIES = ("base",)
MODEL_KEY_PREFIX = "crucible_"  # the model names BFCL's globals are keyed by here: this prefix and a fresh uuid

_EXECUTION = threading.Lock()  # BFCL's executor and checker, one at a time (module globals, shared backend tables)


# ----------------------------------------------------------------------------- data


@lru_cache(maxsize=len(CATEGORIES))
def load_category(category: str) -> tuple[dict[str, Any], ...]:
    """The BFCL entries of ``category`` in file order, with their ground truth joined by id: ``{"id", "question":
    [[{role, content}]] (per turn its messages; a held-out turn has none), "initial_config", "involved_classes",
    "missed_function": {turn: [function names]} (miss_func only), "ground_truth": [[call, ...]] (per turn)}``."""
    data = files("bfcl_eval") / "data"
    stem = f"BFCL_v4_{BFCL_CATEGORY[category]}.json"
    answers = {row["id"]: row["ground_truth"] for row in map(json.loads, (data / "possible_answer" / stem).read_text().splitlines())}
    return tuple({**row, "ground_truth": answers[row["id"]]} for row in map(json.loads, (data / stem).read_text().splitlines()))


@lru_cache(maxsize=len(MULTI_TURN_FUNC_DOC_FILE_MAPPING))
def class_functions(class_name: str) -> tuple[dict[str, Any], ...]:
    """The function docs of one backend class (``data/multi_turn_func_doc``), in file order."""
    text = (files("bfcl_eval") / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]).read_text()
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@lru_cache(maxsize=len(CLASS_FILE_PATH_MAPPING))
def backend_methods(class_name: str) -> frozenset[str]:
    """The public methods of a backend class: the names BFCL's executor binds to the instance."""
    cls = getattr(import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    return frozenset(name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_"))


def question_text(turns: list[list[dict[str, Any]]]) -> str:
    """An entry's conversation as one string: its user messages, joined by newlines."""
    return "\n".join(m["content"] for turn in turns for m in turn if m["role"] == "user")


def functions_by_turn(entry: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The function docs available at each turn, as BFCL builds them (``populate_test_cases_with_predefined_functions``
    and the inference loop): the involved classes' docs in order less the held-out ones, each held-out function
    appended at the turn that adds it back."""
    missed = entry.get("missed_function", {})
    held = {name for names in missed.values() for name in names}
    docs = [doc for cls in entry["involved_classes"] for doc in class_functions(cls)]
    available = [doc for doc in docs if doc["name"] not in held]
    by_turn = []
    for turn in range(len(entry["turns"])):
        for name in missed.get(str(turn), []):
            available = [*available, next(doc for doc in docs if doc["name"] == name)]
        by_turn.append(available)
    return by_turn


def held_out_message(entry: dict[str, Any], turn: int) -> str | None:
    """BFCL's user message at a held-out turn (the added functions' docs, then "I have updated some more functions you
    can choose from. What about now?"); ``None`` at other turns."""
    names = entry.get("missed_function", {}).get(str(turn))
    if not names:
        return None
    docs = {doc["name"]: doc for cls in entry["involved_classes"] for doc in class_functions(cls)}
    return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=[docs[name] for name in names])


# ----------------------------------------------------------------------------- calls: parsed, vetted, written anew


class CallRefused(ValueError):
    """A call that is not executed: ``str()`` is the reason the model is told, ``source`` the model's text of the call
    (at most 200 characters)."""

    def __init__(self, reason: str, source: str) -> None:
        super().__init__(reason)
        self.source = source


def _plain(value: Any) -> bool:
    """Whether ``value`` is made only of str, int, bool, finite float, None, and lists, tuples and dicts of those: values
    whose ``repr`` is a Python literal that reads back as the same value (no set, bytes, complex, Ellipsis, ``inf``)."""
    if type(value) is float:
        return math.isfinite(value)
    if type(value) in (str, int, bool, type(None)):
        return True
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    if type(value) is dict:
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def parse_answer(text: str) -> list[ast.Call]:
    """The calls of a completion in BFCL's Python prompting format, parsed as BFCL's ``default_decode_execute_prompting``
    parses it (backticks, newlines and spaces stripped from the ends, wrapped in ``[...]`` unless it starts/ends so,
    wrapping quotes stripped, one Python expression whose elements must all be calls). Nothing is evaluated. Raises
    (``SyntaxError``, ``ValueError``; on degenerate input ``RecursionError``, ``MemoryError``) when the text is not such
    a list: the model called nothing."""
    text = text.strip("`\n ")
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    body = ast.parse(text.strip().strip("'"), mode="eval").body
    if isinstance(body, ast.Call):
        return [body]
    if not isinstance(body, (ast.List, ast.Tuple, ast.Set)):
        raise ValueError("not a list of calls")
    calls = []
    for element in body.elts:
        if not isinstance(element, ast.Call):
            raise ValueError(f"not a call: {ast.unparse(element)[:200]}")
        calls.append(element)
    return calls


def canonical_call(node: ast.Call, allowed: frozenset[str]) -> str:
    """The call ``node`` written canonically, ``name(k=repr(value), ...)``: its function a plain name in ``allowed``, its
    keyword values literals (:func:`_plain`), its positional arguments dropped (as BFCL's decoder drops them). The
    string is parsed back and must be that same call. Raises :class:`CallRefused` saying why otherwise."""
    source = ast.unparse(node)[:200]
    if not isinstance(node.func, ast.Name):
        raise CallRefused(f"{ast.unparse(node.func)[:100]} is not the name of a function", source)
    name = node.func.id
    if name not in allowed:
        raise CallRefused(f"{name} is not one of the available functions", source)
    args: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise CallRefused(f"{name}: argument unpacking (**) is not accepted", source)
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            value = _NOT_A_LITERAL
        if not _plain(value):
            raise CallRefused(f"{name}: the value of {keyword.arg} is not a literal (a string, number, boolean, None, list or dict)", source)
        args[keyword.arg] = value
    text = f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
    back = ast.parse(text, mode="eval").body  # defensive: the repr of plain values reads back as the same call
    if not (isinstance(back, ast.Call) and isinstance(back.func, ast.Name) and back.func.id == name and not back.args
            and [k.arg for k in back.keywords] == list(args) and all(ast.literal_eval(k.value) == args[k.arg] for k in back.keywords)):
        raise CallRefused(f"{name}: the call cannot be written canonically", source)
    return text


_NOT_A_LITERAL = object()  # a keyword value that ast.literal_eval does not read (never plain)


def canonical_calls(text: str, allowed: frozenset[str]) -> list[str | CallRefused]:
    """Each call of a completion written canonically (:func:`canonical_call`), or why it is refused. Raises as
    :func:`parse_answer` when the text is not a list of calls."""
    out: list[str | CallRefused] = []
    for node in parse_answer(text):
        try:
            out.append(canonical_call(node, allowed))
        except CallRefused as refused:
            out.append(refused)
    return out


def allowed_names(involved_classes: list[str]) -> frozenset[str]:
    """The names a call may use: the involved classes' documented functions that are public methods of their backend
    classes. Held-out functions are among them, as in BFCL, whose executor runs any method of the involved instances:
    one called before its turn runs (BFCL's own ground truth does so once, ``multi_turn_miss_func_49`` calls ``tail``
    a turn before it is added back)."""
    return _allowed_names(tuple(involved_classes))


@lru_cache(maxsize=256)
def _allowed_names(involved_classes: tuple[str, ...]) -> frozenset[str]:
    return frozenset(doc["name"] for cls in involved_classes for doc in class_functions(cls)) & frozenset().union(
        *(backend_methods(cls) for cls in involved_classes))


# ----------------------------------------------------------------------------- BFCL's executor and checker, isolated


@contextmanager
def _backends() -> Iterator[str]:
    """A fresh model name for BFCL's executor and checker (``crucible_<uuid hex>``); on exit, every backend instance
    BFCL created under it (names starting ``<model name>_``, its ``_eval`` and ``_ground_truth_eval`` ones included) is
    removed from ``multi_turn_utils``'s globals."""
    key = f"{MODEL_KEY_PREFIX}{uuid.uuid4().hex}"
    try:
        yield key
    finally:
        with _EXECUTION:
            namespace = vars(multi_turn_utils)
            for name in [n for n in namespace if n.startswith(f"{key}_")]:
                del namespace[name]


def _execute(calls: list[str], entry: dict[str, Any], item_id: str, key: str) -> list[str]:
    """BFCL's ``execute_multi_turn_func_call`` on canonical ``calls`` with the conversation's instances (``key``):
    one result string per call."""
    with _EXECUTION:
        results, _ = multi_turn_utils.execute_multi_turn_func_call(
            calls, entry["initial_config"], entry["involved_classes"], key, item_id,
            long_context="long_context" in entry["category"], is_evaL_run=False)
    return results


def check(turns: list[list[list[str]]], ground_truth: list[list[str]], entry: dict[str, Any], item_id: str) -> dict[str, Any]:
    """BFCL's ``multi_turn_checker`` on canonical calls (per turn, per step, the calls), on fresh instances removed
    afterwards; BFCL's forced-quit rule first (a number of turns other than the ground truth's is invalid)."""
    if len(turns) != len(ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"the conversation has {len(turns)} turns, the ground truth {len(ground_truth)}"}
    test_entry = {"id": item_id, "initial_config": entry["initial_config"], "involved_classes": entry["involved_classes"]}
    with _backends() as key, _EXECUTION:
        return _checker_module.multi_turn_checker(turns, ground_truth, test_entry, BFCL_CATEGORY[entry["category"]], key)


# ----------------------------------------------------------------------------- the conversation


@dataclass
class Transcript:
    """A conversation as run: ``messages`` (the last request's, plus the last answer and its results), ``answers`` (per
    turn, the model's answers), ``calls`` (per turn, per step that executed at least one, the canonical calls executed),
    ``tools`` (per turn, the names of the functions offered) and ``forced_quit`` (the turn at which BFCL's step limit
    ended the conversation, if it did)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    answers: list[list[str]] = field(default_factory=list)
    calls: list[list[list[str]]] = field(default_factory=list)
    tools: list[list[str]] = field(default_factory=list)
    forced_quit: int | None = None


@lru_cache(maxsize=512)
def _tool_chars(tool_json: str) -> int:
    """The characters inference counts for one tool (JSON): the tool as it reads it (:class:`ChatTool`), as JSON."""
    return len(json.dumps(ChatTool.model_validate(json.loads(tool_json)).model_dump(exclude_none=True)))


def _fits(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bool:
    """Whether a request with these messages and tools is within inference's size limit (``MAX_PROMPT_CHARS``: the
    messages' characters, plus the tools' as JSON), as ``ChatCompletionRequest`` counts them; past it the request
    would be refused."""
    chars = sum(len(m["content"]) for m in messages)
    tools_chars = 2 + sum(_tool_chars(json.dumps(t)) for t in tools) + 2 * (len(tools) - 1)  # json.dumps of the list
    return chars <= MAX_PROMPT_CHARS and chars + tools_chars <= MAX_PROMPT_CHARS


def run_conversation(item: Item, harness: Harness, complete: Complete) -> Transcript:
    """Run ``item``'s conversation with the model behind ``complete`` as BFCL's prompting inference does (see the module
    docstring): returns what was said and executed. Raises :class:`~grader.suites.base.TurnLimitReached` (from
    ``complete``, or when the conversation no longer fits a request) and whatever ``complete`` raises; the backend
    instances are removed in every case."""
    entry = item.entry
    transcript = Transcript(messages=[{"role": "system", "content": harness.system_prompt}] if harness.system_prompt else [])
    messages = transcript.messages
    allowed = allowed_names(entry["involved_classes"])
    with _backends() as key:
        for turn, (turn_messages, functions) in enumerate(zip(entry["turns"], functions_by_turn(entry), strict=True)):
            added = held_out_message(entry, turn)
            for message in [{"role": "user", "content": added}] if added is not None else turn_messages:
                content = render_messages(harness, message["content"])[-1]["content"] if message["role"] == "user" else message["content"]
                messages.append({"role": message["role"], "content": content})
            tools = openai_tools(functions)
            transcript.tools.append([doc["name"] for doc in functions])
            answers: list[str] = []
            steps: list[list[str]] = []
            transcript.answers.append(answers)
            transcript.calls.append(steps)
            for step in range(MAXIMUM_STEP_LIMIT + 1):
                if not _fits(messages, tools):
                    raise TurnLimitReached("the conversation no longer fits a request")
                answer = complete(list(messages), tools)
                answers.append(answer)
                messages.append({"role": "assistant", "content": answer})
                try:
                    calls = canonical_calls(answer, allowed)
                except Exception:  # noqa: BLE001 - BFCL: an answer that does not decode ends the turn
                    break
                if not calls:
                    break
                accepted = [c for c in calls if isinstance(c, str)]
                results = iter(_execute(accepted, entry, item.id, key) if accepted else [])
                if accepted:
                    steps.append(accepted)
                feedback = [{"role": "tool", "name": c, "content": next(results)} if isinstance(c, str)
                            else {"role": "tool", "name": c.source, "content": f"Error during execution: {c}"} for c in calls]
                messages.append({"role": "user", "content": repr(feedback)})
                if step == MAXIMUM_STEP_LIMIT:  # BFCL: "Model has been forced to quit after 20 steps."; no further turn
                    transcript.forced_quit = turn
            if transcript.forced_quit is not None:
                break
    return transcript



def _calls_from_answer(answer: str, item: Item) -> list[list[list[str]]]:
    """The per-turn, per-step calls of an answer (JSON ``[[[call, ...], ...], ...]``), each vetted and written
    canonically (:func:`canonical_call`); refused calls and steps left empty are dropped. Raises
    ``ValueError`` when the answer does not have that shape."""
    turns = json.loads(answer)
    if not (isinstance(turns, list) and all(isinstance(t, list) and all(isinstance(s, list) and all(isinstance(c, str) for c in s) for s in t)
                                            for t in turns)):
        raise ValueError("a bfcl_multi_turn answer is a JSON list, per turn, of lists, per step, of call strings")
    allowed = allowed_names(item.entry["involved_classes"])
    out = []
    for steps in turns:
        kept = []
        for step in steps:
            calls = []
            for text in step:
                try:
                    (node,) = parse_answer(text)
                    calls.append(canonical_call(node, allowed))
                except Exception:  # noqa: BLE001 - a call that is not one, or is refused, is no call
                    continue
            if calls:
                kept.append(calls)
        out.append(kept)
    return out


# ----------------------------------------------------------------------------- the suite


def _categories(params: dict[str, Any]) -> list[str]:
    """The chosen categories in :data:`CATEGORIES` order (the order in ``params`` does not change the items)."""
    chosen = params.get("categories", list(DEFAULT_CATEGORIES))
    return [c for c in CATEGORIES if c in chosen]


@register_suite
class BfclMultiTurnSuite:
    """BFCL multi-turn (base, miss_func, miss_param, long_context): conversations the grader drives (``converse``), scored
    by BFCL's ``multi_turn_checker``. The default harness is BFCL's multi-turn system prompt for prompting models
    (answer only with the list of calls; keep calling until the turn's request is done), greedy decoding."""

    name = "bfcl_multi_turn"
    default_harness = Harness(
        system_prompt=(
            "You are an expert in composing functions. You are given a question and a set of possible functions. Based on the question, you will "
            "need to make one or more function/tool calls to achieve the purpose. If none of the functions can be used, point it out. If the given "
            "question lacks the parameters required by the function, also point it out.\n\nYou should only return the function calls in your response."
            "\n\nIf you decide to invoke any of the function(s), you MUST put it in the format of "
            "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]. You SHOULD NOT include any other text in "
            "the response.\n\nAt each turn, you should try your best to complete the tasks requested by the user within the current turn. Continue "
            "to output functions to call until you have fulfilled the user's request to the best of your ability. Once you have no more functions "
            "to call, the system will consider the current turn complete and proceed to the next turn or task."
        ),
        user_template="{{ question }}",
        max_tokens=1024,
        temperature=0.0,
        answer_extraction="strip",
    )

    def check_params(self, params: dict[str, Any]) -> None:
        unknown = sorted(set(params) - {"categories"})
        if unknown:
            raise Unprocessable(f"unknown bfcl_multi_turn params {unknown}; the only one is 'categories'", field="suite.params")
        chosen = params.get("categories", list(DEFAULT_CATEGORIES))
        if not isinstance(chosen, list) or not chosen or not all(isinstance(c, str) for c in chosen) or len(set(chosen)) != len(chosen) \
                or not set(chosen) <= set(CATEGORIES):
            raise Unprocessable(f"suite.params.categories must be a non-empty list of distinct names among {list(CATEGORIES)}; got {chosen!r}",
                                field="suite.params.categories")

    def generate(self, params: dict[str, Any], seed: int, size: int, *, split: str, exclude: frozenset[str] = frozenset()) -> list[Item]:
        """``size`` items: each chosen category's entries shuffled by ``random.Random(seed)``, then taken from the
        categories in turn (so any prefix is spread evenly over them), skipping conversations in ``exclude`` and
        repeats (a conversation another category already gave). Raises ``Unprocessable`` (field
        ``suite.splits.<split>.size``) if fewer remain."""
        drawn = draw_round_robin([(c, load_category(c)) for c in _categories(params)], seed, size, key=lambda e: question_text(e["question"]),
                                 exclude=exclude)
        items = [Item(id=entry["id"], question=question_text(entry["question"]), answer=json.dumps(entry["ground_truth"]),
                      entry={"category": category, "turns": entry["question"], "initial_config": entry.get("initial_config", {}),
                             "involved_classes": entry["involved_classes"], "missed_function": entry.get("missed_function", {})})
                 for category, entry in drawn]
        if len(items) < size:
            raise Unprocessable(f"bfcl_multi_turn {_categories(params)}: only {len(items)} distinct {split} conversations exist outside the "
                                "excluded set; ask for fewer", field=f"suite.splits.{split}.size")
        return items

    def item_space(self, params: dict[str, Any]) -> tuple[int, bool]:
        """Distinct conversations of the chosen categories (exact)."""
        return len({question_text(e["question"]) for c in _categories(params) for e in load_category(c)}), True

    def converse(self, item: Item, harness: Harness, complete: Complete) -> float:
        """Run the item's conversation (:func:`run_conversation`) and score the calls it executed (:meth:`score`).
        Raises :class:`~grader.suites.base.TurnLimitReached` and what ``complete`` raises
        (the grader scores the item 0 and records why)."""
        transcript = run_conversation(item, harness, complete)
        return self.score(json.dumps(transcript.calls), item)

    def score(self, answer: str | None, item: Item) -> float:
        """1.0 if BFCL's ``multi_turn_checker`` finds the calls valid against the item's ground truth, else 0.0 (also for
        ``None``). ``answer``: JSON, per turn, per step, the call strings (``Transcript.calls``); each call is vetted and
        written canonically before it is executed (see the module docstring); one that is refused counts as no call.
        Raises ``ValueError`` on an answer of another shape, and what the checker raises."""
        if answer is None:
            return 0.0
        return 1.0 if check(_calls_from_answer(answer, item), json.loads(item.answer), item.entry, item.id)["valid"] else 0.0
