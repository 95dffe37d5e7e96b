"""How a generated task's instruction is worded: composed from parts drawn from the instance's seed, so two instances
of one family rarely share a sentence, and a program that parses one wording misreads the others.

Every choice is the instance's ``random.Random``: which template each sentence takes, synonyms, whether a number is
written in digits or words, the order of the requirements, whether a threshold is stated as "at least 30" or "more
than 29", and whether the requirements are in the instruction (prose or a list) or in a note under ``/app`` that the
instruction points to. The meaning is the same for every wording; only its surface changes.
"""

from __future__ import annotations

import random
from typing import Literal

Task = tuple[dict[str, str], str, str, str, Literal["lines", "set", "json", "tree"]]
"""What a family draws: the files of ``/app`` (path → text; a note may be added), the instruction, the output path
under ``/app``, the expected content and how it is compared (:class:`~grader.suites.terminal_families.Generated`)."""

_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "thirteen",
         "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
NOTE_NAMES = ("TASK.md", "REQUEST.txt", "ticket.txt", "README.md", "notes/request.md", "todo/next.md")


def in_words(n: int) -> str:
    """``n`` (0 ≤ n < 10,000) in English words: ``47`` → ``forty-seven``, ``305`` → ``three hundred and five``."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("-" + _ONES[n % 10] if n % 10 else "")
    if n < 1000:
        return _ONES[n // 100] + " hundred" + (" and " + in_words(n % 100) if n % 100 else "")
    return in_words(n // 1000) + " thousand" + ((" and " if n % 1000 < 100 else " ") + in_words(n % 1000) if n % 1000 else "")


class Prose:
    """The wording choices of one instance, all drawn from its ``rng``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, *options: str) -> str:
        """One of ``options``."""
        return self.rng.choice(options)

    def num(self, n: int) -> str:
        """``n`` in digits or (about two times in five, below 10,000) in words."""
        return in_words(n) if 0 <= n < 10_000 and self.rng.random() < 0.4 else str(n)

    def path(self, rel: str) -> str:
        """A file under ``/app`` named one of several ways (``/app/x.txt`` in backticks or not, or ``x.txt`` in /app)."""
        return self.pick(f"`/app/{rel}`", f"/app/{rel}", f"`{rel}` (in `/app`)", f"the file `{rel}` under /app")

    def at_least(self, n: int) -> str:
        """A phrase for "≥ n" (n an integer)."""
        w = self.num(n)
        return self.pick(f"at least {w}", f"{w} or more", f"no less than {w}", f"more than {self.num(n - 1)}")

    def more_than(self, n: int) -> str:
        """A phrase for "> n" (n an integer)."""
        return self.pick(f"more than {self.num(n)}", f"above {self.num(n)}", f"greater than {self.num(n)}", f"at least {self.num(n + 1)}")

    def below(self, n: int) -> str:
        """A phrase for "< n" (n an integer)."""
        return self.pick(f"below {self.num(n)}", f"under {self.num(n)}", f"less than {self.num(n)}", f"at most {self.num(n - 1)}")

    def ordinal(self, i: int) -> str:
        """The ``i``-th (1-based) as a word: ``first``, ``second``…"""
        return ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")[i - 1]

    def output(self, rel: str) -> str:
        """A sentence saying the result goes to ``/app/<rel>``."""
        path = self.path(rel)
        return self.pick(f"Write the result to {path}.", f"Save it as {path}.", f"Put the answer in {path}.",
                         f"{path[0].upper()}{path[1:]} must hold the result.", f"Store your answer in a new file, {path}.",
                         f"The output goes to {path}.")

    def listing(self) -> tuple[str, str]:
        """How a list is written: (a sentence saying it, the style for :func:`render`): one entry per line (half the
        time), on one line separated by ", ", or as a JSON array of strings."""
        style = self.rng.choice(["lines", "lines", "comma", "json"])
        return {"lines": self.one_per_line(),
                "comma": self.pick("Write them on a single line, separated by a comma and a space.", "Put them all on one line, joined by `, `."),
                "json": self.pick("Write them as a JSON array of strings.", "The file holds a JSON list of the entries (strings).")}[style], style

    def one_per_line(self) -> str:
        """A sentence: one entry per line."""
        return self.pick("One entry per line.", "Put each entry on its own line.", "Use one line per entry.",
                         "Write one item per line, nothing else.")


def compose(p: Prose, files: dict[str, str], intro: list[str], asks: list[str]) -> str:
    """The instruction: ``intro`` (what the inputs are) and ``asks`` (what to do, in a drawn order), written as prose, as a
    list, or moved into a note file added to ``files`` (the instruction then only points to it)."""
    asks = list(asks)
    p.rng.shuffle(asks)
    opening = p.pick("", "", "You are working in `/app`. ", "A colleague needs a hand with some files. ", "Everything you need is in /app. ")
    style = p.rng.random()
    if style < 0.3:
        note = next(n for n in p.rng.sample(NOTE_NAMES, len(NOTE_NAMES)) if n not in files)
        files[note] = " ".join(intro) + "\n\n" + "\n".join(f"- {a}" for a in asks) + "\n"
        return opening + p.pick(f"Do what `/app/{note}` asks.", f"The request is written in `/app/{note}`; carry it out.",
                                f"Read /app/{note} and follow it.", f"Your instructions are in the file {note} (under /app).")
    if style < 0.6:
        return opening + " ".join(intro) + "\n\n" + "\n".join(f"- {a}" for a in asks)
    return opening + " ".join(intro + asks)


WORDS = ("alpha", "bravo", "cargo", "delta", "ember", "fable", "gamma", "harbor", "ivory", "jolly", "kayak", "lemon", "mango",
         "noble", "orbit", "pixel", "quartz", "raven", "solar", "tango", "umber", "vivid", "walnut", "xenon", "yodel", "zephyr")
"""Plain lowercase words, none inside another."""


def token(rng: random.Random, k: int = 6) -> str:
    """``k`` random lowercase letters (a file's stem)."""
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=k))


def output_name(rng: random.Random, stems: tuple[str, ...], ext: str) -> str:
    """An output file's name: one of ``stems`` (or a generic one) with ``ext``."""
    return rng.choice((*stems, "result", "answer", "output", "report")) + ext


def cap(s: str) -> str:
    """``s`` with its first letter in upper case (the rest untouched, unlike ``str.capitalize``)."""
    return s[:1].upper() + s[1:]


def render(entries: list[str], style: str) -> tuple[str, str]:
    """``entries`` written in a :meth:`Prose.listing` ``style``: (the expected text, how it is compared)."""
    if style == "json":
        import json

        return json.dumps(entries), "json"
    return ("\n" if style == "lines" else ", ").join(entries), "lines"
