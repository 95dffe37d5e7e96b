"""The terminal suite's generated test split (grader/suites/terminal_families/): drawn from the seed, never a shipped
folder; at least twenty families, each built and worded many ways; every family's oracle scores 1 and doing nothing 0
in a real sandbox (bubblewrap here; Docker in ``make test-slow``); and a program that parses instructions by pattern,
written from the public family code, solves almost none of them."""

from __future__ import annotations

import collections
import csv
import io
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from grader.model_endpoint import ModelEndpoint
from grader.suites import Item, get_suite
from grader.suites.terminal import tasks
from grader.suites.terminal_families import FAMILIES, Generated, generate
from grader.suites.terminal_families.check import accepts
from grader.suites.terminal_families.phrasing import NOTE_NAMES, in_words
from services.common.errors import Unprocessable
from tests.unit.grader.scripted import run_script


def rollout(endpoint: ModelEndpoint, backend: str, item: Item, script: str) -> float:
    return run_script(endpoint, backend, "terminal", item, script, wall_s=30, verifier_wall_s=30).reward  # type: ignore[return-value]


def write_app(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_test_split_is_generated_from_its_seed_and_is_no_shipped_task() -> None:
    suite = get_suite("terminal")
    items = suite.generate({}, 11, 2 * len(FAMILIES), split="test")
    assert [(i.id, i.question) for i in items] == [(i.id, i.question) for i in suite.generate({}, 11, 2 * len(FAMILIES), split="test")]
    assert not {i.id for i in items} & {i.id for i in suite.generate({}, 12, 16, split="test")}
    shipped = {t["instruction"] for t in tasks().values()}
    assert not any(i.id in tasks() or i.question in shipped for i in items)
    assert {i.entry["family"] for i in items} == set(FAMILIES)  # the families taken in turn
    data = {name for name, (category, _) in FAMILIES.items() if category == "data"}
    assert {i.entry["family"] for i in suite.generate({"categories": ["data"]}, 11, 20, split="test")} == data
    validation = suite.generate({}, 5, 4, split="validation")
    assert all(i.id in tasks() for i in validation)  # the public splits stay the shipped tasks, whatever the test seed
    with pytest.raises(Unprocessable) as exc:
        suite.generate({"tasks": ["fizzbuzz-script"]}, 1, 1, split="test")
    assert exc.value.extra["field"] == "suite.params"


def skeleton(g: Generated) -> str:
    """An instance's wording with its values taken out (quoted names, paths, numbers, words of the data), note included."""
    text = g.instruction + "".join(g.files[n] for n in NOTE_NAMES if n in g.files)
    numbers = "|".join(sorted((in_words(n) for n in range(100)), key=len, reverse=True))
    return re.sub(rf"`[^`]*`|/app/\S+|\S+\.(txt|csv|tsv|json|jsonl|log|ini|conf|md)\b|\d+|\b({numbers})\b|\b[A-Z][a-z]+\b(?<!^)", "_", text)


def structure(g: Generated) -> tuple[object, ...]:
    """What an instance asks, apart from its values and wording: how the output is compared and written, the layout of
    its inputs, and the operations its instruction names."""
    inputs = frozenset(re.sub(r"[a-z0-9_-]+", "x", name) for name in g.files if name not in NOTE_NAMES)
    said = (g.instruction + "".join(g.files[n] for n in NOTE_NAMES if n in g.files)).lower()
    operations = frozenset(re.findall(r"\b(count|sum|total|mean|average|largest|smallest|delete|remove|move|rename|sort|merge|add|change|set|"
                                      r"list|keep|drop|which|how many|prefix|extension|only|except|not)\b", said))
    return g.compare, g.output.rsplit(".", 1)[-1], len(g.expected.splitlines()) == 1, inputs, operations


def test_there_are_at_least_20_families_each_built_and_worded_many_ways() -> None:
    assert len(FAMILIES) >= 20
    for family in FAMILIES:
        drawn = [generate(family, seed) for seed in range(40)]
        assert len({skeleton(g) for g in drawn}) >= 30, family  # rarely the same sentences twice
        assert len({structure(g) for g in drawn}) >= 3, family  # several task structures
        assert 3 <= sum(any(n in g.files for n in NOTE_NAMES) for g in drawn) <= 25, family  # some state the task in a note under /app


def test_every_familys_oracle_is_accepted_and_nothing_or_a_near_miss_is_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process, more instances per family than the sandbox test's: the oracle's program (the Python its bash script
    feeds to ``python3``, run here in a copy of /app) passes the check; the untouched folder and a near miss (an
    expected line or file dropped) fail it."""
    cases = [(f"{family}-{seed}", generate(family, seed)) for family in FAMILIES for seed in range(6)]
    apps = {name: write_app(tmp_path / name, g.files) for name, g in cases}
    assert [name for name, g in cases if accepts(g.spec(), apps[name])] == []
    for name, g in cases:
        monkeypatch.chdir(apps[name])
        exec(g.oracle().split("<<'ORACLE'\n", 1)[1].rsplit("ORACLE\n", 1)[0], {})  # noqa: S102 - the oracle's own program
    assert [name for name, g in cases if not accepts(g.spec(), apps[name])] == []
    for name, g in cases:
        if g.compare == "tree":
            near = json.dumps(dict(list(json.loads(g.expected).items())[1:]))
        elif g.compare == "json":
            value = json.loads(g.expected)
            near = json.dumps(value[1:] if isinstance(value, list) else dict(list(value.items())[1:]) if isinstance(value, dict) else value + 1)
        else:
            near = "\n".join(g.expected.splitlines()[:-1]) or "x"
        if json.loads(near) != json.loads(g.expected) if g.compare in ("tree", "json") else True:  # an empty list has no near miss
            assert not accepts({**g.spec(), "expected": near}, apps[name]), name


def test_every_family_scores_1_for_its_oracle_and_0_for_doing_nothing_in_the_sandbox(endpoint: ModelEndpoint, backend: str) -> None:
    """Each family's oracle program in the sandbox image scores 1 and doing nothing 0: on bubblewrap two instances of each
    family (no-op on one of each); on Docker, whose rollouts cost seconds each, one of each (no-op on every fifth), the
    families' checks being the same code on both backends (the in-process test above reads many more instances)."""
    per_family, noop_every = (2, 1) if backend == "bwrap" else (1, 5)
    items = get_suite("terminal").generate({}, 3, per_family * len(FAMILIES), split="test")
    runs = [(it, generate(it.entry["family"], it.entry["instance"]).oracle(), 1.0) for it in items]
    runs += [(it, "exit 0\n", 0.0) for it in items[:len(FAMILIES):noop_every]]
    with ThreadPoolExecutor(2) as pool:
        rewards = list(pool.map(lambda run: rollout(endpoint, backend, run[0], run[1]), runs))
    assert [(it.id, want, got) for (it, _, want), got in zip(runs, rewards, strict=True) if got != want] == []


# --------------------------------------------------------------------------- a program that reads instructions by pattern

WORD_NUMBERS = {in_words(n): n for n in range(100)}


def pattern_solver(text: str, app: dict[str, str]) -> None:
    """What a program written from the public family code, with no model, does with an instance: read the note the
    instruction points to, tell the family by its fixed phrases, pull the parameters out with regular expressions for
    the common wording, and run the family's answer code. ``app`` (path under /app → text) is changed in place."""
    for note in NOTE_NAMES:
        if note in app and note in text:
            text += "\n" + app[note]
    found = [a or b for a, b in re.findall(r"/app/([\w./-]+\w)|`([\w./-]+\.\w+)`", text)]
    inputs = [x for x in found if x in app and x not in NOTE_NAMES]
    outs = [x for x in found if x not in app and "." in x]
    out, src = outs[-1] if outs else "result.txt", app[inputs[0]] if inputs else ""

    def number(pattern: str) -> int:
        m = re.search(pattern, text)
        return 0 if not m else int(m.group(1)) if m.group(1).isdigit() else WORD_NUMBERS.get(m.group(1), 0)

    def write(lines: object) -> None:
        app[out] = "\n".join(map(str, lines)) + "\n"  # type: ignore[call-overload]

    if "application log" in text and (level := re.search(r"`(ERROR|WARN|DEBUG)`", text)):
        write([sum(1 for line in src.splitlines() if line.split()[2] == f"[{level.group(1)}]")])
    elif "some of them repeated" in text:
        write(dict.fromkeys(src.splitlines()))
    elif "email addresses" in text:
        write(sorted(set(re.findall(r"[\w.]+@[\w.]+\w", src))))
    elif "most frequent" in text:
        counts = collections.Counter(re.sub(r"[^\w\s]", "", src).lower().split())
        write([f"{w} {n}" for w, n in counts.most_common(number(r"Find the (\w+) most frequent"))])
    elif "access log" in text:
        write([ip for ip, _ in collections.Counter(line.split()[0] for line in src.splitlines()).most_common(number(r"Find the (\w+) client"))])
    elif "lines of words" in text and (word := re.search(r"contain the word `(\w+)`", text)):
        write([line for line in src.splitlines() if word.group(1) in line.lower().split()])
    elif "/app/src" in text and (marker := re.search(r"`(TODO|FIXME|HACK)` comments", text)):
        write(sorted(f"{p[4:]}:{i}" for p, t in app.items() if p.startswith("src/") for i, line in enumerate(t.splitlines(), 1) if f" {marker.group(1)}:" in line))
    elif "INI file" in text and (m := re.search(r"Change the value of `(\w+)` in the `\[(\w+)\]` section to (\d+)", text)):
        lines, section = app[inputs[0]].splitlines(), None
        for i, line in enumerate(lines):
            section = line[1:-1] if line.startswith("[") else section
            lines[i] = f"{m.group(1)} = {m.group(3)}" if section == m.group(2) and line.startswith(m.group(1) + " =") else line
        app[inputs[0]] = "\n".join(lines) + "\n"
    elif "a comment starts with `#`" in text:
        app[inputs[0]] = "\n".join(line for line in src.splitlines() if line.strip() and not line.strip().startswith("#")) + "\n"
    elif "is a CSV file" in text and (col := re.search(r"sum of `(\w+)`", text)):
        write([f"{sum(float(r[col.group(1)]) for r in csv.DictReader(io.StringIO(src))):.2f}"])
    elif "`name`, `city`, `age`, `score`" in text and (m := re.search(r"whose city is `(\w+)` and whose (age|score) is at least (\d+)", text)):
        rows = list(csv.reader(io.StringIO(src)))
        write([",".join(rows[0])] + [",".join(r) for r in rows[1:] if r[1] == m.group(1) and int(r[rows[0].index(m.group(2))]) >= int(m.group(3))])
    elif "JSON array of events" in text and (field := re.search(r"has an `id`, a `(\w+)`", text)):
        app[out] = json.dumps(collections.Counter(e[field.group(1)] for e in json.loads(src)))
    elif "JSON configuration files" in text:
        merged, later = (json.loads(app[x]) for x in inputs[:2])
        for k, v in later.items():
            merged.setdefault(k, {}).update(v)
        app[out] = json.dumps(merged)
    elif "one user per line" in text:
        users = [json.loads(line) for line in src.splitlines()]
        write(sorted(u["name"] for u in users if u["active"] and u["logins"] >= number(r"with at least (\w+) logins")))
    elif "/app/inbox" in text:
        for p in [p for p in app if p.startswith("inbox/") and "." in p]:
            app[f"inbox/{p.rsplit('.', 1)[1]}/{p[6:]}"] = app.pop(p)
    elif "/app/files" in text and "lower case" in text:
        for p in [p for p in app if p.startswith("files/")]:
            app[p.lower()] = app.pop(p)
    elif "/app/work" in text and "empty" in text:
        for p in [p for p in app if p.startswith("work/") and not app[p]]:
            del app[p]


def test_a_program_that_parses_instructions_by_pattern_solves_almost_no_hidden_item(tmp_path: Path) -> None:
    """300 items of a test split drawn from a seed the solver never sees (fixed here so the test is deterministic; the
    solver was not tuned to it): the solver gets what a harness gets (the instruction and the files of /app) and the
    public module; at most 5 % of its outputs pass (about 3 % on average over other seeds)."""
    seed = 0x6F3A91C2
    items = get_suite("terminal").generate({}, seed, 300, split="test")
    solved = [it.entry["family"] for n, it in enumerate(items) if solves(generate(it.entry["family"], it.entry["instance"]), tmp_path / str(n))]
    assert len(solved) <= 0.05 * len(items), (seed, collections.Counter(solved))
    # a real attempt: on the wording it was written for, it does solve the task
    for family in ("dedupe-lines", "remove-empty-entries", "organize-by-extension"):
        assert any(solves(generate(family, instance), tmp_path / f"{family}-{instance}") for instance in range(100)), family


def solves(g: Generated, root: Path) -> bool:
    app = dict(g.files)
    try:
        pattern_solver(g.instruction, app)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError):
        return False
    return accepts(g.spec(), write_app(root, app))
