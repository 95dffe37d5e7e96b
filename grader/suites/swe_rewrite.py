"""The ``swe`` suite's rewrite: each project renamed by a split's seed, so that its public release is no answer key.

A task's repository is a published project with one bug in it; were it the published text, the project's release (its
source distribution on the package registry) would fit it file for file, and a harness that copies the released library
over ``/app``, or that tries the mutation operators' reversals on the public source, would resolve every item with no
model. So each split sees each project through a rewrite ``R(seed)``: a deterministic, semantics-preserving function of
the project's files, drawn from the split's seed (the hidden split's from the grader's secret), applied alike to the
base repository (the bug in), the tests, the gold patch and the issue text:

- **Names.** Every identifier that the library binds (functions, classes, methods, parameters, attributes it assigns,
  module-level names), its module files and its top-level package get seeded names, wherever they are written in the
  project (code, strings, comments, documents: one word map over every text file, so ``__all__``, ``getattr`` strings
  and expected reprs follow). An identifier written anywhere in the standard library or the tests' runner (pytest) is
  kept, since it may name something outside the project (``dict.get``), as are one the code builds by gluing strings
  (``"bump_" + part``), builtins, dunders and names starting with ``test``; ``_part`` and ``part`` are renamed
  together (:func:`_analysis`).
- **Locals.** A function's local variables (bound in its own scope, not parameters, not declared ``global`` or
  ``nonlocal``) get seeded names of their own, spliced at their ``ast`` positions; a file whose rewritten syntax tree
  is not the original's with those names replaced keeps its locals.

The name map is computed from the original project and the seed, never from a mutant, so ``R`` commutes with a
mutation: the base is ``R(mutated tree)``, the fixed tree ``R(original tree)``, the gold patch the diff between them,
and a bug's ``FAIL_TO_PASS``/``PASS_TO_PASS`` ids are mapped by the same words. That ``R`` preserves the project's
behaviour is checked, not assumed: :meth:`Rewrite.tree` runs the project's tests on ``R(original)`` once per project
and seed and compares every outcome with the original's (:func:`~grader.suites.swe_mutants.baseline`, ids mapped); a
rewrite that changes one is refused and the next variant of the seed tried. What a rewrite does not hide: the code's
structure. A program that aligns ``/app`` with the release modulo names (an AST diff up to renaming) still finds the
mutated expression; :data:`~grader.suites.swe_mutants.PROJECTS` are public projects, and an operator wanting bugs no
code can locate imports a private set (``crucible admin import-tasks``).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import json
import keyword
import os
import random
import re
import shutil
import sysconfig
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from grader.suites import swe_mutants
from grader.suites.swe_mutants import SWE_DIR, Project

STAMP = hashlib.sha256(Path(__file__).read_bytes() + Path(__file__).with_name("swe_external_words.txt").read_bytes()
                       + swe_mutants.STAMP.encode()).hexdigest()[:16]
"""This module's version: a rewritten tree or verdict of another version is not reused."""
VARIANTS = 4
"""Variants of a seed tried, in turn, when a rewrite changes a test's outcome."""
_WORD = re.compile(r"(?<![\w])[^\W\d]\w*")
_AUTO_ID = re.compile(r"([^\W\d]\w*?)(\d+)")
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def key(project: Project, seed: int | str, variant: int = 0) -> str:
    """The rewrite key of ``project`` under a split's ``seed`` (its ``variant``-th fallback): 16 hex digits."""
    return hashlib.sha256(f"swe-rewrite:{seed}:{project.name}:{variant}".encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- what may be renamed


EXTERNAL_WORDS = Path(__file__).with_name("swe_external_words.txt")
"""The words a project's names may share with code outside it (:func:`external_words`), written once into the
repository: read from a file, not from this machine's Python, so that a seed renames alike on every machine (a host's
and a container's system packages differ, and with them a scan's words)."""


@cache
def _external() -> frozenset[str]:
    """:data:`EXTERNAL_WORDS`: the identifiers (their ``_``-stripped form) written both in some pinned project's
    sources and in the standard library's, the system's packages' or the tests' runner's, with builtins and keywords:
    such a name may name something outside the project, so it is never renamed."""
    return frozenset(EXTERNAL_WORDS.read_text(encoding="utf-8").split())


def external_words() -> list[str]:
    """What :data:`EXTERNAL_WORDS` holds, scanned on this machine (``python -m grader.suites.swe_rewrite``, after a
    pinned project or the runner changes): every word of the standard library's, the system packages' and the runner's
    sources (a vendored copy of a project left out), builtins and keywords, ``_``-stripped, that some pinned project's
    sources also write."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path("/usr/lib/python3") / "dist-packages", SWE_DIR / "env"]
    vendored = {Path(p.package).name for p in swe_mutants.PROJECTS.values()}  # setuptools' copy of more_itertools is the project
    pattern = re.compile(r"[A-Za-z_]\w*")
    outside: set[str] = set(dir(builtins)) | set(keyword.kwlist) | set(keyword.softkwlist)
    for root in roots:
        for path in root.rglob("*.py") if root.is_dir() else ():
            if not {"site-packages", *vendored} & set(path.relative_to(root).parts):
                outside.update(pattern.findall(path.read_text(errors="replace")))
    inside = {w for p in swe_mutants.PROJECTS.values() for f in p.repo.rglob("*.py") for w in pattern.findall(f.read_text(errors="replace"))}
    return sorted({w.strip("_") for w in outside} & {w.strip("_") for w in inside} - {""})


def _library(project: Project) -> list[str]:
    """The library's ``.py`` files (relative paths), tests included in the package folder left out."""
    root = project.repo
    return sorted(str(p.relative_to(root)) for p in (root / project.package).rglob("*.py")
                  if not ({"tests", "test"} & set(p.relative_to(root).parts)) and not p.name.startswith("test_") and p.name != "conftest.py")


def _glued(tree: ast.AST) -> set[str]:
    """Patterns (``bump_*``, ``*_part``) of the words a module builds by gluing a string to a value (``"bump_" + part``,
    ``f"bump_{part}"``, ``"%s_part" % x``): such a word is written nowhere whole, so it is never renamed."""
    out: set[str] = set()

    def fragments(node: ast.AST) -> Iterator[tuple[str, str]]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                yield node.left.value, "prefix"
                if isinstance(node.op, ast.Mod):
                    yield node.left.value, "suffix"
            if isinstance(node.right, ast.Constant) and isinstance(node.right.value, str) and isinstance(node.op, ast.Add):
                yield node.right.value, "suffix"
        elif isinstance(node, ast.JoinedStr):
            for part in node.values:
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    yield part.value, "prefix"
                    yield part.value, "suffix"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
              and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
            for piece in re.split(r"\{[^}]*\}", node.func.value.value):
                yield piece, "prefix"
                yield piece, "suffix"

    for node in ast.walk(tree):
        for text, kind in fragments(node):
            if kind == "prefix" and (m := re.search(r"[A-Za-z_]\w*$", text.split("%")[0] if "%" in text else text)):
                out.add(m.group() + "*")
            if kind == "suffix" and (m := re.match(r"\w+", text.split("%s")[-1] if "%" in text else text)):
                out.add("*" + m.group())
    return out


def _bound(tree: ast.AST) -> tuple[set[str], set[str]]:
    """``(names the module binds, names it imports from outside)``."""
    bound: set[str] = set()
    outside: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            bound.add(node.attr)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                outside.update(alias.name.split("."))
                if alias.asname:
                    outside.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            outside.update((node.module or "").split("."))
            outside.update(a.name for a in node.names)
            outside.update(a.asname for a in node.names if a.asname)
    return bound, outside


def _renamable(name: str) -> bool:
    core = name.strip("_")
    return len(core) >= 3 and not (name.startswith("__") and name.endswith("__")) and not core.lower().startswith("test") and name.isidentifier()


_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


def _fresh(rng: random.Random, like: str, taken: set[str]) -> str:
    """A new identifier in ``like``'s style (leading underscores, UPPER, Capitalized or snake_case), not in ``taken``."""
    lead = len(like) - len(like.lstrip("_"))
    trail = len(like) - len(like.rstrip("_"))
    core = like.strip("_")
    while True:
        count = min(core.count("_") + 1, 3) if "_" in core else 1 + rng.randint(0, 1)
        words = ["".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3))) for _ in range(count)]
        if core.isupper() and len(core) > 1:
            new = "_".join(words).upper()
        elif core[:1].isupper():
            new = "".join(w.capitalize() for w in words)
        else:
            new = "_".join(words)
        new = "_" * lead + new + "_" * trail
        if new not in taken and not new.lower().startswith("test") and not keyword.iskeyword(new):
            taken.add(new)
            return new


# --------------------------------------------------------------------------- locals


_DYNAMIC = frozenset({"locals", "vars", "eval", "exec", "globals", "_getframe", "f_locals", "currentframe"})


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(key, function)`` for the module's functions and its classes' methods; a key is the qualified name and its
    occurrence (a property's getter and setter share a name)."""
    seen: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pairs = [(node.name, node)]
        elif isinstance(node, ast.ClassDef):
            pairs = [(f"{node.name}.{n.name}", n) for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        else:
            continue
        for name, fn in pairs:
            seen[name] = seen.get(name, -1) + 1
            yield f"{name}#{seen[name]}", fn


def _own_stores(fn: ast.AST) -> set[str]:
    """Names stored by ``fn``'s own scope (not by nested functions, lambdas or comprehensions)."""
    out: set[str] = set()
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return out


def _locals(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The local variables of ``fn`` safe to rename everywhere in it (module docstring); none where the function reads
    its frame, declares globals or holds a class or a ``match``."""
    excluded: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.ClassDef, ast.Match)):
            return set()
        if (isinstance(node, ast.Name) and node.id in _DYNAMIC) or (isinstance(node, ast.Attribute) and node.attr in _DYNAMIC):
            return set()
        if isinstance(node, ast.arg):
            excluded.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            excluded.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            excluded.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            excluded.add(node.name)
    return {n for n in _own_stores(fn) - excluded if not n.startswith("__") and n.isidentifier()}


def _rename_locals(source: str, renames: dict[str, dict[str, str]]) -> str:
    """``source`` with each function's locals renamed (``{function key: {old: new}}``), spliced at the Name nodes'
    positions."""
    tree = swe_mutants.parse(source)
    text = swe_mutants._Source(source)
    edits: list[tuple[int, int, str]] = []
    for fkey, fn in _functions(tree):
        names = renames.get(fkey)
        if not names:
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Name) and node.id in names:
                start = text.offset(node.lineno, node.col_offset)
                edits.append((start, text.offset(node.end_lineno, node.end_col_offset), names[node.id]))  # type: ignore[arg-type]
    out = source
    for start, end, new in sorted(set(edits), reverse=True):
        out = out[:start] + new + out[end:]
    return out


def _renamed_tree(tree: ast.Module, renames: dict[str, dict[str, str]]) -> ast.Module:
    """``tree`` with each function's locals renamed in place (what :func:`_rename_locals` must give, parsed)."""
    for fkey, fn in _functions(tree):
        for sub in ast.walk(fn):
            if isinstance(sub, ast.Name) and sub.id in renames.get(fkey, {}):
                sub.id = renames[fkey][sub.id]
    return tree


# --------------------------------------------------------------------------- the rewrite


@dataclass(frozen=True)
class Rewrite:
    """``R(seed)`` of one project (module docstring). Paths are relative to the repository; ``names`` maps a word of the
    original project to its new spelling, ``local_names`` ``{library file: {function key: {old: new}}}``."""

    project: Project
    key: str
    names: dict[str, str]
    local_names: dict[str, dict[str, dict[str, str]]]

    def words(self, text: str) -> str:
        """``text`` with every word of the map renamed (prose, a test id's tail, a dotted module name)."""
        return _WORD.sub(lambda m: self.names.get(m.group(), m.group()), text) if self.names else text

    def path(self, rel: str) -> str:
        """The rewritten path of the original file or folder ``rel`` (a module file or package folder renamed)."""
        if rel in (".", ""):
            return rel
        parts = []
        for part in rel.split("/"):
            stem, dot, ext = part.partition(".")
            parts.append(self.names.get(stem, stem) + dot + ext)
        return "/".join(parts)

    def test_id(self, test_id: str) -> str:
        """A pytest id ``file::Class::name[params]`` of the original tests as the rewritten tests spell it."""
        file, sep, rest = test_id.partition("::")
        name, bracket, params = rest.partition("[")
        if not bracket or not params.endswith("]"):
            return self.path(file) + sep + self.words(rest)
        return self.path(file) + sep + self.words(name) + "[" + "-".join(map(self._param, params[:-1].split("-"))) + "]"

    def _param(self, piece: str) -> str:
        """One part of a parametrized id: a value's text, or pytest's ``argname`` + index (``ver0``), whose argname is
        the word renamed."""
        if auto := _AUTO_ID.fullmatch(piece):
            return self.names.get(auto[1], auto[1]) + auto[2]
        return self.words(piece)

    def text(self, rel: str, source: str) -> str:
        """The rewritten text of the file ``rel`` (original path) whose content is ``source`` (the original's, or a
        mutant's: the map does not depend on it)."""
        if rel in self.local_names:
            source = _rename_locals(source, self.local_names[rel])
        return self.words(source)

    @property
    def spec(self) -> Project:
        """The project as the rewritten tree lays it out (its package folder and tests' glob renamed)."""
        return replace(self.project, package=self.path(self.project.package), tests=self.path(self.project.tests))

    @property
    def folder(self) -> Path:
        return SWE_DIR / "rewritten" / STAMP / f"{self.project.name}-{self.key}"

    def write(self, dest: Path) -> None:
        """Write ``R(original tree)`` into the new folder ``dest``."""
        root = self.project.repo
        for path in sorted(root.rglob("*")):
            rel = str(path.relative_to(root))
            if not path.is_file() or path.is_symlink() or "__pycache__" in path.parts or path.name == ".prepared" or path.suffix == ".pyc":
                continue
            target = dest / self.path(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = path.read_bytes()
            try:
                target.write_text(self.text(rel, data.decode()), encoding="utf-8")
            except UnicodeDecodeError:
                target.write_bytes(data)
            shutil.copymode(path, target)

    def outcomes_hold(self, tree: Path) -> bool:
        """Whether the project's tests, run on the rewritten ``tree``, have every outcome they have on the original
        (:func:`~grader.suites.swe_mutants.baseline`, ids mapped), tests whose outcome may depend on the machine's speed
        (:func:`~grader.suites.swe_mutants.load_sensitive_tests`) left out."""
        before: dict[str, str] = {}
        for file, outcomes in swe_mutants.baseline(self.project).items():
            sensitive = swe_mutants.load_sensitive_tests((self.project.repo / file).read_text(errors="replace"))
            if sensitive is None:
                continue
            before |= {self.test_id(t): o for t, o in outcomes.items() if t.split("[")[0].split("::", 1)[1] not in sensitive}
        spec = self.spec
        ran = swe_mutants._run_tests(tree, spec, [str(p.relative_to(tree)) for p in sorted(tree.glob(spec.tests))], cpu_s=None)
        return ran.ended == "reported" and all(ran.outcomes.get(t) == o for t, o in before.items())

    def tree(self) -> Path:
        """``R(original tree)``, written and checked (:meth:`outcomes_hold`) once per version of this module, under
        ``SWE_DIR/rewritten`` (the verdict recorded once: :func:`~grader.suites.swe_mutants.write_once`). Raises
        ``RuntimeError`` when it changes a test's outcome, :class:`~grader.suites.swe_mutants.CouldNotVerify` when the
        tests cannot be run to a report."""
        folder = self.folder
        verdict = folder.with_name(folder.name + ".json")
        with _lock(folder.name):
            if not verdict.is_file() or (json.loads(verdict.read_text())["ok"] and not folder.is_dir()):
                tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                self.write(tmp)
                ok = swe_mutants.write_once(verdict, {"ok": self.outcomes_hold(tmp)})["ok"]
                if ok and not folder.is_dir():
                    with contextlib.suppress(OSError):  # another process put its tree there first
                        tmp.replace(folder)
                shutil.rmtree(tmp, ignore_errors=True)
            if not json.loads(verdict.read_text())["ok"]:
                raise RuntimeError(f"the rewrite {self.key} of {self.project.name} changes its tests' outcomes")
        return folder


def _lock(name: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(name, threading.Lock())


@cache
def _analysis(project: Project) -> tuple[tuple[str, ...], dict[str, dict[str, tuple[str, ...]]], frozenset[str]]:
    """``(global words to rename, {library file: {function key: its locals}}, every word of the project)``, from the
    original project alone. A word is renamed with its *core* (the word without leading and trailing underscores), so
    ``_part`` and ``part`` stay one name apart (code derives one from the other: ``name[1:] for name in __slots__``):
    a core is renamed when the library binds a word of it and no word of it may name something outside the project."""
    root = project.repo
    words: set[str] = set()
    for path in root.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".rst", ".md", ".txt", ".cfg", ".toml", ".ini", ""):
            words.update(re.findall(r"[A-Za-z_]\w*", path.read_text(errors="replace")))
    bound: set[str] = set()
    outside: set[str] = set()
    local_names: dict[str, dict[str, tuple[str, ...]]] = {}
    for rel in _library(project):
        source = (root / rel).read_text(encoding="utf-8")
        tree = swe_mutants.parse(source)
        b, o = _bound(tree)
        bound |= b
        outside |= o
        local_names[rel] = {fkey: tuple(sorted(names)) for fkey, fn in _functions(tree) if (names := _locals(fn))}
    glued: set[str] = set()
    for path in [*(root / rel for rel in _library(project)), *(root / rel for rel in map(str, project.test_files()))]:
        glued |= _glued(swe_mutants.parse(path.read_text(encoding="utf-8")))
    prefixes = tuple(g[:-1] for g in glued if g.endswith("*") and len(g) > 2)
    suffixes = tuple(g[1:] for g in glued if g.startswith("*") and len(g) > 2)
    modules = {Path(rel).stem for rel in _library(project)} - {"__init__"}
    blocked = {w.strip("_") for w in _external() | outside}
    for w in words | bound:  # the value glued to a fragment is kept with the word: "_calc_" + name finds _calc_<name>
        blocked |= {w[len(p):].strip("_") for p in prefixes if w.startswith(p)} | {w[:-len(x)].strip("_") for x in suffixes if w.endswith(x)}
    cores = {n.strip("_") for n in bound | modules if _renamable(n) and not n.startswith(prefixes) and not n.endswith(suffixes)} - blocked
    cores |= {part for part in Path(project.package).parts if part != "src"}
    renamed = {w for w in words | bound | modules if w.strip("_") in cores and not (w.startswith("__") and w.endswith("__"))}
    return tuple(sorted(renamed)), local_names, frozenset(words)


def rewrite(project: Project, seed: int | str, variant: int = 0) -> Rewrite:
    """``R(seed)`` of ``project`` (its ``variant``-th fallback), unchecked: :func:`checked` is the one a split uses."""
    return from_key(project, key(project, seed, variant))


@cache
def from_key(project: Project, k: str) -> Rewrite:
    """The rewrite of ``project`` whose key is ``k`` (:func:`key`): what a task's entry records, so that its folder can
    be written again without the seed. Computed once per version of this module (kept beside its tree)."""
    cached = SWE_DIR / "rewritten" / STAMP / f"{project.name}-{k}.map.json"
    if cached.is_file():
        data = json.loads(cached.read_text())
        return Rewrite(project, k, data["names"], data["local_names"])
    renamed, local_sets, words = _analysis(project)
    rng = random.Random(k)
    taken = set(words) | set(_external())
    cores = {core: _fresh(rng, core, taken) for core in sorted({w.strip("_") for w in renamed})}
    names = {w: w[:len(w) - len(w.lstrip("_"))] + cores[w.strip("_")] + w[len(w.rstrip("_")):] for w in renamed}
    local_names: dict[str, dict[str, dict[str, str]]] = {}
    for rel, functions in sorted(local_sets.items()):
        renames = {fkey: {old: _fresh(rng, old, taken) for old in olds if old not in names} for fkey, olds in sorted(functions.items())}
        renames = {f: r for f, r in renames.items() if r}
        source = (project.repo / rel).read_text(encoding="utf-8")
        expected = ast.dump(_renamed_tree(swe_mutants.parse(source), renames))
        try:
            ok = ast.dump(swe_mutants.parse(_rename_locals(source, renames))) == expected
        except SyntaxError:
            ok = False
        if ok and renames:
            local_names[rel] = renames
    swe_mutants.write_once(cached, {"names": names, "local_names": local_names})
    return Rewrite(project, k, names, local_names)


def checked(project: Project, seed: int | str) -> Rewrite:
    """The first variant of ``R(seed)`` of ``project`` that keeps every outcome of its tests (:meth:`Rewrite.tree`,
    cached); ``RuntimeError`` when none of :data:`VARIANTS` does."""
    for variant in range(VARIANTS):
        candidate = rewrite(project, seed, variant)
        try:
            candidate.tree()
        except RuntimeError:
            continue
        return candidate
    raise RuntimeError(f"no rewrite of {project.name} for this seed keeps its tests' outcomes")


if __name__ == "__main__":  # python -m grader.suites.swe_rewrite: write EXTERNAL_WORDS again
    EXTERNAL_WORDS.write_text("\n".join(external_words()) + "\n", encoding="utf-8")


__all__ = ["EXTERNAL_WORDS", "STAMP", "Rewrite", "checked", "external_words", "from_key", "key", "rewrite"]
