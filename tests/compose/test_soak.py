"""The soak test: simulated research agents (:mod:`tests.compose.soak_agents`, run by Locust) against the docker-compose
deployment for ``CRUCIBLE_SOAK_S`` seconds (``make soak``: an hour; ``make compose-test``, and so ``.ci/run``: half
a minute, after the live tests, on the same deployment: enough requests for the pooled light reads' 99th percentile).

What it must show, printed as a table whatever the outcome:

- **no server error**: no answer of 500 or more, and no failed connection, in Locust's statistics; the gateway's own
  count of 5xx answers (its ``/metrics``, read with the admin key) unchanged across the load;
- **every hold settled or released** once the agents stop (they cancel what they left queued) and the work in flight
  ends: each run's ``held_usd_micros`` is 0, and in its ledger entries every hold's charges and release add up to
  the hold;
- **the books balance**: each run's ``spent`` is the sum of its charges (less refunds), never past its budget, and no
  idempotency key is charged twice; the spender's run, whose budget ran out, is refused (402 ``budget_exhausted``,
  counted in Locust's statistics as type ``REFUSED`` with the other refusals the agents expected) and never overdrawn;
- **light reads are fast**: the 99th percentile of ``GET /v1/budget``, ``GET /v1/run``, the lists and the polls of one
  evaluation or job, pooled (the agents record each also as ``LIGHT light reads``), stays under :data:`LIGHT_P99_S`, and
  on runs of :data:`MEMORY_MIN_S` or more each route's own too (a minute holds a few dozen of one route: its p99 is its
  slowest);
- **the agents ran as written**: no exception in an agent's own code (Locust counts those apart from failures);
- **memory is flat**: each HTTP service's resident memory (``docker stats``) at the end of the run is at most 10 %
  above what it was just after the warm-up (the first quarter of the run). Asserted on runs of
  :data:`MEMORY_MIN_S` or more; printed on shorter ones, where two minutes say little about a leak.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import httpx
import pytest

from crucible.sdk import CrucibleClient
from tests.compose.deployment import Deployment, load_demo_benchmark, wait_for

SOAK_S = int(os.environ.get("CRUCIBLE_SOAK_S", "30"))
USERS = int(os.environ.get("CRUCIBLE_SOAK_USERS", "10"))  # 1 spender, 1 vandal, the rest researchers
LIGHT_P99_S = 0.5
MEMORY_MIN_S = 900
MEMORY_GROWTH = 0.10
SERVICES = ("gateway", "ledger", "trainer", "inference", "grader")
LIGHT_READS = re.compile(r"^GET /v1/(budget|run|evaluations|datasets|training/jobs|harnesses|models|evaluations/\{id\}|training/jobs/\{id\})$")

pytestmark = [pytest.mark.compose, pytest.mark.timeout(SOAK_S + 2400)]


class MemorySampler(threading.Thread):
    """``docker stats`` of the deployment's containers every few seconds: ``samples[service] = [(t, bytes), ...]``."""

    def __init__(self, deployment: Deployment, every_s: float = 5.0) -> None:
        super().__init__(daemon=True, name="soak-memory")
        self.deployment = deployment
        self.every_s = every_s
        self.samples: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.started = time.monotonic()
        self._done = threading.Event()

    def run(self) -> None:
        names = {c: s for s in self.deployment.services() for c in [self.deployment.container(s)]}
        while not self._done.is_set():
            done = subprocess.run(["docker", "stats", "--no-stream", "--format", "{{json .}}", *names], capture_output=True, text=True, timeout=60)
            t = time.monotonic() - self.started
            for line in done.stdout.splitlines():
                row = json.loads(line)
                service = next((s for c, s in names.items() if c.startswith(row["ID"]) or row["ID"].startswith(c[:12])), None)
                if service:
                    self.samples[service].append((t, _bytes(row["MemUsage"].split("/")[0])))
            self._done.wait(self.every_s)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=90)

    def growth(self, service: str, duration_s: float) -> tuple[float, float, float]:
        """``(MiB after warm-up, MiB at the end, growth)``: medians of the samples in the 15 % of the run after the warm-up
        (its first quarter) and in its last 15 %."""
        points = self.samples[service]
        warm = [b for t, b in points if 0.25 * duration_s <= t <= 0.40 * duration_s] or [points[0][1]]
        end = [b for t, b in points if t >= 0.85 * duration_s] or [points[-1][1]]
        before, after = statistics.median(warm), statistics.median(end)
        return before / 2**20, after / 2**20, after / before - 1


def _bytes(text: str) -> int:
    number, unit = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?i?B)\s*", text).groups()  # type: ignore[union-attr]
    scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    return int(float(number) * scale[unit])


def _gateway_5xx(deployment: Deployment) -> int:
    """5xx answers the gateway has counted since it started (its Prometheus metrics, read with the admin key)."""
    text = httpx.get(f"{deployment.gateway_url}/metrics", headers={"Authorization": f"Bearer {deployment.env['CRUCIBLE_ADMIN_KEY']}"}, timeout=30).text
    return sum(int(float(m.group(1))) for m in re.finditer(r'^crucible_http_requests_total\{[^}]*status="5\d\d"[^}]*\} ([\d.e+]+)$', text, re.M))


def _stats(prefix: Path) -> list[dict[str, str]]:
    with open(f"{prefix}_stats.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _holds_not_closed(entries: list[dict]) -> list[str]:
    """The holds whose charges and release do not add up to what they held: still open ones (the ledger charges a hold
    at most what it has left, and releases all the rest when it closes)."""
    held = {e["hold_id"]: e["amount_usd_micros"] for e in entries if e["type"] == "hold"}
    closed: Counter[str] = Counter()
    for e in entries:
        if e.get("hold_id") in held and e["type"] in ("charge", "release"):
            closed[e["hold_id"]] += e["amount_usd_micros"]
    return [h for h, amount in held.items() if closed[h] != amount]


def test_simulated_agents_for_hours_leave_no_error_no_open_hold_and_balanced_books(deployment: Deployment, tmp_path: Path) -> None:
    load_demo_benchmark(deployment)
    admin = deployment.admin()
    researchers = [admin.create_run("chain-sum-demo", f"soak-researcher-{i}", budget_usd=5.0) for i in range(max(USERS - 2, 1))]
    spender = admin.create_run("chain-sum-demo", "soak-spender", budget_usd=0.00002)
    vandal = admin.create_run("chain-sum-demo", "soak-vandal", budget_usd=1.0)
    runs = [*researchers, spender, vandal]
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"researchers": [r["api_key"] for r in researchers], "spender": spender["api_key"], "vandal": vandal["api_key"]}))
    clients = {r["id"]: CrucibleClient(deployment.gateway_url, r["api_key"]) for r in runs}
    for client in clients.values():  # each light read once before the load: a run's first read after a restart is not what p99 measures
        for read in (client.run, client.budget, client.evaluations, client.datasets, client.training_jobs, client.harnesses):
            read()
    errors_before = _gateway_5xx(deployment)
    memory = MemorySampler(deployment)
    memory.start()
    prefix = tmp_path / "soak"
    started = time.monotonic()
    locust = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(Path(__file__).with_name("soak_agents.py")), "--headless", "--users", str(USERS),
         "--spawn-rate", "5", "--run-time", f"{SOAK_S}s", "--stop-timeout", "60", "--host", deployment.gateway_url, "--csv", str(prefix),
         "--only-summary", "--loglevel", "WARNING"],
        env={**os.environ, "CRUCIBLE_SOAK_KEYS": str(keys)}, capture_output=True, text=True, timeout=SOAK_S + 600)
    duration = time.monotonic() - started
    memory.stop()
    print(f"\n[soak] locust exit {locust.returncode} after {duration:.0f} s\n{locust.stderr[-3000:]}")

    # the work the agents left in flight ends (their queued jobs were cancelled), and every hold with it
    wait_for(lambda: all(c.budget()["held_usd_micros"] == 0 for c in clients.values()), 900, "every run's holds to close", poll_s=5)
    errors_after = _gateway_5xx(deployment)

    rows = _stats(prefix)
    sent = [r for r in rows if r["Type"] in ("GET", "POST")]  # not Locust's Aggregated: it counts the REFUSED and LIGHT records too
    requests, failed = sum(int(r["Request Count"]) for r in sent), sum(int(r["Failure Count"]) for r in sent)
    light = [r for r in rows if r["Type"] == "GET" and LIGHT_READS.match(r["Name"])]
    pooled = next((r for r in rows if r["Type"] == "LIGHT"), None)
    books: list[str] = []
    open_holds: list[str] = []
    for run in runs:
        budget = clients[run["id"]].budget()
        entries = admin.entries(run["id"])
        charged = sum(e["amount_usd_micros"] for e in entries if e["type"] == "charge") - sum(e["amount_usd_micros"] for e in entries if e["type"] == "refund")
        twice = [k for k, n in Counter((e["idempotency_key"], e["kind"]) for e in entries if e["type"] == "charge").items() if n > 1]
        if budget["spent_usd_micros"] != charged or charged > budget["budget_usd_micros"] or twice or budget["held_usd_micros"]:
            books.append(f"{run['id']}: spent {budget['spent_usd_micros']}, charged {charged}, budget {budget['budget_usd_micros']}, twice {twice[:3]}")
        open_holds += [f"{run['id']}:{h}" for h in _holds_not_closed(entries)]
    spender_budget = clients[spender["id"]].budget()

    print(f"\n[soak] {USERS} agents for {SOAK_S} s ({duration:.0f} s with the stop): {requests} requests, {failed} failed, "
          f"{requests / SOAK_S:.1f}/s; gateway 5xx {errors_after - errors_before}; light reads pooled: "
          f"p99 {pooled and pooled['99%']} ms of {pooled and pooled['Request Count']}")
    print("[soak] | route | requests | failed | p50 ms | p99 ms | max ms |")
    for r in rows:
        print(f"[soak] | {r['Name']} | {r['Request Count']} | {r['Failure Count']} | {r['50%']} | {r['99%']} | {float(r['Max Response Time']):.0f} |")
    print(f"[soak] spender: spent {spender_budget['spent_usd_micros']} of {spender_budget['budget_usd_micros']} µUSD; open holds {open_holds[:5]}; books {books[:3]}")
    print("[soak] | service | MiB after warm-up | MiB at the end | growth |")
    growth = {}
    for service in SERVICES:
        if memory.samples.get(service):
            before, after, g = memory.growth(service, duration)
            growth[service] = g
            print(f"[soak] | {service} | {before:.0f} | {after:.0f} | {g:+.1%} |")
    if Path(f"{prefix}_failures.csv").exists():
        print("[soak] failures:", Path(f"{prefix}_failures.csv").read_text()[-3000:])
    exceptions = list(csv.DictReader(io.StringIO(Path(f"{prefix}_exceptions.csv").read_text()))) if Path(f"{prefix}_exceptions.csv").exists() else []
    if exceptions:  # an agent's task that raised sent nothing more that turn: a kind of load the test believed it made
        print("[soak] the agents' own exceptions:", [(e["Count"], e["Message"], e["Traceback"][-600:]) for e in exceptions])
    if failed:  # what the gateway and inference logged meanwhile, to tell whose the failure was
        for service in ("gateway", "inference"):
            logs = deployment.compose(f"logs --no-color --since {int(duration) + 600}s {service}", check=False).stdout
            print(f"[soak] {service} log, its warnings and errors:", "\n".join(line for line in logs.splitlines() if re.search(r"warn|error|exception|traceback", line, re.I))[-6000:])

    assert locust.returncode in (0, 1), locust.stderr[-2000:]  # 1: Locust saw failures or exceptions, asserted below
    assert failed == 0, [(r["Name"], r["Failure Count"]) for r in rows if int(r["Failure Count"])]
    assert exceptions == [], [(e["Count"], e["Message"]) for e in exceptions]
    assert errors_after == errors_before
    assert requests >= SOAK_S  # the agents really ran (at least one request a second together)
    assert books == [] and open_holds == []
    assert spender_budget["spent_usd_micros"] <= spender_budget["budget_usd_micros"]
    refused = {r["Name"]: int(r["Request Count"]) for r in rows if r["Type"] == "REFUSED"}
    assert refused.get("402 budget_exhausted", 0) >= 1, refused  # the spender ran out and was refused (and so, maybe, others)
    assert pooled is not None and float(pooled["99%"]) <= LIGHT_P99_S * 1000, pooled  # every light read, pooled
    if SOAK_S >= MEMORY_MIN_S:  # long enough for each route's own 99th percentile to mean one
        slow = [(r["Name"], r["99%"]) for r in light if int(r["Request Count"]) and float(r["99%"]) > LIGHT_P99_S * 1000]
        assert slow == [], slow
    if SOAK_S >= MEMORY_MIN_S:
        assert {s: g for s, g in growth.items() if g > MEMORY_GROWTH} == {}
