"""Families of log and text tasks (category ``text-processing``): each ``Prose -> (files, instruction, output, expected,
compare)``, several task structures per family, worded by :mod:`.phrasing`."""

from __future__ import annotations

import json
from collections import Counter

from grader.suites.terminal_families.phrasing import WORDS, Prose, Task, cap, compose, output_name, render, token

SERVICES = ("api", "auth", "billing", "worker", "search", "mailer")
MESSAGES = ("request served", "cache miss", "retrying upstream", "user logged in", "error budget checked", "warn threshold read",
            "debug flag off", "job finished")


def count_log_errors(p: Prose) -> Task:
    """Count one level's entries of a log (bracketed lines, JSON lines, or one file per service), over all services, one, or per service (JSON)."""
    rng = p.rng
    level = rng.choice(["ERROR", "WARN", "DEBUG"])
    services = rng.sample(SERVICES, 3)
    records = [(f"2024-05-{1 + i // 40:02d} {8 + i % 12:02d}:{i % 60:02d}:00", rng.choices(["INFO", "ERROR", "WARN", "DEBUG"], [6, 2, 2, 1])[0],
                rng.choice(services), rng.choice(MESSAGES)) for i in range(rng.randint(40, 110))]
    structure, per_service = rng.choice(["bracket", "jsonl", "folder"]), rng.random() < 0.35
    only = None if per_service or rng.random() < 0.5 else rng.choice(services)
    files: dict[str, str] = {}
    if structure == "bracket":
        source = f"{token(rng)}.log"
        files[source] = "".join(f"{t} [{lvl}] {s}: {m}\n" for t, lvl, s, m in records)
        intro = [f"{cap(p.path(source))} is an application log; each line is a timestamp, the level in square brackets, the "
                 "service name followed by a colon, then a message."]
    elif structure == "jsonl":
        source = f"{token(rng)}.jsonl"
        files[source] = "".join(json.dumps({"time": t, "level": lvl.lower(), "service": s, "msg": m}) + "\n" for t, lvl, s, m in records)
        intro = [f"{cap(p.path(source))} holds one JSON log record per line, with the fields `time`, `level` (lower case), "
                 "`service` and `msg`."]
    else:
        for s in services:
            files[f"logs/{s}.log"] = "".join(f"{t} [{lvl}] {m}\n" for t, lvl, s2, m in records if s2 == s) or "\n"
        intro = [p.pick("`/app/logs/` holds one log file per service, named after it (`<service>.log`); ",
                        "Each service writes its own log under /app/logs (`api.log` for the `api` service, and so on); ")
                 + "a line looks like `2024-05-01 08:00:00 [INFO] request served`."]
    said = p.pick(f"`{level}`", level.lower(), f"{level.lower()}-level", f"level {level}")
    if per_service:
        out = output_name(rng, ("per_service", "counts"), ".json")
        expected = json.dumps({s: sum(1 for _, lvl, s2, _ in records if lvl == level and s2 == s) for s in services})
        asks = [p.pick(f"For every service, count its {said} entries.", f"Count the {said} records of each service separately."),
                p.pick("Write a JSON object mapping each service name to its count (0 for a service without any).",
                       "The result is a JSON object: service name → count, every service included, zero where there are none."),
                p.output(out)]
        return files, compose(p, files, intro, asks), out, expected, "json"
    out = output_name(rng, ("count", "errors", "total"), ".txt")
    expected = str(sum(1 for _, lvl, s, _ in records if lvl == level and (only is None or s == only)))
    asks = [p.pick(f"Count the {said} entries.", f"How many entries have the level {said}?", f"Find how many {said} lines there are."),
            p.pick("A message that merely mentions a level's name does not make it that level.",
                   "Only the level field counts, not the words of the message."),
            p.pick("Write just the number.", "The file must contain only that number."), p.output(out)]
    if only:
        asks.append(p.pick(f"Only entries of the `{only}` service count.", f"Ignore every service but `{only}`.",
                           f"Restrict the count to the {only} service."))
    elif structure != "folder":
        asks.append(p.pick("Every service counts.", "Count across all services."))
    else:
        asks.append(p.pick("Count over all the files together.", "Add up the counts of every file."))
    return files, compose(p, files, intro, asks), out, expected, "lines"


def dedupe_lines(p: Prose) -> Task:
    """Entries of one file or two read as one list: distinct in first- or last-seen order, sorted, only repeated, only unique, or distinct ignoring case."""
    rng = p.rng
    pool = list(dict.fromkeys(f"{rng.choice(WORDS)}-{rng.choice(WORDS)}" for _ in range(rng.randint(8, 18))))
    op = rng.choice(["first", "last", "sorted", "repeated", "once", "icase"])
    lines = [rng.choice(pool) for _ in range(rng.randint(20, 50))]
    if op == "icase":
        lines = [line.upper() if rng.random() < 0.3 else line.title() if rng.random() < 0.3 else line for line in lines]
    files: dict[str, str] = {}
    if rng.random() < 0.5:
        source = f"{token(rng)}.txt"
        files[source] = "\n".join(lines) + "\n"
        intro = [f"{cap(p.path(source))} holds one entry per line, some of them repeated."]
    else:
        cut = rng.randint(5, len(lines) - 5)
        first, second = f"{token(rng, 4)}_a.txt", f"{token(rng, 4)}_b.txt"
        files[first], files[second] = "\n".join(lines[:cut]) + "\n", "\n".join(lines[cut:]) + "\n"
        intro = [f"{cap(p.path(first))} and {p.path(second)} hold one entry per line; read them as a single list, "
                 f"`{first}` first. Some entries repeat."]
    counts = Counter(lines)
    if op == "first":
        expected, ask = list(dict.fromkeys(lines)), p.pick("Keep each distinct entry once, in the order it first appears.",
                                                          "Remove the repeats, keeping every entry's first occurrence and the original order.")
    elif op == "last":
        expected, ask = list(reversed(dict.fromkeys(reversed(lines)))), p.pick(
            "Keep each distinct entry once, at the place of its last occurrence (the order of last appearances).",
            "Remove the repeats so that only the last occurrence of each entry stays, in the original order.")
    elif op == "sorted":
        expected, ask = sorted(set(lines)), p.pick("List each distinct entry once, sorted in plain byte order (as `LC_ALL=C sort -u` does).",
                                                   "Write the distinct entries, without repeats, in byte order (`LC_ALL=C sort`).")
    elif op == "repeated":
        expected, ask = [w for w in dict.fromkeys(lines) if counts[w] > 1], p.pick(
            "Only the entries that occur more than once are wanted, each written once, in order of first appearance.",
            "Report the duplicated entries (those seen twice or more): each once, in the order they first show up.")
    elif op == "once":
        expected, ask = [w for w in lines if counts[w] == 1], p.pick("Keep only the entries that occur exactly once, in their order.",
                                                                    "Drop every entry that is repeated anywhere; keep the unique ones in order.")
    else:
        seen: dict[str, str] = {}
        for line in lines:
            seen.setdefault(line.lower(), line)
        expected, ask = list(seen.values()), p.pick(
            "Entries that differ only in upper or lower case are the same entry: keep the first spelling of each, in order of first appearance.",
            "Remove repeats ignoring case, keeping each entry's first occurrence as it is written, in the original order.")
    out = output_name(rng, ("unique", "dedup", "entries"), ".txt")
    say, style = p.listing()
    return files, compose(p, files, intro, [ask, say, p.output(out)]), out, *render(expected, style)


def extract_emails(p: Prose) -> Task:
    """Email addresses in a file or a folder of messages: all, one domain's, all but one domain's, the domains, or a count per domain (JSON)."""
    rng = p.rng
    domains = [f"{w}.{rng.choice(['com', 'org', 'net'])}" for w in rng.sample(WORDS, 3)]
    emails = sorted({f"{rng.choice(WORDS)}.{token(rng, 3)}@{rng.choice(domains)}" for _ in range(rng.randint(5, 12))})
    text = [f"{rng.choice(WORDS).title()} wrote from <{e}> about the {rng.choice(WORDS)} release." for e in emails for _ in range(rng.randint(1, 3))]
    text += [f"No address on this line about {rng.choice(WORDS)} @ noon." for _ in range(rng.randint(2, 6))]
    rng.shuffle(text)
    files: dict[str, str] = {}
    if rng.random() < 0.5:
        source = f"{token(rng)}.txt"
        files[source] = "\n".join(text) + "\n"
        intro = [f"{cap(p.path(source))} is a dump of messages with email addresses in it."]
    else:
        for i in range(0, len(text), 6):
            files[f"mail/{token(rng, 5)}.txt"] = "\n".join(text[i:i + 6]) + "\n"
        intro = [p.pick("The text files under `/app/mail/` are messages with email addresses in them.",
                        "/app/mail holds several .txt messages that mention email addresses; consider all of them.")]
    op = rng.choice(["all", "domain", "other-domains", "per-domain", "domains"])
    domain = rng.choice(domains)
    out = output_name(rng, ("emails", "addresses"), ".json" if op == "per-domain" else ".txt")
    if op == "per-domain":
        expected = json.dumps(dict(Counter(e.split("@")[1] for e in emails)))
        asks = [p.pick("Count how many distinct addresses each domain (the part after `@`) has.",
                       "For every email domain, find the number of different addresses at it."),
                "Write them as a JSON object: domain → number.", p.output(out)]
        return files, compose(p, files, intro, asks), out, expected, "json"
    if op == "domains":
        expected, asks = sorted({e.split("@")[1] for e in emails}), [p.pick("List the distinct domains (what follows `@`) of the addresses.",
                                                                            "Which email domains appear? Each once.")]
    elif op == "other-domains":
        expected, asks = [e for e in emails if not e.endswith("@" + domain)], [
            p.pick(f"Collect the distinct addresses, except those at `{domain}`.", f"Find every address once, leaving out the ones ending in `@{domain}`.")]
    elif op == "domain":
        expected, asks = [e for e in emails if e.endswith("@" + domain)], [
            p.pick(f"Collect the distinct addresses at the domain `{domain}` only.", f"Keep only addresses ending in `@{domain}`, each once.")]
    else:
        expected, asks = emails, [p.pick("Extract every distinct email address.", "Find all the email addresses, each once.")]
    say, style = p.listing()
    asks += [p.pick("Sort them alphabetically.", "In sorted order.", "Order them as `sort` would."), say, p.output(out)]
    return files, compose(p, files, intro, asks), out, *render(expected, style)


def word_frequency(p: Prose) -> Task:
    """Words of a text (one file or parts): the top N with counts in a drawn format, the top N alone, one word's count, or the distinct count."""
    rng = p.rng
    vocabulary, weights = rng.sample(WORDS, 10), rng.sample(range(1, 40), 10)  # distinct counts: no tie
    words = [w for w, n in zip(vocabulary, weights, strict=True) for _ in range(n)]
    rng.shuffle(words)
    sentences = [" ".join(words[i:i + 8]).capitalize() + rng.choice([".", "!", "?", ","]) for i in range(0, len(words), 8)]
    files: dict[str, str] = {}
    if rng.random() < 0.5:
        source = f"{token(rng)}.txt"
        files[source] = "\n".join(sentences) + "\n"
        intro = [f"{cap(p.path(source))} is a text."]
    else:
        for i in range(0, len(sentences), 5):
            files[f"texts/part{i // 5 + 1}.txt"] = "\n".join(sentences[i:i + 5]) + "\n"
        intro = ["The files `/app/texts/part*.txt` are parts of one text; take them together."]
    counts = Counter(words)
    rule = p.pick("Words are compared ignoring case, with punctuation stripped.", "Upper and lower case count as the same word; punctuation is not part of a word.")
    op, top = rng.choice(["top-counts", "top-words", "count-word", "distinct"]), rng.randint(2, 5)
    out = output_name(rng, ("top", "words", "freq"), ".txt")
    if op == "top-counts":
        sep, how = rng.choice([(" ", "the word, a space, its count"), (": ", "`word: count`"), (",", "`word,count` (no space)")])
        expected = [f"{w}{sep}{n}" for w, n in counts.most_common(top)]
        asks = [p.pick(f"Find the {p.num(top)} most frequent words.", f"Which {p.num(top)} words occur most often?"),
                f"Write each on its own line as {how}, the most frequent first."]
    elif op == "top-words":
        expected = [w for w, _ in counts.most_common(top)]
        asks = [p.pick(f"Find the {p.num(top)} most frequent words.", f"Which {p.num(top)} words occur most often?"),
                p.pick("Write only the words, one per line, the most frequent first.", "List the words alone (no counts), most frequent first, one a line.")]
    elif op == "count-word":
        word = rng.choice(vocabulary)
        expected = [str(counts[word])]
        asks = [p.pick(f"How many times does the word `{word}` occur?", f"Count the occurrences of \"{word}\"."), "Write just the number."]
    else:
        expected = [str(len(counts))]
        asks = [p.pick("How many different words does it use?", "Count its distinct words."), "Write just the number."]
    return files, compose(p, files, intro, [rule, *asks, p.output(out)]), out, "\n".join(expected), "lines"


def top_ip_addresses(p: Prose) -> Task:
    """An access log: the busiest clients, the most requested paths, one status code's count, clients over a threshold, or one client's bytes."""
    rng = p.rng
    addresses = list(dict.fromkeys(f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}" for _ in range(8)))
    paths = [f"/{w}" for w in rng.sample(WORDS, 6)]
    path_weight = dict(zip(paths, rng.sample(range(1, 12), 6), strict=True))
    lines, records = [], []
    for ip, n in zip(addresses, rng.sample(range(1, 30), len(addresses)), strict=True):
        for i in range(n):
            path = rng.choices(paths, [path_weight[x] for x in paths])[0]
            status, size = rng.choice([200, 200, 200, 404, 500, 301]), rng.randint(100, 9999)
            records.append((ip, path, status, size))
            lines.append(f'{ip} - - [01/May/2024:08:{i % 60:02d}:00 +0000] "GET {path} HTTP/1.1" {status} {size}')
    order = list(range(len(lines)))
    rng.shuffle(order)
    source = f"{token(rng)}.log"
    files = {source: "".join(lines[i] + "\n" for i in order)}
    intro = [f"{cap(p.path(source))} is a web server's access log in the common log format: client address first, then the "
             "request in quotes, the status code and the response size in bytes."]
    op, top = rng.choice(["top-ips", "status", "top-paths", "min-requests", "bytes"]), rng.randint(2, 4)
    out = output_name(rng, ("top_ips", "traffic", "hits"), ".txt")
    ips = Counter(r[0] for r in records)
    if op == "top-ips":
        say, style = p.listing()
        asks = [p.pick(f"Find the {p.num(top)} client addresses that made the most requests.", f"Which {p.num(top)} clients sent the most requests?"),
                "List them the busiest first.", say, p.output(out)]
        return files, compose(p, files, intro, asks), out, *render([ip for ip, _ in ips.most_common(top)], style)
    elif op == "top-paths":
        by_path = Counter(r[1] for r in records).most_common()
        top = next((k for k in range(top, 0, -1) if k == len(by_path) or by_path[k - 1][1] != by_path[k][1]), 1)  # no tie at the cut
        expected, compare = [x for x, _ in by_path[:top]], "set"
        asks = [p.pick(f"Which {p.num(top)} request paths were asked for most often?", f"Find the {p.num(top)} most requested paths (like `/alpha`)."),
                "One path per line; the order does not matter."]
    elif op == "status":
        status = rng.choice([404, 500, 301])
        expected, compare = [str(sum(1 for r in records if r[2] == status))], "lines"
        asks = [p.pick(f"How many requests got the status code {status}?", f"Count the responses with status {status}."), "Write only the number."]
    elif op == "min-requests":
        k = rng.randint(5, 20)
        expected, compare = [ip for ip, n in ips.items() if n >= k], "set"
        asks = [p.pick(f"List the addresses that made {p.at_least(k)} requests.", f"Which clients sent {p.at_least(k)} requests?"),
                "One address per line, in any order."]
    else:
        ip = rng.choice(addresses)
        expected, compare = [str(sum(r[3] for r in records if r[0] == ip))], "lines"
        asks = [p.pick(f"How many bytes in total were sent to {ip}?", f"Sum the response sizes of the requests from `{ip}`."), "Write only the number."]
    return files, compose(p, files, intro, [*asks, p.output(out)]), out, "\n".join(expected), compare


def grep_lines(p: Prose) -> Task:
    """Lines holding a word (case-sensitive or not): those lines, the others, numbered like ``grep -n``, or their count."""
    rng = p.rng
    word = rng.choice(WORDS)
    lines = []
    for _ in range(rng.randint(15, 40)):
        picked = rng.sample(WORDS, rng.randint(3, 7))
        lines.append(" ".join(w.title() if rng.random() < 0.25 else w for w in picked))
    source = f"{token(rng)}.txt"
    files = {source: "\n".join(lines) + "\n"}
    intro = [f"{cap(p.path(source))} holds lines of words separated by spaces."]
    icase = rng.random() < 0.5
    has = [i for i, line in enumerate(lines) if word in (line.lower() if icase else line).split()]
    case = p.pick("ignoring case", "whatever its case") if icase else p.pick("exactly as written (case matters)", "in lower case exactly")
    op = rng.choice(["with", "without", "numbered", "count"])
    out = output_name(rng, ("matches", "lines", "grep"), ".txt")
    if op == "with":
        expected, ask = [lines[i] for i in has], p.pick(f"Keep the lines that contain the word `{word}` ({case}), in order.",
                                                        f"Select, in their order, the lines where `{word}` appears as a word, {case}.")
    elif op == "without":
        expected, ask = [line for i, line in enumerate(lines) if i not in has], p.pick(
            f"Keep the lines that do not contain the word `{word}` ({case}), in order.", f"Drop every line where `{word}` appears as a word ({case}); keep the rest in order.")
    elif op == "numbered":
        expected, ask = [f"{i + 1}:{lines[i]}" for i in has], p.pick(
            f"Find the lines containing the word `{word}` ({case}) and write each as its line number (from 1), a colon and the line, like `grep -n`.",
            f"Like `grep -nw`, list the lines with the word `{word}` ({case}), each prefixed by its 1-based line number and `:`.")
    else:
        expected, ask = [str(len(has))], p.pick(f"How many lines contain the word `{word}` ({case})? Write only the number.",
                                                f"Count the lines in which `{word}` appears as a word ({case}); write just the count.")
    return files, compose(p, files, intro, [ask, p.output(out)]), out, "\n".join(expected), "lines"


def find_todo_comments(p: Prose) -> Task:
    """One marker's comments in a source tree: ``path:line`` lines, a count per file (JSON), or the files holding any."""
    rng = p.rng
    marker = rng.choice(["TODO", "FIXME", "HACK"])
    files: dict[str, str] = {}
    hits: list[tuple[str, int]] = []
    for i in range(rng.randint(3, 6)):
        ext, comment = rng.choice([(".py", "#"), (".js", "//"), (".sh", "#")])
        rel = f"{rng.choice(['', 'lib/', 'tools/'])}{token(rng, 5)}{i}{ext}"
        body = [f"{comment} {marker}: {rng.choice(WORDS)}"] if i == 0 else []
        hits += [(rel, 1)] if i == 0 else []
        for n in range(len(body) + 1, rng.randint(6, 16)):
            kind = rng.random()
            if kind < 0.2:
                body.append(f"{comment} {rng.choice(['TODO', 'FIXME', 'HACK'])}: {rng.choice(WORDS)} the {rng.choice(WORDS)}")
                hits += [(rel, n)] if body[-1].split()[1].rstrip(":") == marker else []
            elif kind < 0.3:
                body.append(f"{comment} note: {marker.lower()} lists live elsewhere")
            else:
                body.append(f"value_{n} = {rng.randint(0, 99)}")
        files[f"src/{rel}"] = "\n".join(body) + "\n"
    intro = [p.pick("`/app/src/` is a small source tree (Python, JavaScript and shell files, some in subfolders).",
                    "The source files live under /app/src, some in subdirectories.")]
    said = p.pick(f"`{marker}` comments", f"comments marked {marker} (upper case)", f"{marker} markers in comments")
    relative = p.pick("Paths are relative to `/app/src` (like `lib/x.py`).", "Give each path relative to /app/src.")
    op = rng.choice(["where", "per-file", "files"])
    if op == "per-file":
        out = output_name(rng, ("todos", "markers"), ".json")
        asks = [f"Count the {said} in each file.", "Write a JSON object mapping each file that has any to its count.", relative, p.output(out)]
        return files, compose(p, files, intro, asks), out, json.dumps(dict(Counter(rel for rel, _ in hits))), "json"
    out = output_name(rng, ("todos", "markers"), ".txt")
    if op == "where":
        expected = [f"{rel}:{n}" for rel, n in sorted(hits)]
        asks = [f"Find every one of the {said}.", p.pick("Write each as `path:line` (line numbers from 1), sorted by path (byte order), then by line number.",
                                                        "One `path:line_number` per line, ordered by path (as `LC_ALL=C sort` orders them) and then by line number.")]
    else:
        expected = sorted({rel for rel, _ in hits})
        asks = [f"Which files contain {said}?", "List each such file once, in byte order (`LC_ALL=C sort`)."]
    return files, compose(p, files, intro, [*asks, relative, p.output(out)]), out, "\n".join(expected), "lines"


def set_config_value(p: Prose) -> Task:
    """An INI file edited in place: a key's value changed, a key removed, or a key added at the end of a section."""
    rng = p.rng
    sections = rng.sample(["server", "database", "cache", "logging", "auth"], 3)
    keys = {s: rng.sample(["port", "host", "timeout", "level", "enabled", "size", "path", "retries"], 4) for s in sections}
    values = {(s, k): str(rng.randint(1, 999)) for s in sections for k in keys[s]}
    section, key = rng.choice(sections), None
    key = rng.choice(keys[section])
    op = rng.choice(["set", "remove", "add"])
    new_value, new_key = str(rng.randint(1000, 9999)), rng.choice(["workers", "budget", "owner", "region"])

    def render(edited: bool) -> str:
        out = [f"# configuration {token(rng, 4)}"] if not edited else []
        for s in sections:
            out.append(f"[{s}]")
            for k in keys[s]:
                if edited and (s, k) == (section, key) and op == "remove":
                    continue
                value = new_value if edited and (s, k) == (section, key) and op == "set" else values[(s, k)]
                out.append(f"{k} = {value}")
            if edited and s == section and op == "add":
                out.append(f"{new_key} = {new_value}")
            out.append("")
        return "\n".join(out)

    original = render(False)
    source = f"{rng.choice(['app', 'service', 'settings'])}.ini"
    files = {source: original}
    expected = original.split("\n")[0] + "\n" + render(True)
    intro = [f"{cap(p.path(source))} is an INI file: `[section]` headers, then `key = value` lines."]
    where = p.pick(f"in the `[{section}]` section", f"of section `{section}`", f"under [{section}]")
    ask = {"set": p.pick(f"Change the value of `{key}` {where} to {new_value}.", f"Set `{key}` {where} to `{new_value}`."),
           "remove": p.pick(f"Delete the `{key}` line {where}.", f"Remove the key `{key}` {where}."),
           "add": p.pick(f"Add `{new_key} = {new_value}` as the last entry {where}.", f"Append a key `{new_key}` with value {new_value} at the end of the section [{section}].")}[op]
    keep = p.pick("Edit the file in place; leave every other line (comments and blank lines too) as it is.",
                  "Change nothing else in the file: same lines, same order, same format `key = value`.")
    return files, compose(p, files, intro, [ask, keep]), source, expected, "lines"


def strip_comments(p: Prose) -> Task:
    """A configuration file (its comment marker drawn) without comment-only lines, blank lines, or both; in place or to a new file."""
    rng = p.rng
    mark, other = rng.choice([("#", ";"), (";", "#"), ("//", "#")])
    lines = [f"{mark} {rng.choice(WORDS)}", ""]  # at least one of each kind of line
    for _ in range(rng.randint(12, 30)):
        kind = rng.random()
        if kind < 0.25:
            lines.append(f"{rng.choice(['', '  ', '    '])}{mark} {rng.choice(WORDS)} {rng.choice(WORDS)}")
        elif kind < 0.3:
            lines.append(f"{other}{rng.choice(WORDS)} = {rng.randint(1, 9)}")  # a key, not a comment
        elif kind < 0.4:
            lines.append("")
        else:
            lines.append(f"{rng.choice(WORDS)}_{rng.randint(1, 9)} = {rng.choice(WORDS)}" + (f"  {mark} {rng.choice(WORDS)}" if rng.random() < 0.2 else ""))
    source = f"{token(rng)}.conf"
    files = {source: "\n".join(lines) + "\n"}
    intro = [f"{cap(p.path(source))} is a configuration file with blank lines and comments: " +
             p.pick(f"a comment starts with `{mark}`; a line starting with `{other}` is a setting, not a comment.",
                    f"`{mark}` begins a comment (`{other}` does not: such lines are keys).")]
    comment = [line for line in lines if line.strip().startswith(mark)]
    op = rng.choice(["comments", "both", "blank"])
    kept = [line for line in lines if not (line in comment and op != "blank") and not (line == "" and op != "comments")]
    ask = {"comments": p.pick("Remove the lines that hold only a comment (possibly indented); keep blank lines and lines with a trailing comment.",
                              f"Drop every comment-only line, indented or not. Blank lines and `key = value  {mark} note` lines stay as they are."),
           "both": p.pick(f"Remove the comment-only lines (indented ones too) and the blank lines; a `key = value  {mark} note` line stays unchanged.",
                          "Keep only the lines that are neither empty nor just a comment (possibly indented), unchanged."),
           "blank": p.pick("Remove the empty lines; keep every other line, comments included.", "Only blank lines go; comments stay.")}[op]
    if rng.random() < 0.5:
        out = source
        where = p.pick("Edit the file in place.", "Overwrite the file with the result.")
    else:
        out = output_name(rng, ("clean", "stripped"), ".conf")
        where = p.output(out) + " " + p.pick("Leave the original file as it is.", "Do not change the input.")
    return files, compose(p, files, intro, [ask, "The remaining lines keep their order.", where]), out, "\n".join(kept), "lines"


FAMILIES = {"count-log-errors": count_log_errors, "dedupe-lines": dedupe_lines, "extract-emails": extract_emails,
            "word-frequency": word_frequency, "top-ip-addresses": top_ip_addresses, "grep-lines": grep_lines,
            "find-todo-comments": find_todo_comments, "set-config-value": set_config_value, "strip-comments": strip_comments}
"""Name → generator."""

