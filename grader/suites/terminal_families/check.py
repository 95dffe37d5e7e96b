"""A generated task's check, run by its verifier as ``python3 -I -B /tests/check.py`` (standard library only): compare
what the agent left in /app with /tests/expected.json, read as root; nothing of the agent's runs, and a link in place of
an output is refused. Importable too (:func:`accepts`), for checks in-process."""

import json
import os
import sys

_MAX_BYTES = 4 << 20


def _read(path):
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > _MAX_BYTES:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _tree(root):
    """The regular files under ``root`` (relative path → text), or None if it holds a link, something else or unreadable text."""
    if os.path.islink(root) or not os.path.isdir(root):
        return None
    out = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            full = os.path.join(folder, name)
            if os.path.islink(full):
                return None
            if name in names:
                text = _read(full)
                if text is None:
                    return None
                out[os.path.relpath(full, root)] = text
    return out


def _lines(text):
    return [line.rstrip() for line in text.strip().splitlines()]


def accepts(spec, app):
    """Whether the folder ``app`` holds what ``spec`` (``{output, expected, compare}``) asks: ``lines`` (same lines in
    order, trailing white space ignored), ``set`` (same lines in any order), ``json`` (equal JSON values), ``tree``
    (``output`` is a folder whose files are exactly ``expected``, a JSON object path → text)."""
    path = os.path.join(app, spec["output"])
    if spec["compare"] == "tree":
        return _tree(path) == json.loads(spec["expected"])
    got = _read(path)
    if got is None:
        return False
    if spec["compare"] == "json":
        try:
            return json.loads(got) == json.loads(spec["expected"])
        except ValueError:
            return False
    if spec["compare"] == "set":
        return sorted(_lines(got)) == sorted(_lines(spec["expected"]))
    return _lines(got) == _lines(spec["expected"])


if __name__ == "__main__":
    with open("/tests/expected.json") as f:
        sys.exit(0 if accepts(json.load(f), "/app") else 1)
