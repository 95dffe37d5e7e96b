"""Ledger throughput on PostgreSQL: hold+settle pairs per second against a bare-SQL baseline, same run.

    .venv/bin/python bench/ledger.py [--clients 64] [--processes N] [--seconds 10] [--via service|http]

``ledger``: ``--clients`` threads, each with its own run account, spread over ``--processes`` processes
(default: one per CPU, so the clients' Python is not one interpreter's lock), loop "place a hold for 1,000
decode tokens, settle it for 500" through the ledger (``service``: the ``Ledger`` class, every rule,
idempotency key and entry included; ``http``: the ledger app under uvicorn with one worker per process,
called over HTTP with the service token). ``baseline``: the same clients each send one conditional
``UPDATE … WHERE remaining >= amount`` per charge, the least any overdraft-safe ledger can do. Prints both
rates and their ratio. A throw-away database is created and dropped.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.common.db import Database, migrate  # noqa: E402
from services.common.http import ServiceClient  # noqa: E402
from services.ledger.app import MIGRATIONS_DIR  # noqa: E402
from services.ledger.client import LedgerClient  # noqa: E402
from services.ledger.pricing import load_prices  # noqa: E402
from services.ledger.schemas import AccountCreate, HoldCreate, HoldSettle, UsageItem  # noqa: E402
from services.ledger.service import Ledger  # noqa: E402

MODEL = "smollm2-135m-instruct"
BUDGET = 10**12  # micro-USD: never the limit here


def run_clients(n: int, seconds: float, setup: Callable[[int], object], step: Callable[[object, int], None], others=None) -> float:  # noqa: ANN001
    """Run ``step(state, i)`` in a loop on ``n`` threads for ``seconds``; operations per second.

    ``others``: a barrier shared with the other processes, so that all start measuring together."""
    counts = [0] * n
    barrier = threading.Barrier(n + 1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        state = setup(i)
        barrier.wait()
        try:
            while not stop.is_set():
                step(state, counts[i])
                counts[i] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    if others is not None:
        others.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def in_processes(target: Callable[..., float], args: tuple, clients: int, processes: int) -> float:
    """Run ``target(*args, n_clients, start_barrier)`` in ``processes`` processes sharing ``clients``; summed rate."""
    ctx = mp.get_context("spawn")
    shares = [n for n in (clients // processes + (1 if i < clients % processes else 0) for i in range(processes)) if n]
    barrier, results = ctx.Barrier(len(shares)), ctx.Queue()
    procs = [ctx.Process(target=_report, args=(results, target, (*args, n, barrier))) for n in shares]
    for proc in procs:
        proc.start()
    rates = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    if errors := [r for r in rates if isinstance(r, str)]:
        raise RuntimeError(errors[0])
    return sum(rates)


def _report(results, target: Callable[..., float], args: tuple) -> None:  # noqa: ANN001
    try:
        results.put(target(*args))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        results.put(f"{type(exc).__name__}: {exc}")
        raise


def bench_service(url: str, seconds: float, clients: int, barrier) -> float:  # noqa: ANN001
    db = Database(url)
    ledger = Ledger(db, load_prices())
    usage_hold, usage_settle = [UsageItem(kind="decode_tokens", quantity=1000, model=MODEL)], [UsageItem(kind="decode_tokens", quantity=500, model=MODEL)]

    def setup(i: int) -> str:
        account = f"run_bench{i:04d}{secrets.token_hex(6)}"
        ledger.open_account(AccountCreate(account_id=account, budget_usd_micros=BUDGET))
        return account

    def pair(account: str, k: int) -> None:
        hold = ledger.create_hold(HoldCreate(account_id=account, usage=usage_hold, purpose="bench", idempotency_key=f"h{k}"))
        ledger.settle_hold(hold.hold_id, HoldSettle(usage=usage_settle, idempotency_key=f"s{k}"))

    try:
        return run_clients(clients, seconds, setup, pair, barrier)
    finally:
        ledger.close()
        db.engine.dispose()


def http_clients(base: str, token: str, seconds: float, clients: int, barrier) -> float:  # noqa: ANN001
    """Hold+settle pairs/s through the ledger's HTTP API, called as the services call it (:class:`LedgerClient`)."""
    hold_usage = [UsageItem(kind="decode_tokens", quantity=1000, model=MODEL)]
    settle_usage = [UsageItem(kind="decode_tokens", quantity=500, model=MODEL)]

    def setup(i: int) -> tuple[LedgerClient, str]:
        client = LedgerClient(ServiceClient(base, token, name="ledger", timeout_s=60))
        account = f"run_bench{i:04d}{secrets.token_hex(6)}"
        client.open_account(AccountCreate(account_id=account, budget_usd_micros=BUDGET))
        return client, account

    def pair(state: tuple[LedgerClient, str], k: int) -> None:
        client, account = state
        hold = client.create_hold(HoldCreate(account_id=account, usage=hold_usage, purpose="bench", idempotency_key=f"h{k}"))
        client.settle_hold(hold.hold_id, HoldSettle(usage=settle_usage, idempotency_key=f"s{k}"))

    return run_clients(clients, seconds, setup, pair, barrier)


def bench_http(url: str, seconds: float, clients: int, processes: int, port: int = 18199) -> float:
    """The ledger app under uvicorn with ``processes`` workers, called by ``clients`` HTTP clients."""
    token = secrets.token_hex(16)
    env = {**os.environ, "CRUCIBLE_DATABASE_URL": url, "CRUCIBLE_TRUSTED_TOKENS": f'{{"bench": "{token}"}}', "CRUCIBLE_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "services.ledger.app:app", "--port", str(port), "--log-level", "warning",
                             "--workers", str(processes)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        return in_processes(http_clients, (base, token, seconds), clients, processes)
    finally:
        proc.terminate()
        proc.wait()


def bench_baseline(dsn: str, seconds: float, clients: int, barrier) -> float:  # noqa: ANN001
    def setup(i: int) -> tuple[psycopg.Connection, str]:
        conn = psycopg.connect(dsn, autocommit=True)
        account = f"base{i:04d}{secrets.token_hex(6)}"
        conn.execute("INSERT INTO accounts (account_id, budget_usd_micros, held_usd_micros, spent_usd_micros, created_at, updated_at) "
                     "VALUES (%s, %s, 0, 0, now(), now())", (account, BUDGET))
        return conn, account

    def charge(state: tuple[psycopg.Connection, str], _k: int) -> None:
        conn, account = state
        cur = conn.execute("UPDATE accounts SET spent_usd_micros = spent_usd_micros + %s "
                           "WHERE account_id = %s AND budget_usd_micros - held_usd_micros - spent_usd_micros >= %s", (200, account, 200))
        assert cur.rowcount == 1

    return run_clients(clients, seconds, setup, charge, barrier)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--via", choices=["service", "http"], default="service")
    parser.add_argument("--pg", default=os.environ.get("CRUCIBLE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()

    name = f"crucible_bench_ledger_{secrets.token_hex(4)}"
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = args.pg.rsplit("/", 1)[0] + f"/{name}"
    url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        migrate(url, MIGRATIONS_DIR)
        if args.via == "service":
            pairs = in_processes(bench_service, (url, args.seconds), args.clients, args.processes)
        else:
            pairs = bench_http(url, args.seconds, args.clients, args.processes)
        baseline = in_processes(bench_baseline, (dsn, args.seconds), args.clients, args.processes)
    finally:
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"clients {args.clients} in {args.processes} processes, {args.seconds:.0f} s each, PostgreSQL, ledger via {args.via}")
    print(f"ledger    hold+settle pairs/s  {pairs:10.1f}")
    print(f"baseline  conditional UPDATEs/s {baseline:10.1f}")
    print(f"ratio     {pairs / baseline:.3f}   (target: ≥ 1000 pairs/s and ratio ≥ 0.5)")


if __name__ == "__main__":
    main()
