"""Families of CSV and JSON tasks (category ``data``): each ``Prose -> (files, instruction, output, expected, compare)``,
several task structures per family (delimiters, a column named or given by position, filters, aggregates, output
formats), worded by :mod:`.phrasing`."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict

from grader.suites.terminal_families.phrasing import WORDS, Prose, Task, cap, compose, output_name, render, token

CITIES = ("Lyon", "Oslo", "Quito", "Perth", "Cusco", "Delhi", "Turku", "Accra")
NUMERIC = ("price", "qty", "weight", "cost", "tax", "score", "age", "amount")


def _csv(p: Prose, header: list[str], rows: list[list[object]], stem: str | None = None) -> tuple[str, str, str, str]:
    """A delimited file drawn for ``rows``: (name, text, a sentence describing it, its delimiter)."""
    delimiter, kind, ext = p.rng.choice([(",", "a CSV file", ".csv"), (";", "a semicolon-separated file", ".csv"), ("\t", "a tab-separated file", ".tsv")])
    buf = io.StringIO()
    writer = csv.writer(buf, delimiter=delimiter, lineterminator="\n")
    writer.writerows([header, *rows])
    name = (stem or token(p.rng)) + ext
    said = p.pick(f"{cap(p.path(name))} is {kind} with a header line", f"In {p.path(name)} ({kind}, first line a header)")
    quoted = " Fields holding the separator are quoted." if any(delimiter in str(v) for r in rows for v in r) else ""
    return name, buf.getvalue(), f"{said}: {', '.join(f'`{h}`' for h in header)}.{quoted}", delimiter


def _column(p: Prose, header: list[str], name: str) -> str:
    """A column named or given by its position."""
    i = header.index(name) + 1
    return p.pick(f"`{name}`", f"the column `{name}`", f"the {p.ordinal(i)} column", f"column number {i}")


def _compare(p: Prose, op: str, n: int) -> str:
    return {"ge": p.at_least, "gt": p.more_than, "lt": p.below}[op](n)


def _holds(op: str, value: int, n: int) -> bool:
    return {"ge": value >= n, "gt": value > n, "lt": value < n}[op]


def csv_column_sum(p: Prose) -> Task:
    """Sum, mean, maximum or minimum of a column (by name or position) of a delimited file, optionally over one city's rows."""
    rng = p.rng
    numeric = rng.sample(NUMERIC, 3)
    header = ["name", *numeric, "city"]
    rows = [[rng.choice(WORDS) + (", large" if rng.random() < 0.2 else ""), *(round(rng.uniform(-50, 500), rng.choice([0, 1, 2])) for _ in numeric),
             rng.choice(CITIES[:4])] for _ in range(rng.randint(8, 30))]
    rows = [[f"{v:g}" if isinstance(v, float) else v for v in r] for r in rows]
    target, city = rng.choice(numeric), rng.choice(CITIES[:4]) if rng.random() < 0.4 else None
    name, text, intro, _ = _csv(p, header, rows)
    values = [float(r[header.index(target)]) for r in rows if city is None or r[-1] == city]
    op = rng.choice(["sum", "mean", "max", "min"])
    result = {"sum": sum(values), "mean": sum(values) / max(1, len(values)), "max": max(values, default=0), "min": min(values, default=0)}[op]
    said = {"sum": p.pick("the sum", "the total"), "mean": p.pick("the mean", "the average (arithmetic mean)"),
            "max": p.pick("the largest value", "the maximum"), "min": p.pick("the smallest value", "the minimum")}[op]
    out = output_name(rng, ("sum", "total", "value"), ".txt")
    asks = [f"Compute {said} of {_column(p, header, target)}.", p.pick("Round it to exactly two decimals (like `12.50`).", "Give it with two digits after the point, e.g. `3.10`."),
            p.output(out)]
    if city:
        asks.append(p.pick(f"Only rows whose city is `{city}` count.", f"Consider just the rows of {city}."))
    return (files := {name: text}), compose(p, files, [intro], asks), out, f"{result:.2f}", "lines"


def csv_filter_rows(p: Prose) -> Task:
    """Rows matching a city (or not) and a numeric threshold: the rows with the header, their names, or their count."""
    rng = p.rng
    header = ["name", "city", "age", "score"]
    cities = rng.sample(CITIES, 4)
    rows = [[f"{rng.choice(WORDS)}{i}", rng.choice(cities), rng.randint(10, 90), rng.randint(0, 100)] for i in range(rng.randint(12, 40))]
    name, text, intro, _ = _csv(p, header, rows)
    files = {name: text}
    city, negate, column, op, n = rng.choice(cities), rng.random() < 0.3, rng.choice(["age", "score"]), rng.choice(["ge", "gt", "lt"]), rng.randint(20, 70)
    kept = [i for i, r in enumerate(rows) if (r[1] != city if negate else r[1] == city) and _holds(op, int(r[header.index(column)]), n)]
    where = [p.pick(f"whose city is not `{city}`", f"from anywhere but {city}") if negate else p.pick(f"whose city is `{city}`", f"from {city}"),
             f"whose {column} is {_compare(p, op, n)}"]
    rng.shuffle(where)
    select = f"the rows {where[0]} and {where[1]}"
    form = rng.choice(["rows", "names", "count"])
    out = output_name(rng, ("filtered", "selected", "rows"), ".txt" if form != "rows" else name[name.index("."):])
    lines = text.splitlines()
    if form == "rows":
        expected = [lines[0], *(lines[i + 1] for i in kept)]
        asks = [p.pick(f"Keep {select}, in their order.", f"Select {select}, keeping the file's order."),
                p.pick("Write them with the header line first, in the same format as the input.", "The output has the same header and separator as the input.")]
    elif form == "names":
        expected = [str(rows[i][0]) for i in kept]
        asks = [p.pick(f"List the names of {select}.", f"Which names belong to {select}?"), p.pick("One name per line, in file order.", "Names only, one a line, as they come in the file.")]
    else:
        expected = [str(len(kept))]
        asks = [p.pick(f"Count {select}.", f"How many are {select}?"), "Write only the number."]
    return files, compose(p, files, [intro], [*asks, p.output(out)]), out, "\n".join(expected), "lines"


def csv_group_sum(p: Prose) -> Task:
    """Per group of a column: the sum, count or maximum of another, as JSON or a sorted CSV."""
    rng = p.rng
    key, value = rng.choice(["city", "category", "team"]), rng.choice(["amount", "qty", "points"])
    groups = rng.sample(list(CITIES) if key == "city" else [w.title() for w in WORDS], rng.randint(3, 5))
    header = ["id", key, value]
    rows = [[i + 1, rng.choice(groups), rng.randint(1, 500)] for i in range(rng.randint(10, 35))]
    name, text, intro, _ = _csv(p, header, rows)
    agg = rng.choice(["sum", "count", "max"])
    result: dict[str, int] = defaultdict(int)
    for _, group, v in rows:
        result[group] = {"sum": result[group] + v, "count": result[group] + 1, "max": max(result[group], v)}[agg]
    said = {"sum": p.pick(f"the total {value}", f"the sum of `{value}`"), "count": p.pick("the number of rows", "how many rows it has"),
            "max": p.pick(f"the largest {value}", f"the maximum of `{value}`")}[agg]
    ask = p.pick(f"For each {key}, compute {said}.", f"Group the rows by `{key}` and find, per group, {said}.")
    if rng.random() < 0.5:
        out = output_name(rng, ("totals", "by_" + key), ".json")
        return (files := {name: text}), compose(p, files, [intro], [ask, p.pick(f"Write a JSON object: {key} → number.", "The output is a JSON object from group to number."), p.output(out)]), \
            out, json.dumps(dict(result)), "json"
    out = output_name(rng, ("totals", "by_" + key), ".csv")
    expected = [f"{key},{agg}", *(f"{g},{result[g]}" for g in sorted(result))]
    form = p.pick(f"Write a CSV (comma-separated) with the header `{key},{agg}` and one line per group, sorted by {key}.",
                  f"The output is comma-separated: first the line `{key},{agg}`, then `group,number` lines in alphabetical order of the group.")
    return (files := {name: text}), compose(p, files, [intro], [ask, form, p.output(out)]), out, "\n".join(expected), "lines"


def csv_sort_rows(p: Prose) -> Task:
    """Rows sorted by a numeric column either way: the first k names, or the whole file re-ordered."""
    rng = p.rng
    numeric = rng.sample(NUMERIC, 2)
    header = ["name", *numeric]
    n = rng.randint(8, 25)
    columns = [rng.sample(range(1, 1000), n) for _ in numeric]  # distinct: no tie
    rows = [[f"{rng.choice(WORDS)}-{i}", *(c[i] for c in columns)] for i in range(n)]
    name, text, intro, _ = _csv(p, header, rows)
    by, descending = rng.choice(numeric), rng.random() < 0.5
    order = sorted(range(n), key=lambda i: rows[i][header.index(by)], reverse=descending)
    direction = p.pick("from largest to smallest", "in descending order", "highest first") if descending else p.pick("from smallest to largest", "in ascending order", "lowest first")
    if rng.random() < 0.5:
        k = rng.randint(2, 5)
        out = output_name(rng, ("top", "ranking"), ".txt")
        asks = [f"Sort the rows by {_column(p, header, by)} {direction} (as numbers).", f"Write the names of the first {p.num(k)} rows of that order, one per line."]
        expected = [str(rows[i][0]) for i in order[:k]]
    else:
        out = output_name(rng, ("sorted", "ranking"), name[name.index("."):])
        asks = [f"Sort the rows by {_column(p, header, by)} {direction}, numerically.", p.pick("Keep the header line first and the same separator.", "The output keeps the input's header and format.")]
        lines = text.splitlines()
        expected = [lines[0], *(lines[i + 1] for i in order)]
    return (files := {name: text}), compose(p, files, [intro], [*asks, p.output(out)]), out, "\n".join(expected), "lines"


def csv_join(p: Prose) -> Task:
    """Customers and orders joined on the id: totals per customer, customers without orders, or orders per city (JSON)."""
    rng = p.rng
    people = [[i + 1, f"{w.title()}", rng.choice(CITIES[:4])] for i, w in enumerate(rng.sample(WORDS, rng.randint(5, 9)))]
    orders = [[100 + j, rng.choice(people[:-1])[0], rng.randint(5, 300)] for j in range(rng.randint(8, 25))]  # the last customer orders nothing
    rng.shuffle(people)
    cust, cust_text, cust_intro, _ = _csv(p, ["id", "name", "city"], people, stem="customers")
    ords, ord_text, ord_intro, _ = _csv(p, ["order_id", "customer_id", "amount"], orders, stem="orders")
    files = {cust: cust_text, ords: ord_text}
    intro = [cust_intro, ord_intro, p.pick("An order's `customer_id` is a customer's `id`.", "Orders point to customers by `customer_id` = `id`.")]
    names, cities = {c[0]: c[1] for c in people}, {c[0]: c[2] for c in people}
    op = rng.choice(["totals", "none", "per-city"])
    if op == "per-city":
        out = output_name(rng, ("orders_by_city",), ".json")
        expected = json.dumps(dict(Counter(cities[o[1]] for o in orders)))
        asks = [p.pick("Count the orders placed by customers of each city.", "How many orders come from each customer city?"),
                "Write a JSON object: city → number of orders (cities without orders left out).", p.output(out)]
        return files, compose(p, files, intro, asks), out, expected, "json"
    out = output_name(rng, ("totals", "customers"), ".txt")
    if op == "none":
        expected = sorted(names[c] for c in names if all(o[1] != c for o in orders))
        say, style = p.listing()
        asks = [p.pick("Which customers have no order at all?", "Find the customers who never ordered."), "Write their names, sorted.", say]
        return files, compose(p, files, intro, [*asks, p.output(out)]), out, *render(expected, style)
    else:
        totals = Counter()
        for o in orders:
            totals[names[o[1]]] += o[2]
        expected = [f"{n},{totals[n]}" for n in sorted(totals)]
        asks = [p.pick("Compute each customer's total order amount.", "Sum the order amounts per customer."),
                "Write `name,total` lines sorted by name; leave out customers without orders."]
    return files, compose(p, files, intro, [*asks, p.output(out)]), out, "\n".join(expected), "lines"


def csv_latest_per_id(p: Prose) -> Task:
    """One row per sensor: its latest, earliest, or largest reading, the rows sorted by sensor."""
    rng = p.rng
    sensors = [f"s{token(rng, 3)}" for _ in range(rng.randint(3, 6))]
    rows = []
    for s in sensors:
        for t in rng.sample(range(24 * 30), rng.randint(2, 5)):
            rows.append([s, f"2024-06-{1 + t // 24:02d}T{t % 24:02d}:{rng.choice([0, 15, 30, 45]):02d}:00Z", rng.randint(-20, 80)])
    rng.shuffle(rows)
    name, text, intro, _ = _csv(p, ["sensor_id", "timestamp", "value"], rows)
    lines = text.splitlines()
    pick_op = rng.choice(["latest", "earliest", "max"])
    best: dict[str, int] = {}
    for i, r in enumerate(rows):
        j = best.get(r[0])
        key = {"latest": lambda k: rows[k][1], "earliest": lambda k: tuple(-ord(c) for c in rows[k][1]), "max": lambda k: (rows[k][2], rows[k][1])}[pick_op]
        if j is None or key(i) > key(j):
            best[r[0]] = i
    said = {"latest": p.pick("its most recent reading (latest timestamp)", "only the newest row"),
            "earliest": p.pick("its oldest reading (earliest timestamp)", "only the first row in time"),
            "max": p.pick("its reading with the highest value (the later one on a tie)", "the row with its largest value; if two tie, the more recent")}[pick_op]
    out = output_name(rng, ("latest", "per_sensor"), name[name.index("."):])
    asks = ["Timestamps are ISO 8601 UTC.", f"For each sensor keep {said}, copied unchanged.", "Keep the header line and the separator.",
            p.pick("Sort the rows by `sensor_id`.", "Order the rows by sensor id."), p.output(out)]
    return (files := {name: text}), compose(p, files, [intro], asks), out, "\n".join([lines[0], *(lines[best[s] + 1] for s in sorted(best))]), "lines"


def _events(p: Prose, field: str) -> tuple[list[dict[str, object]], list[str]]:
    kinds = p.rng.sample(["click", "view", "purchase", "signup", "refund", "share"], p.rng.randint(2, 5))
    return [{"id": i, field: p.rng.choice(kinds), "user": p.rng.choice(WORDS[:6])} for i in range(p.rng.randint(10, 40))], kinds


def json_count_by_type(p: Prose) -> Task:
    """Events (a JSON array, JSON lines, or a wrapped list) counted by a drawn field: per value (JSON or lines), the most common, or one user's of one kind."""
    rng = p.rng
    field = rng.choice(["type", "kind", "category"])
    events, kinds = _events(p, field)
    layout = rng.choice(["array", "jsonl", "wrapped"])
    if layout == "array":
        name, text, intro = f"{token(rng)}.json", json.dumps(events, indent=1), f"{cap(p.path('X'))} is a JSON array of events"
    elif layout == "jsonl":
        name, text, intro = f"{token(rng)}.jsonl", "".join(json.dumps(e) + "\n" for e in events), f"{cap(p.path('X'))} holds one JSON event per line"
    else:
        name, text, intro = f"{token(rng)}.json", json.dumps({"count": len(events), "events": events}), f"{cap(p.path('X'))} is a JSON object whose `events` list holds the events"
    intro = intro.replace("X", name) + f"; each event has an `id`, a `{field}` and a `user`."
    counts = Counter(e[field] for e in events)
    op = rng.choice(["counts", "top", "user"])
    if op == "counts":
        count = p.pick(f"Count the events of each `{field}`.", f"How many events are there per {field}?")
        if rng.random() < 0.5:
            out = output_name(rng, ("counts",), ".json")
            asks = [count, p.pick(f"Write a JSON object mapping each {field} to its count.", f"The result is a JSON object, {field} → number of events."), p.output(out)]
            return (files := {name: text}), compose(p, files, [intro], asks), out, json.dumps(dict(counts)), "json"
        out, sep = output_name(rng, ("counts",), ".txt"), rng.choice([" ", ": ", "\t"])
        form = {" ": f"`{field} count` (a space between)", ": ": f"`{field}: count`", "\t": f"the {field}, a tab, the count"}[sep]
        asks = [count, f"Write one line per {field} as {form}, sorted by {field}.", p.output(out)]
        return (files := {name: text}), compose(p, files, [intro], asks), out, "\n".join(f"{k}{sep}{n}" for k, n in sorted(counts.items())), "lines"
    out = output_name(rng, ("answer",), ".txt")
    if op == "top":
        ranked = counts.most_common()
        tied = [k for k, n in ranked if n == ranked[0][1]]
        expected = "\n".join(sorted(tied))
        asks = [f"Which {field} occurs most often?", p.pick("If several tie, write each of them, sorted, one per line.", "On a tie, list all the tied ones in alphabetical order, one a line.")]
    else:
        user, kind = rng.choice(WORDS[:6]), rng.choice(kinds)
        expected = str(sum(1 for e in events if e["user"] == user and e[field] == kind))
        asks = [p.pick(f"How many `{kind}` events did the user `{user}` have?", f"Count the events of {field} {kind} whose user is {user}."), "Write only the number."]
    return (files := {name: text}), compose(p, files, [intro], [*asks, p.output(out)]), out, expected, "lines"


def json_to_csv(p: Prose) -> Task:
    """Records (array, JSON lines, or wrapped) to CSV or TSV with drawn columns in a drawn order, sorted by id or not."""
    rng = p.rng
    fields = ["id", "name", "email", "score", "team"]
    records = []
    for i in rng.sample(range(1, 200), rng.randint(5, 14)):
        w = rng.choice(WORDS)
        record = {"id": i, "name": w.title(), "email": f"{w}{i}@{rng.choice(WORDS)}.org", "score": rng.randint(0, 100), "team": rng.choice(WORDS[:4])}
        records.append({k: v for k, v in record.items() if k == "id" or rng.random() > 0.15})
    layout = rng.choice(["array", "jsonl", "wrapped"])
    name = f"{token(rng)}.json" + ("l" if layout == "jsonl" else "")
    text = {"array": json.dumps(records, indent=2), "jsonl": "".join(json.dumps(r) + "\n" for r in records),
            "wrapped": json.dumps({"records": records, "exported": "2024-06-01"}, indent=1)}[layout]
    said = {"array": "a JSON array of records", "jsonl": "one JSON record per line", "wrapped": "a JSON object whose `records` list holds the records"}[layout]
    columns = ["id", *rng.sample(fields[1:], rng.randint(2, 3))]
    rng.shuffle(columns)
    by_id = rng.random() < 0.5
    rows = sorted(records, key=lambda r: r["id"]) if by_id else records
    sep, kind = rng.choice([(",", "CSV (comma-separated)"), ("\t", "TSV (tab-separated)")])
    out = output_name(rng, ("table", "export"), ".csv" if sep == "," else ".tsv")
    expected = [sep.join(columns), *(sep.join(str(r.get(c, "")) for c in columns) for r in rows)]
    intro = [f"{cap(p.path(name))} holds {said}; some records lack some fields."]
    asks = [p.pick(f"Convert it to {kind} with exactly these columns, in this order: {', '.join(f'`{c}`' for c in columns)}.",
                   f"Make a {kind} table whose header names the columns {', '.join(f'`{c}`' for c in columns)}, in that order."),
            p.pick("A missing field is an empty cell.", "Leave the cell empty where a record has no such field."),
            p.pick("Sort the rows by `id`, as numbers.", "Order the rows by ascending id.") if by_id else p.pick("Keep the records' order.", "Rows in the order of the array."),
            p.output(out)]
    return (files := {name: text}), compose(p, files, intro, asks), out, "\n".join(expected), "lines"


def jsonl_active_users(p: Prose) -> Task:
    """Users matching an activity flag, a login threshold and perhaps a plan: names, ids, or a JSON array of ids."""
    rng = p.rng
    users = [{"id": i, "name": f"{w}{i}", "active": rng.random() < 0.6, "logins": rng.randint(0, 60), "plan": rng.choice(["free", "pro", "team"])}
             for i, w in zip(rng.sample(range(1, 500), 20), rng.choices(WORDS, k=20), strict=True)][: rng.randint(8, 20)]
    name = f"{token(rng)}.jsonl"
    text = "".join(json.dumps(u) + "\n" for u in users)
    active, op, n, plan = rng.random() < 0.7, rng.choice(["ge", "gt", "lt"]), rng.randint(5, 50), rng.choice(["free", "pro", "team", None])
    chosen = [u for u in users if u["active"] == active and _holds(op, u["logins"], n) and (plan is None or u["plan"] == plan)]
    conditions = [p.pick("active", "whose `active` flag is true") if active else p.pick("inactive", "whose `active` is false"),
                  f"with {_compare(p, op, n)} logins"] + ([p.pick(f"on the `{plan}` plan", f"whose plan is {plan}")] if plan else [])
    rng.shuffle(conditions)
    intro = [f"{cap(p.path(name))} has one user per line: a JSON object with `id`, `name`, `active`, `logins` and `plan`."]
    form = rng.choice(["names", "ids", "json"])
    out = output_name(rng, ("users", "selected"), ".json" if form == "json" else ".txt")
    who = p.pick(f"Find the users that are {' and '.join(conditions)}.", f"Select every user {' and '.join(conditions)}.")
    if form == "json":
        return (files := {name: text}), compose(p, files, intro, [who, "Write a JSON array of their ids, in ascending order.", p.output(out)]), \
            out, json.dumps(sorted(u["id"] for u in chosen)), "json"
    expected = sorted(u["name"] for u in chosen) if form == "names" else [str(i) for i in sorted(u["id"] for u in chosen)]
    how = p.pick("Write their names, sorted alphabetically, one per line.", "List their names in sorted order, one a line.") if form == "names" else \
        p.pick("Write their ids, one per line, in increasing numeric order.", "List the ids, smallest first, one a line.")
    return (files := {name: text}), compose(p, files, intro, [who, how, p.output(out)]), out, "\n".join(expected), "lines"


def merge_json_configs(p: Prose) -> Task:
    """Two configurations merged deep or shallow, either one winning, perhaps a `null` unsetting a setting: the merged object, or one merged value."""
    rng = p.rng
    sections = rng.sample(["server", "database", "cache", "logging", "features"], 3)
    keys = ("port", "host", "timeout", "level", "size", "retries")
    base = {s: {k: rng.randint(1, 999) for k in rng.sample(keys, 3)} for s in sections}
    override = {s: {k: rng.randint(1000, 9999) for k in rng.sample(keys, 2)} for s in rng.sample(sections, 2)}
    override[rng.choice(["extra", "limits"])] = {"max": rng.randint(1, 99)}
    first, second = f"{rng.choice(['base', 'defaults'])}.json", f"{rng.choice(['local', 'override'])}.json"
    winner = rng.choice([first, second])
    low, high = (override, base) if winner == first else (base, override)
    deep, unset = rng.random() < 0.5, None
    if rng.random() < 0.5:  # the winning file unsets a setting the other one has
        section = rng.choice([s for s in high if s in low] or list(high))
        unset = rng.choice(sorted(set(low.get(section, {})) - set(high[section])) or sorted(high[section]))
        high[section][unset] = None  # type: ignore[assignment]
    files = {first: json.dumps(base, indent=2), second: json.dumps(override, indent=2)}
    merged: dict[str, dict[str, int]] = {s: dict(v) for s, v in low.items()}
    for s, v in high.items():
        merged[s] = {k: x for k, x in ({**merged.get(s, {}), **v} if deep else v).items() if x is not None}
    intro = [f"{cap(p.path(first))} and {p.path(second)} are two JSON configuration files: objects of sections, each an object of settings."]
    if unset:
        intro.append(p.pick(f"A `null` in {winner} unsets that setting: the merged result leaves it out.", f"Where `{winner}` gives `null`, the setting is removed."))
    rule = p.pick(f"Merge them section by section: settings of both are kept, and where both set one, `{winner}` wins.",
                  f"Combine them key by key inside each section; on a conflict the value from {winner} takes precedence.") if deep else \
        p.pick(f"Merge them at the top level only: a section that both define is taken whole from `{winner}` (its settings are not combined).",
               f"Do a shallow merge: sections of both files are kept, and a section present in both comes entirely from {winner}.")
    if rng.random() < 0.5:
        out = output_name(rng, ("merged", "config"), ".json")
        return files, compose(p, files, intro, [rule, "Write the merged object as JSON.", p.output(out)]), out, json.dumps(merged), "json"
    section = rng.choice([s for s in sections if s in override] or sections)
    key = rng.choice(sorted(merged[section]))
    out = output_name(rng, ("value",), ".txt")
    ask = p.pick(f"What is `{section}.{key}` in the merged configuration? Write only the value.", f"Write just the merged value of `{key}` in section `{section}`.")
    return files, compose(p, files, intro, [rule, ask, p.output(out)]), out, str(merged[section][key]), "lines"


def json_extract_field(p: Prose) -> Task:
    """A nested document: one service's port, the total replicas, services over a replica threshold, or those with a tag."""
    rng = p.rng
    services = {w: {"port": rng.randint(1024, 9999), "replicas": rng.randint(1, 9), "tags": rng.sample(WORDS, rng.randint(1, 3))} for w in rng.sample(WORDS, rng.randint(3, 6))}
    doc = {"version": rng.randint(1, 5), "services": services, "owners": rng.sample(WORDS, 3)}
    name = f"{token(rng)}.json"
    files = {name: json.dumps(doc, indent=rng.choice([None, 2, 4]))}
    intro = [f"{cap(p.path(name))} describes a deployment: `services` maps each service name to its `port`, `replicas` and `tags`."]
    op = rng.choice(["port", "replicas-total", "names", "tag"])
    out = output_name(rng, ("answer", "services"), ".txt")
    if op == "port":
        service = rng.choice(list(services))
        expected, asks = str(services[service]["port"]), [p.pick(f"Which port does the `{service}` service use?", f"Read the port of service {service}."), "Write only the number."]
    elif op == "replicas-total":
        expected, asks = str(sum(s["replicas"] for s in services.values())), [p.pick("How many replicas are there across all services?", "Add up every service's replicas."), "Write only the number."]
    elif op == "names":
        k = rng.randint(2, 6)
        expected = "\n".join(sorted(s for s, v in services.items() if v["replicas"] >= k))
        say, style = p.listing()
        asks = [f"List the services with {p.at_least(k)} replicas, sorted by name.", say]
        expected, kind = render(expected.split("\n") if expected else [], style)
        return files, compose(p, files, intro, [*asks, p.output(out)]), out, expected, kind
    else:
        tag = rng.choice([t for v in services.values() for t in v["tags"]])
        expected = "\n".join(sorted(s for s, v in services.items() if tag in v["tags"]))
        say, style = p.listing()
        asks = [p.pick(f"Which services carry the tag `{tag}`?", f"Find the services tagged {tag}."), "Their names, sorted.", say]
        expected, kind = render(expected.split("\n"), style)
        return files, compose(p, files, intro, [*asks, p.output(out)]), out, expected, kind
    return files, compose(p, files, intro, [*asks, p.output(out)]), out, expected, "lines"


FAMILIES = {"csv-column-sum": csv_column_sum, "csv-filter-rows": csv_filter_rows, "csv-group-sum": csv_group_sum, "csv-sort-rows": csv_sort_rows,
            "csv-join": csv_join, "csv-latest-per-id": csv_latest_per_id, "json-count-by-type": json_count_by_type, "json-to-csv": json_to_csv,
            "jsonl-active-users": jsonl_active_users, "merge-json-configs": merge_json_configs, "json-extract-field": json_extract_field}
"""Name → generator."""
