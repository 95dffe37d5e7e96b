"""Answer extraction, mode by mode, against the field's references: math-verify and reasoning-gym's scorers for
``last_number``, MATH's ``last_boxed_only_string``/``remove_boxed`` for ``boxed``, evalplus's sanitizer and
HumanEval's tests for ``code``; and a corpus of hostile completions that no mode may crash or stall on."""

from __future__ import annotations

import re
import time

import math_verify
import pytest
import reasoning_gym
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from grader.suites import Item
from grader.suites.humaneval import HumanEvalSuite, problems
from grader.suites.math import math_families
from services.common.contracts import Harness
from services.common.extraction import MODES
from services.common.harness import extract_answer


def _extract(mode: str, completion: str, **kwargs: str | None) -> str | None:
    return extract_answer(Harness(answer_extraction=mode), completion, **kwargs)


# ----------------------------------------------------------------------------------------------- last_number

# (completion, what last_number extracts, whether math-verify reads the same value: it reads no exponent,
# Unicode minus, \tfrac or a number after a letter, and it reads ``10-3`` as an expression)
LAST_NUMBER = [
    ("The total is 1,234.", "1234", True),
    ("So x = -3/4", "-3/4", True),
    ("Solving, x = -3/4.", "-3/4", True),
    ("Janet sells 16 - 3 - 4 = 9 duck eggs a day. She makes 9 * $2 = $18 every day.\n#### 18", "18", True),
    ("3 + 4 is 7.", "7", True),
    ("The population grew to 1,234,567.5 on average.", "1234567.5", True),
    ("Total: $1,000,000", "1000000", True),
    ("In LaTeX: $1{,}250$", "1250", True),
    ("The probability is $\\frac{5}{12}$.", "5/12", True),
    ("Therefore $x = -\\dfrac{3}{4}$.", "-3/4", True),
    ("so y = \\tfrac{-2}{-6}", "2/6", False),
    ("The temperature dropped to \u22127 degrees.", "-7", False),
    ("Half is .5", "0.5", True),
    ("It is 3.", "3", True),
    ("Pi is about 3.14.", "3.14", True),
    ("The rate is 1.5e-3 per second.", "1.5e-3", False),
    ("Avogadro: 6.022E23", "6.022E23", False),
    ("The discount is 25%.", "25", True),
    ("That is 12.5\\% of the total", "12.5", True),
    ("Subtracting, 10-3 gives the rest", "3", False),
    ("The point is (2, -5).", "-5", True),
    ("f(-3) is undefined", "-3", False),
    ("**Answer:** +12", "12", False),
    ("Answer: 3 / 4", "3/4", True),
    ("no digits here", None, False),
    ("", None, False),
]


@pytest.mark.parametrize(("completion", "expected"), [(c, e) for c, e, _ in LAST_NUMBER])
def test_last_number_reads_numbers_as_written(completion: str, expected: str | None) -> None:
    assert _extract("last_number", completion) == expected


@pytest.mark.parametrize(("completion", "expected"), [(c, e) for c, e, same in LAST_NUMBER if same])
def test_last_number_agrees_with_math_verify(completion: str, expected: str) -> None:
    """math-verify (HuggingFace) reads the completion as the same value as the extracted answer."""
    gold = math_verify.parse(f"${expected}$", parsing_timeout=None)
    assert math_verify.verify(gold, math_verify.parse(completion, parsing_timeout=None), timeout_seconds=None)


_NUMERIC = re.compile(r"-?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?:/\d+)?")


@pytest.mark.parametrize("family", math_families())
def test_every_numeric_reasoning_gym_answer_survives_last_number_and_scores_full(family: str) -> None:
    """The family's own reference answer, written at the end of a sentence, is extracted unchanged and the
    family's scorer gives it 1.0: the plain form is what reasoning-gym's scorers compare."""
    dataset = reasoning_gym.create_dataset(family, seed=7, size=40)
    entries = [e for e in dataset if isinstance(e["answer"], str) and _NUMERIC.fullmatch(e["answer"])]
    for entry in entries:
        extracted = _extract("last_number", f"Working through it step by step, the answer is {entry['answer']}.")
        assert extracted == entry["answer"]
        assert dataset.score_answer(extracted, entry) == 1.0


def test_fraction_answers_in_any_written_form_score_full() -> None:
    """fraction_simplification's references come as ``a/b``, ``$a/b$`` or ``$\\dfrac{a}{b}$``; each extracts to a
    form its scorer accepts."""
    dataset = reasoning_gym.create_dataset("fraction_simplification", seed=3, size=40)
    for entry in dataset:
        extracted = _extract("last_number", f"Dividing by the gcd, the simplified fraction is {entry['answer']}.")
        assert dataset.score_answer(extracted, entry) == 1.0, (entry["answer"], extracted)


# ----------------------------------------------------------------------------------------------------- boxed


def reference_boxed(string: str) -> str | None:
    """``remove_boxed(last_boxed_only_string(string))`` as lm-evaluation-harness states them
    (lm_eval/tasks/minerva_math/utils.py, after Hendrycks et al. 2021), restated: an assertion of
    ``remove_boxed`` that fails gives ``None``."""
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        s = "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    else:
        if idx < 0:
            idx = string.rfind("\\fbox")
            if idx < 0:
                return None
        i, right_brace_idx, num_left_braces_open = idx, None, 0
        while i < len(string):
            if string[i] == "{":
                num_left_braces_open += 1
            if string[i] == "}":
                num_left_braces_open -= 1
                if num_left_braces_open == 0:
                    right_brace_idx = i
                    break
            i += 1
        if right_brace_idx is None:
            return None
        s = string[idx:right_brace_idx + 1]
    if "\\boxed " in s:
        left = "\\boxed "
        return s[len(left):] if s[:len(left)] == left else None
    left = "\\boxed{"
    return s[len(left):-1] if s[:len(left)] == left and s[-1] == "}" else None


def _as_extracted(reference: str | None) -> str | None:
    return (reference or "").strip() or None


def _departs(string: str) -> bool:
    """Where the harness departs from the reference on purpose: ``\\fbox`` alone, and ``\\boxed {…}``."""
    if "\\boxed " in string:
        return string.split("\\boxed ")[-1].split("$")[0].lstrip().startswith("{")
    return "\\boxed" not in string and "\\fbox" in string


BOXED = [
    ("So the total is \\boxed{42}.", "42"),
    ("$\\boxed{\\frac{\\sqrt{3}}{3}}$", "\\frac{\\sqrt{3}}{3}"),
    ("first \\boxed{1}, then \\boxed{2}", "2"),
    ("$\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),
    ("The answer is $\\boxed 5$.", "5"),
    ("Hence \\boxed 12", "12"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("The matrix is $\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}$.", "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"),
    ("$$\\boxed{x^{2} + y_{1}}$$", "x^{2} + y_{1}"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("\\boxed{3}, then one cut off: \\boxed{\\frac{1}{", None),  # the last box does not close: as the reference
    ("a brace after: \\boxed{7}}", "7"),
    ("\\boxed5 and later {x}", None),  # the reference's remove_boxed refuses ``\boxed5 … {x}``
    ("no box: 42", None),
    ("\\boxed{}", None),
    ("\\boxed{   }", None),
    ("", None),
]


@pytest.mark.parametrize(("completion", "expected"), BOXED)
def test_boxed_reads_what_math_reference_reads(completion: str, expected: str | None) -> None:
    assert not _departs(completion)
    assert _as_extracted(reference_boxed(completion)) == expected
    assert _extract("boxed", completion) == expected


@pytest.mark.parametrize(("completion", "expected"), [
    ("The answer is \\fbox{7}.", "7"),
    ("\\fbox{a} and \\fbox{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed { 7 }", "7"),
    ("The answer is $\\boxed {\\frac{1}{2}}$", "\\frac{1}{2}"),
    ("\\boxed {\\frac{1}{", None),
])
def test_boxed_reads_fbox_and_a_spaced_group_as_tex_does(completion: str, expected: str | None) -> None:
    """The two departures: ``\\fbox{…}`` (the reference finds it but its ``remove_boxed`` fails on it) and
    ``\\boxed {…}`` (the reference keeps the braces: ``{7}``)."""
    assert _departs(completion)
    assert _extract("boxed", completion) == expected


_TEX = st.sampled_from(["\\boxed", "\\boxed ", "\\fbox", "{", "}", "\\{", "\\}", "$", " ", "\n", "x", "12", "\\frac", "-", "boxed"])


@settings(max_examples=1500, deadline=None)
@given(st.lists(_TEX, max_size=24).map("".join))
def test_boxed_agrees_with_the_reference_on_generated_latex(completion: str) -> None:
    assume(not _departs(completion))
    assert _extract("boxed", completion) == _as_extracted(reference_boxed(completion))


@settings(max_examples=500, deadline=None)
@given(st.lists(_TEX.filter(lambda t: "\\boxed" not in t and t != "$"), max_size=12).map("".join))
def test_fbox_and_a_spaced_boxed_group_read_as_the_reference_reads_boxed(inner: str) -> None:
    braced = reference_boxed("\\boxed{" + inner + "}")
    assume("\\fbox" not in inner)
    assert _extract("boxed", "\\fbox{" + inner + "}") == _as_extracted(braced)
    assert _extract("boxed", "\\boxed {" + inner + "}") == _as_extracted(braced)


# ------------------------------------------------------------------------------------------------------ code

USAGE_FIRST = """Here is how you would call it:

```python
print(add(2, 3))  # 5
```

And the implementation:

```python
import math
from functools import lru_cache

LIMIT = 10


@lru_cache(maxsize=None)
def add(a: int, b: int) -> int:
    return helper(a) + b


def helper(x):
    return min(x, LIMIT) + math.floor(0.5)


def unused():
    return 0


print(add(1, 2))
assert add(1, 1) == 2
if __name__ == "__main__":
    main()
```
"""

USAGE_FIRST_SANITIZED = """import math
from functools import lru_cache

LIMIT = 10


@lru_cache(maxsize=None)
def add(a: int, b: int) -> int:
    return helper(a) + b


def helper(x):
    return min(x, LIMIT) + math.floor(0.5)"""


@pytest.mark.parametrize(("completion", "entry_point", "expected"), [
    (USAGE_FIRST, "add", USAGE_FIRST_SANITIZED),
    ("```python\ndef f(x):\n    return x + 1\n```\nExample usage:\n```python\nprint(f(1))\n```", "f", "def f(x):\n    return x + 1"),
    ("The signature:\n```python\ndef f(x):\n    \"\"\"Add one.\"\"\"\n```\nSolution:\n```python\ndef f(x):\n    return x + 1\n```", "f",
     "def f(x):\n    return x + 1"),
    ("```python\ndef f(x):\n    return x + 1\n\ndef f(x):\n    return x + 2\n```", "f", "def f(x):\n    return x + 1\n\ndef f(x):\n    return x + 2"),
    ("```python\nimport os\rdef f():\r    return os.sep\rprint(f())\n```", "f", "import os\rdef f():\r    return os.sep"),
    ("```python\r\nimport os\r\ndef f():\r\n    return os.sep\r\nprint(f())\r\n```", "f", "import os\r\ndef f():\r\n    return os.sep"),
    ("```python\nclass Node:\n    pass\n\ndef f():\n    return Node()\n\nf()\n```", "f", "class Node:\n    pass\n\ndef f():\n    return Node()"),
    # no block defines the entry point: the block defining a function, else the first block
    ("```python\nprint(g(1))\n```\n```python\ndef g(x):\n    return x\n```", "f", "def g(x):\n    return x"),
    (USAGE_FIRST, None, USAGE_FIRST.split("```python\n")[2].split("```")[0].rstrip()),
    ("```python\nprint(g(1))\n```\n```python\ndef g(x):\n    return x\n```", None, "def g(x):\n    return x"),
    ("```python\ndef f(:\n```\n```\nnot code\n```", "f", "def f(:"),
    # a continued function body, fenced or not, is kept as written
    ("```python\ndef f():\n    return 1\n```\ntext", None, "def f():\n    return 1"),
    ("Sure:\n```\n    return 1\n```", "f", "    return 1"),
    ("```py\n\n    return 1\n", "f", "    return 1"),  # cut before the closing fence
    ("\n\n    return x\n\n", "f", "    return x"),
    ("```python\n```", "f", None),
    ("", "f", None),
])
def test_code_keeps_the_block_defining_the_entry_point(completion: str, entry_point: str | None, expected: str | None) -> None:
    assert _extract("code", completion, entry_point=entry_point) == expected


def _humaneval_item(task_id: str) -> Item:
    p = problems()[task_id]
    return Item(id=task_id, question=p["prompt"], answer=p["canonical_solution"], entry={k: p[k] for k in ("task_id", "prompt", "test", "entry_point")})


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/10", "HumanEval/28"])
def test_a_chat_reply_with_usage_before_and_checks_after_the_solution_passes_humaneval(task_id: str) -> None:
    """A chat model's reply: a usage example first, then the whole function followed by its own (wrong) check.
    With the entry point the grader keeps the function and passes HumanEval's tests; without it, the block runs
    as written and its stray check fails the program."""
    item = _humaneval_item(task_id)
    p = problems()[task_id]
    whole = p["prompt"][p["prompt"].index(f"def {p['entry_point']}("):] + p["canonical_solution"]
    completion = (f"You can use it like this:\n\n```python\nprint({p['entry_point']}([]))\n```\n\nThe solution:\n\n```python\n"
                  f"{whole}\n\nprint('demo')\nassert False, 'a self-check that is wrong'\n```\nHope this helps.")
    suite = HumanEvalSuite()
    assert suite.score(_extract("code", completion, entry_point=p["entry_point"]), item) == 1.0
    assert suite.score(_extract("code", completion), item) == 0.0


# ----------------------------------------------------------------------------------------- the simple modes


@pytest.mark.parametrize(("mode", "answer_regex", "completion", "expected"), [
    ("strip", None, "  42 \n", "42"),
    ("first_line", None, "\n 17 \nbecause 3 + 14 = 17", "17"),
    ("first_line", None, "   ", None),
    ("regex", r"[Aa]nswer: *(\S+)", "Reasoning...\nAnswer: -5", "-5"),
    ("regex", r"#### (\d+)", "no marker", None),
    ("regex", r"\d+", "between 10 and 20", "10"),
])
def test_simple_modes(mode: str, answer_regex: str | None, completion: str, expected: str | None) -> None:
    assert extract_answer(Harness(answer_extraction=mode, answer_regex=answer_regex), completion) == expected


# ------------------------------------------------------------------------------------------ hostile corpus

MB = 1 << 20
HOSTILE = {
    "empty": "",
    "whitespace": " \n\t\r" * 1000,
    "1 MB of letters": "a" * MB,
    "1 MB of digits": "7" * MB,
    "binary-looking": bytes(range(256)).decode("latin-1") * (MB // 256),
    "lone surrogate": "```python\n\ud800def f():\n    return 1\n```",
    "null bytes": "```python\n\x00def f():\n    return 1\n```\n" + "\x00" * 1000,
    "deep braces": "\\boxed" + "{" * MB,
    "deep closing braces": "}" * MB + "\\boxed{" + "}" * MB,
    "many boxes": "\\boxed{1}" * (MB // 9),
    "many spaced boxes": "\\boxed " * (MB // 7),
    "unbalanced latex": "\\boxed{\\frac{1}{2" + "\\left(" * 10000,
    "deep parens in a fence": "```python\n" + "(" * MB + "\n```",
    "deep unary minus in a fence": "```python\ndef f():\n    return " + "-" * 100_000 + "1\n```",
    "deep subscript in a fence": "```python\ndef f():\n    return x" + "[0]" * 100_000 + "\n```",
    "deep indentation": "```python\n" + "".join(" " * i + "if 1:\n" for i in range(300)) + "```",
    "many fences": "```\nx = 1\n```\n" * (MB // 14),
    "many functions": "```python\ndef f():\n    return 1\n```\n" * (MB // 34),
    "many unparsable definitions": "```\ndef f(:\n```\n" * (MB // 16),
    "many stub definitions": "```\ndef f():\n    pass\n```\n" * (MB // 26),
    "one long fence line": "```" + "`" * MB,
    "thousands chains": "1" + ",111" * (MB // 4) + "1",
    "commas": "1," * (MB // 2),
    "latex fractions": "\\frac{" * (MB // 6),
    "minus signs": "-" * MB + "1",
    "exponents": "1e" * (MB // 2),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_completions_give_a_string_or_none_quickly(name: str, mode: str) -> None:
    harness = Harness(answer_extraction=mode, answer_regex=r"answer: (.*)" if mode == "regex" else None)
    start = time.monotonic()
    answer = extract_answer(harness, HOSTILE[name], entry_point="f")
    assert answer is None or (isinstance(answer, str) and answer)
    assert time.monotonic() - start < 10  # linear work: about a second per MB on a busy machine
