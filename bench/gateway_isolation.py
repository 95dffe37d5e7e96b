"""One run's load against another run's light read: latency of run B's ``GET /v1/budget`` while run A saturates inference.

    .venv/bin/python bench/gateway_isolation.py [--load-clients 64] [--reads 400] [--interval-s 0.1] [--max-tokens 32]

Boots the embedded stack (every service a real process, SQLite, the real model prepared in
``.crucible/models``), loads the test benchmark and creates two runs. ``baseline``: run B reads its budget
``--reads`` times (fewer if ``--max-phase-s`` runs out), one read every ``--interval-s`` seconds, with nothing
else going on. ``loaded``: the same reads while run A keeps ``--load-clients`` chat completions in flight at
once (a separate process, so the load's client does not share the reader's interpreter). Prints p50/p99/max
of both, the loaded/baseline ratios, and what run A got (completions per second, answers by status; a 429
is A past its rate limit, after which that client waits ``Retry-After``). Target: loaded p99 under 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing as mp
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from crucible.sdk import AdminClient  # noqa: E402
from crucible.stack import Stack, admin_key  # noqa: E402
from tests.conftest import TEST_BENCHMARK, prepared_models  # noqa: E402

MODEL = "smollm2-135m-instruct"


def load(gateway: str, key: str, clients: int, max_tokens: int, started, stop, out) -> None:  # noqa: ANN001
    """Run A: ``clients`` chat completions in flight at once until ``stop`` is set; puts ``(status counts, seconds)`` on ``out``."""

    async def main() -> None:
        counts: collections.Counter[int] = collections.Counter()
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=gateway, headers={"Authorization": f"Bearer {key}"}, timeout=600, limits=limits) as http:

            async def client(i: int) -> None:
                n = 0
                while not stop.is_set():
                    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0.0,  # greedy: batched together
                            "messages": [{"role": "user", "content": f"Count from {i * 1000 + n} to {i * 1000 + n + 40}, one number a line."}]}
                    n += 1
                    resp = await http.post("/v1/chat/completions", json=body)
                    counts[resp.status_code] += 1
                    if resp.status_code == 429:
                        await asyncio.sleep(float(resp.headers.get("Retry-After", "1")))

            started.set()
            start = time.perf_counter()
            await asyncio.gather(*(client(i) for i in range(clients)))
            out.put((dict(counts), time.perf_counter() - start))

    asyncio.run(main())


def reads(http: httpx.Client, n: int, interval_s: float, max_s: float) -> list[float]:
    """Latencies (s) of ``n`` reads of ``GET /v1/budget``, one started every ``interval_s`` seconds, fewer if
    ``max_s`` seconds pass first; any answer but 200 fails."""
    out: list[float] = []
    end = time.perf_counter() + max_s
    while len(out) < n and time.perf_counter() < end:
        start = time.perf_counter()
        resp = http.get("/v1/budget")
        out.append(time.perf_counter() - start)
        if resp.status_code != 200:
            raise RuntimeError(f"run B's read answered {resp.status_code}: {resp.text[:300]}")
        time.sleep(max(0.0, interval_s - out[-1]))
    return out


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, interpolated (statistics.quantiles, 'inclusive' method)."""
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-clients", type=int, default=64, help="run A's chat completions in flight at once")
    parser.add_argument("--reads", type=int, default=400, help="run B's reads per phase")
    parser.add_argument("--interval-s", type=float, default=0.1, help="seconds between the starts of run B's reads")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-phase-s", type=float, default=120.0, help="stop a phase's reads after this many seconds")
    parser.add_argument("--port-base", type=int, default=18300)
    parser.add_argument("--keep-logs", type=Path, help="copy the services' logs to this folder")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack on `timeout` or kill too

    with tempfile.TemporaryDirectory(prefix="crucible-bench-") as tmp:
        data_dir = Path(tmp)
        (data_dir / "models").symlink_to(prepared_models(), target_is_directory=True)
        stack = Stack(data_dir, args.port_base)
        print("starting the embedded stack …", flush=True)
        stack.start(timeout_s=600)
        try:
            admin = AdminClient(stack.gateway_url, admin_key(data_dir))
            admin.load_benchmark(TEST_BENCHMARK)
            run_a = admin.create_run(TEST_BENCHMARK["name"], "load", budget_usd=1000)
            run_b = admin.create_run(TEST_BENCHMARK["name"], "reader", budget_usd=1000)
            with httpx.Client(base_url=stack.gateway_url, headers={"Authorization": f"Bearer {run_b['api_key']}"}, timeout=600) as http:
                reads(http, 20, args.interval_s, args.max_phase_s)  # warm-up: connections, caches
                baseline = reads(http, args.reads, args.interval_s, args.max_phase_s)
                ctx = mp.get_context("spawn")
                started, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
                proc = ctx.Process(target=load, args=(stack.gateway_url, run_a["api_key"], args.load_clients, args.max_tokens, started, stop, out))
                proc.start()
                started.wait(120)
                time.sleep(5.0)  # let run A fill inference's queue first
                loaded = reads(http, args.reads, args.interval_s, args.max_phase_s)
                stop.set()
                counts, seconds = out.get(timeout=900)
                proc.join()
        finally:
            stack.stop()
            if args.keep_logs:
                shutil.copytree(data_dir / "logs", args.keep_logs, dirs_exist_ok=True)

    print(f"run A: {args.load_clients} chat completions in flight (max_tokens {args.max_tokens}) for {seconds:.0f} s: "
          f"{counts.get(200, 0) / seconds:.1f} completions/s; answers by status {dict(sorted(counts.items()))}")
    print(f"run B: GET /v1/budget, one read every {args.interval_s * 1000:.0f} ms at most: {len(baseline)} reads in the baseline, "
          f"{len(loaded)} under load (of {args.reads}; at most {args.max_phase_s:.0f} s a phase)")
    print(f"{'':10}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, lat in (("baseline", baseline), ("loaded", loaded)):
        print(f"{name:10}{quantile(lat, 0.5) * 1000:10.1f}{quantile(lat, 0.99) * 1000:10.1f}{max(lat) * 1000:10.1f}")
    print(f"ratio     p50 {quantile(loaded, 0.5) / quantile(baseline, 0.5):.1f}×   p99 {quantile(loaded, 0.99) / quantile(baseline, 0.99):.1f}×"
          f"   (target: loaded p99 < 500 ms; measured {quantile(loaded, 0.99) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
