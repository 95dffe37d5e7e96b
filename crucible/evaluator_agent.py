"""The reference agent's loop on the evaluator track: a sample of public items and an exact-match grader.

It builds the simplest evaluator the seed reports as a strong baseline: a sample of the development targets' public
validation items (questions and answers, each target a domain; a sealed target's items are not shown), asked of the candidate one by one through the run's model
endpoint, an answer scored 1 when its first number equals the reference answer. It pilots the evaluator on the
candidates (its agreement with the development targets), then freezes it as the final submission.

The evaluator archive is :data:`EVALUATOR` with ``items.json`` beside it; it reads ``{"candidate": …}`` on stdin, prints
an item line per answer as it goes and the final ``{"score", "domains"}`` line, and stops early (with what it finished)
when its budget runs out (a 429).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from typing import Any

EVALUATOR = r'''
import json, os, re, sys, urllib.error, urllib.request

candidate = json.loads(sys.stdin.read())["candidate"]
items = json.load(open("/harness/items.json"))
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]


def ask(question):
    body = {"model": candidate, "messages": [{"role": "user", "content": question}], "max_tokens": MAX_TOKENS, "temperature": 0}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["message"]["content"] or ""


def number(text):
    found = re.search(r"-?\d+(?:\.\d+)?", text)
    return float(found.group()) if found else None


by_domain = {}
for item in items:
    try:
        answer = ask(item["question"])
    except urllib.error.HTTPError as exc:
        if exc.code == 429:  # the evaluator's budget is spent: grade what was finished
            break
        raise
    got, want = number(answer), number(item["answer"])
    score = float(got is not None and want is not None and abs(got - want) < 1e-9)
    by_domain.setdefault(item["domain"], []).append(score)
    print(json.dumps({"item": item["id"], "score": score, "domain": item["domain"]}), flush=True)
domains = {d: sum(s) / len(s) for d, s in by_domain.items()}
print(json.dumps({"score": sum(domains.values()) / len(domains) if domains else 0.0, "domains": domains}))
'''


def evaluator_archive(items: list[dict[str, Any]], max_tokens: int) -> bytes:
    """The evaluator as a harness archive (.tar.gz): ``harness.toml``, ``evaluate.py`` and ``items.json`` (``items``:
    ``{"id", "question", "answer", "domain"}``); each call asks for at most ``max_tokens`` tokens. The same arguments give
    the same bytes (no time stamps), so the same evaluator is one archive."""
    files = {"harness.toml": 'name = "sample-evaluator"\nentry = "python3 /harness/evaluate.py"\n',
             "evaluate.py": EVALUATOR.replace("MAX_TOKENS", str(max_tokens)), "items.json": json.dumps(items)}
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:  # the same items, the same bytes
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def sample_items(client: Any, targets: list[str], per_target: int) -> list[dict[str, Any]]:
    """Up to ``per_target`` public validation items of each of ``targets`` (the development ones: a sealed target's items
    are not shown), each tagged with its target as its domain."""
    return [{"id": f"{t}/{it['id']}", "question": it["question"], "answer": it["answer"], "domain": t}
            for t in targets for it in client.validation_items(task=t)[:per_target]]
