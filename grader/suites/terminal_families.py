"""The terminal suite's generated tasks: families whose instruction is always the same kind and whose files and
expected result are drawn from a seed, so a test split exists only in the grader that holds the seed.

A family (:data:`FAMILIES`) is a function ``rng -> Generated``: the files of ``/app`` (relative path → text), the
instruction, the output file the agent must write (a path under ``/app``) and the expected content, compared as
``lines`` (the lines, trailing whitespace ignored, in order), ``set`` (the lines in any order) or ``json`` (equal JSON
values). The verifier reads the output as root and never runs the agent's code, so nothing of the agent's can change
its verdict. The families are kinds of the shipped tasks (``terminal_tasks/``: logs, CSV, JSON, text), which stay the
public material; an instance is ``<family>-<10 hex digits of its seed>``.
"""

from __future__ import annotations

import json
import random
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Compare = Literal["lines", "set", "json"]


@dataclass(frozen=True)
class Generated:
    """One generated task: ``files`` (path under ``/app`` → text), ``instruction``, the ``output`` path the agent
    writes (relative to ``/app``), its ``expected`` content and how it is compared (``compare``)."""

    files: dict[str, str]
    instruction: str
    output: str
    expected: str
    compare: Compare = "lines"


WORDS = ("alpha", "bravo", "cargo", "delta", "ember", "fable", "gamma", "harbor", "ivory", "jolly", "kayak", "lemon", "mango",
         "noble", "orbit", "pixel", "quartz", "raven", "solar", "tango", "umber", "vivid", "walnut", "xenon", "yodel", "zephyr")


def _name(rng: random.Random, k: int = 6) -> str:
    return "".join(rng.choices(string.ascii_lowercase, k=k))


def count_log_errors(rng: random.Random) -> Generated:
    level = rng.choice(["ERROR", "WARN", "DEBUG"])
    lines, count = [], 0
    for i in range(rng.randint(40, 120)):
        lvl = rng.choices(["INFO", "ERROR", "WARN", "DEBUG"], weights=[6, 2, 2, 1])[0]
        message = rng.choice(["request served", "cache miss", f"{level.lower()} budget checked", "retrying upstream", "user logged in"])
        lines.append(f"2024-05-{1 + i // 50:02d} {8 + i % 12:02d}:{i % 60:02d}:00 [{lvl}] {message}")
        count += lvl == level
    log = f"{_name(rng)}.log"
    return Generated({log: "\n".join(lines) + "\n"},
                     f"`/app/{log}` is an application log; each line looks like `2024-05-01 08:00:00 [INFO] request served`, the word in "
                     f"square brackets being the log level. Count the lines whose level is `{level}` (a line that merely mentions "
                     f"\"{level.lower()}\" in its message does not count) and write just that number to `/app/count.txt`.",
                     "count.txt", str(count))


def csv_column_sum(rng: random.Random) -> Generated:
    columns = rng.sample(["price", "qty", "weight", "cost", "tax", "score"], 3)
    target = rng.choice(columns)
    rows, total = [], 0.0
    for _ in range(rng.randint(8, 30)):
        values = {c: round(rng.uniform(-50, 500), rng.choice([0, 1, 2])) for c in columns}
        total += values[target]
        label = rng.choice(WORDS) + (", large" if rng.random() < 0.3 else "")
        rows.append(",".join([f'"{label}"', *(f"{values[c]:g}" for c in columns)]))
    data = f"{_name(rng)}.csv"
    return Generated({data: "name," + ",".join(columns) + "\n" + "\n".join(rows) + "\n"},
                     f"`/app/{data}` is a CSV file with a header line; names may be quoted and contain commas. Write the sum of its "
                     f"column `{target}`, rounded to exactly two decimals (for example `12.50`), to `/app/sum.txt`.",
                     "sum.txt", f"{total:.2f}")


def dedupe_lines(rng: random.Random) -> Generated:
    pool = [f"{rng.choice(WORDS)}-{rng.randint(1, 40)}" for _ in range(rng.randint(8, 20))]
    lines = [rng.choice(pool) for _ in range(rng.randint(20, 60))]
    unique = list(dict.fromkeys(lines))
    data = f"{_name(rng)}.txt"
    return Generated({data: "\n".join(lines) + "\n"},
                     f"`/app/{data}` holds one entry per line, some repeated. Write `/app/unique.txt` holding each distinct line once, "
                     "in the order of its first appearance.", "unique.txt", "\n".join(unique))


def extract_emails(rng: random.Random) -> Generated:
    emails = {f"{rng.choice(WORDS)}.{_name(rng, 3)}@{rng.choice(WORDS)}.{rng.choice(['com', 'org', 'net'])}" for _ in range(rng.randint(4, 10))}
    text = []
    for email in sorted(emails):
        for _ in range(rng.randint(1, 3)):
            text.append(f"{rng.choice(WORDS).title()} wrote from <{email}> about the {rng.choice(WORDS)} release.")
    text += [f"No address on this line about {rng.choice(WORDS)} @ noon." for _ in range(rng.randint(2, 6))]
    rng.shuffle(text)
    data = f"{_name(rng)}.txt"
    return Generated({data: "\n".join(text) + "\n"},
                     f"Find every email address in `/app/{data}` and write them to `/app/emails.txt`, one per line, each once, sorted.",
                     "emails.txt", "\n".join(sorted(emails)))


def word_frequency(rng: random.Random) -> Generated:
    vocabulary = rng.sample(WORDS, 10)
    weights = rng.sample(range(1, 40), 10)  # distinct: no tie in the top
    words = [w for w, n in zip(vocabulary, weights, strict=True) for _ in range(n)]
    rng.shuffle(words)
    text = "\n".join(" ".join(words[i:i + rng.randint(5, 12)]).capitalize() + "." for i in range(0, len(words), 8))
    top = rng.randint(2, 5)
    counts = Counter(w.strip(".").lower() for w in text.split())
    best = [f"{w} {n}" for w, n in counts.most_common(top)]
    data = f"{_name(rng)}.txt"
    return Generated({data: text + "\n"},
                     f"Count the words of `/app/{data}` (case-insensitive, punctuation stripped) and write the {top} most frequent to "
                     "`/app/top.txt`, one per line as `word count`, the most frequent first.", "top.txt", "\n".join(best))


def json_count_by_type(rng: random.Random) -> Generated:
    kinds = rng.sample(["click", "view", "purchase", "signup", "refund", "share"], rng.randint(2, 5))
    events = [{"id": i, "type": rng.choice(kinds), "user": rng.choice(WORDS)} for i in range(rng.randint(10, 40))]
    data = f"{_name(rng)}.json"
    return Generated({data: json.dumps(events, indent=1)},
                     f"`/app/{data}` is a JSON array of events, each with a `type`. Write to `/app/counts.json` a JSON object "
                     "mapping each type to how many events have it.", "counts.json", json.dumps(dict(Counter(e["type"] for e in events))), "json")


def top_ip_addresses(rng: random.Random) -> Generated:
    addresses: list[str] = []
    while len(addresses) < 8:
        address = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        addresses += [address] if address not in addresses else []
    hits = rng.sample(range(1, 30), 8)
    lines = [f'{ip} - - [01/May/2024:08:{i % 60:02d}:00 +0000] "GET /{rng.choice(WORDS)} HTTP/1.1" 200 {rng.randint(100, 9999)}'
             for ip, n in zip(addresses, hits, strict=True) for i in range(n)]
    rng.shuffle(lines)
    top = rng.randint(2, 4)
    best = [ip for ip, _ in Counter(line.split()[0] for line in lines).most_common(top)]
    data = f"{_name(rng)}.log"
    return Generated({data: "\n".join(lines) + "\n"},
                     f"`/app/{data}` is a web server's access log (the client address first on each line). Write the {top} addresses "
                     "with the most requests to `/app/top_ips.txt`, one per line, the busiest first.", "top_ips.txt", "\n".join(best))


def csv_filter_rows(rng: random.Random) -> Generated:
    cities = rng.sample(["Lyon", "Oslo", "Quito", "Perth", "Cusco", "Delhi", "Turku"], 4)
    city, floor = rng.choice(cities), rng.randint(20, 60)
    rows = [(f"{rng.choice(WORDS)}{i}", rng.choice(cities), rng.randint(10, 90)) for i in range(rng.randint(12, 40))]
    kept = [f"{n},{c},{a}" for n, c, a in rows if c == city and a >= floor]
    data = f"{_name(rng)}.csv"
    return Generated({data: "name,city,age\n" + "\n".join(f"{n},{c},{a}" for n, c, a in rows) + "\n"},
                     f"`/app/{data}` is a CSV file (`name,city,age`). Write to `/app/filtered.csv` its header line and, in their "
                     f"order, the rows whose city is `{city}` and whose age is at least {floor}.", "filtered.csv", "\n".join(["name,city,age", *kept]))


FAMILIES: dict[str, tuple[str, Callable[[random.Random], Generated]]] = {
    "count-log-errors": ("text-processing", count_log_errors), "csv-column-sum": ("data", csv_column_sum),
    "dedupe-lines": ("text-processing", dedupe_lines), "extract-emails": ("text-processing", extract_emails),
    "word-frequency": ("text-processing", word_frequency), "json-count-by-type": ("data", json_count_by_type),
    "top-ip-addresses": ("text-processing", top_ip_addresses), "csv-filter-rows": ("data", csv_filter_rows),
}
"""Family name → (its ``[metadata] category``, its generator)."""

AGENT_TIMEOUT_S, VERIFIER_TIMEOUT_S = 120.0, 60.0

TEST_SH = """#!/bin/bash
# Reward 1 when /tests/check.py accepts what is in /app, else 0 (a crash leaves the 0 written first).
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if python3 -I -B /tests/check.py; then
    echo 1 > /logs/verifier/reward.txt
fi
exit 0
"""

CHECK = '''"""Compare /app/<output> with the expected content in /tests/expected.json (read as root; nothing of the agent's runs)."""
import json, sys
spec = json.load(open("/tests/expected.json"))
try:
    with open("/app/" + spec["output"], encoding="utf-8") as f:
        got = f.read()
except (OSError, UnicodeDecodeError):
    sys.exit(1)
expected = spec["expected"]
if spec["compare"] == "json":
    try:
        ok = json.loads(got) == json.loads(expected)
    except ValueError:
        ok = False
else:
    lines = [line.rstrip() for line in got.strip().splitlines()]
    want = [line.rstrip() for line in expected.strip().splitlines()]
    ok = sorted(lines) == sorted(want) if spec["compare"] == "set" else lines == want
sys.exit(0 if ok else 1)
'''


def generate(family: str, seed: int) -> Generated:
    """Instance ``seed`` of ``family`` (the same on every machine: ``random.Random(f"{family}:{seed}")``)."""
    return FAMILIES[family][1](random.Random(f"{family}:{seed}"))
