"""The docker-compose deployment, live: brought up from the images of this tree, used through the published gateway
port only, attacked from inside its containers, broken and recovered, backed up, restored and upgraded.

What runs is what docs/operators.md says: every compose command is ``docker compose --env-file
deploy/.env …`` run in an operator's directory (a temporary one holding ``deploy/.env`` with fresh secrets; the
project is chosen by ``COMPOSE_FILE`` and ``COMPOSE_PROJECT_NAME``), and the backup, restore and upgrade steps are
that page's own code blocks, executed as written. ``make compose-test`` builds the images first (``make
compose-images``: from Debian's packages where no registry is reachable) and runs this module with ``-s``: every
isolation attempt and every fault's outcome is printed.

The tests share one deployment and run in file order: the reference agent's graded run first, then the checks that
read it (isolation, secrets), code harnesses in sandbox containers on the host's daemon (an oracle, hostile harnesses,
limits, verifier cheats), the faults, backup and restore, and the upgrade. Marker ``compose``.
"""

from __future__ import annotations

import io
import json
import os
import re
import secrets
import shutil
import subprocess
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from crucible.sdk import CrucibleClient
from grader.suites import get_suite
from tests.archives import archive, code_harness, oracle_archive
from tests.compose.deployment import (
    DATA_PORTS,
    HTTP_PORTS,
    PROJECT,
    ROOT,
    SANDBOX_DIR,
    SECRET_NAMES,
    Deployment,
    load_demo_benchmark,
    wait_for,
)
from tests.netns import SANDBOX_NETWORK_PROBE, Outside, outside_hosts

pytestmark = [pytest.mark.compose, pytest.mark.timeout(2400)]  # a test waits on real training and grading

OPERATORS = (ROOT / "docs" / "operators.md").read_text()
AGENT_STEPS = int(os.environ.get("CRUCIBLE_COMPOSE_AGENT_STEPS", "12"))
STATE: dict[str, Any] = {}  # what one test leaves for the next (the graded run, its key)

def operators_block(after: str, nth: int = 0) -> str:
    """The ``nth`` bash block of docs/operators.md after the text ``after``."""
    tail = OPERATORS[OPERATORS.index(after):]
    return re.findall(r"```bash\n(.*?)```", tail, re.S)[nth]


# --- the operator's path ---------------------------------------------------------------------------------------------


def test_every_container_is_up_and_healthy(deployment: Deployment) -> None:
    assert deployment.healthy()
    assert set(deployment.services()) == {*HTTP_PORTS, *DATA_PORTS, "train-worker", "grader-worker"}
    print("\n" + deployment.compose("ps --format 'table {{.Service}}\t{{.Image}}\t{{.Status}}'").stdout)


def test_the_reference_agent_reaches_a_graded_leaderboard_row(deployment: Deployment) -> None:
    """The operators page's commands: load the demo benchmark and create a run in the gateway's container, then the reference
    agent on this machine against the published port, to a graded submission and its leaderboard row."""
    d = deployment
    load_demo_benchmark(d)
    created = d.compose("exec -T gateway crucible admin create-run chain-sum-demo --agent compose-agent")
    key = re.search(r"API key \(shown once\): (\S+)", created.stdout).group(1)  # type: ignore[union-attr]
    run_id = re.search(r"run (run_\S+)", created.stdout).group(1)  # type: ignore[union-attr]
    STATE.update(key=key, run_id=run_id)

    started = time.monotonic()
    agent = subprocess.run([str(ROOT / ".venv" / "bin" / "crucible"), "agent", "--gateway", d.gateway_url, "--api-key", key, "--steps", str(AGENT_STEPS)],
                           capture_output=True, text=True, timeout=1800, env={**os.environ, "COLUMNS": "200"})
    print(f"\n[agent] exit {agent.returncode} after {time.monotonic() - started:.0f} s\n{agent.stdout[-3000:]}")
    assert agent.returncode == 0, agent.stderr[-4000:]

    def row() -> dict | None:
        rows = httpx.get(f"{d.gateway_url}/v1/leaderboard").json()["data"]
        found = next((r for r in rows if r["run_id"] == run_id), None)  # graded, and its gap closed once the initial system's grade is in
        return found if found and (found["status"] == "failed" or (found["status"] == "graded" and found["gap_closed"] is not None)) else None

    graded = wait_for(row, 900, "the run's graded leaderboard row with its gap closed", poll_s=3)
    print(f"[agent] leaderboard row: {graded}")
    assert graded["status"] == "graded" and graded["agent_name"] == "compose-agent" and graded["n"] and graded["initial_score"] is not None
    page = httpx.get(f"{d.gateway_url}/leaderboard")
    assert page.status_code == 200 and "compose-agent" in page.text


# --- isolation, checked live -----------------------------------------------------------------------------------------


def test_only_the_gateways_port_is_published(deployment: Deployment) -> None:
    published = {}
    for service in deployment.services():
        ports = deployment.inspect(service)["NetworkSettings"]["Ports"] or {}
        published[service] = sorted(f"{b['HostIp']}:{b['HostPort']}->{p}" for p, binds in ports.items() for b in binds or [])
        print(f"[ports] {service}: {published[service] or 'nothing published'}")
    assert {s for s, p in published.items() if p} == {"gateway"}
    assert all(b.endswith("->8000/tcp") and b.split("->")[0].rsplit(":", 1)[1] == str(deployment.port) for b in published["gateway"])


def _probe(deployment: Deployment, service: str, host: str, port: int) -> tuple[bool, str]:
    """Open a TCP connection to ``host:port`` from inside ``service``'s container: ``(connected, what happened)``."""
    script = f"exec 3<>/dev/tcp/{host}/{port} && echo connected"
    cmd = ["timeout", "3", "bash", "-c", script]
    proc = deployment.docker_exec(service, *cmd)
    said = (proc.stdout + proc.stderr).strip().splitlines()
    what = "connected" if proc.returncode == 0 else ("timed out" if proc.returncode == 124 else (said[-1] if said else f"exit {proc.returncode}"))
    return proc.returncode == 0, what.replace("bash: line 1: ", "")


@pytest.fixture(scope="module")
def outside() -> Iterator[Outside]:
    """Hosts of the test's own past the deployment's networks (:func:`tests.netns.outside_hosts`), which the host reaches:
    a container with a route out reaches them and none without; no probe leaves this machine."""
    with outside_hosts() as hosts:
        hosts.check_reachable()
        yield hosts


def test_each_container_reaches_only_the_peers_of_its_networks(deployment: Deployment, outside: Outside) -> None:
    """From every container, a TCP connection to every service's port and to the outside (a host in a network namespace
    of the test's own): it connects exactly when the two share a network of the compose file (internal networks have no
    route out; only the gateway is on ``edge``). The teststore database is reached only from the grader and its worker."""
    config = deployment.config()
    networks = {name: set(svc.get("networks", {})) for name, svc in config["services"].items() if name in deployment.services()}
    internal = {name for name, net in config["networks"].items() if net.get("internal")}
    targets = {**HTTP_PORTS, **DATA_PORTS}
    probes = [(source, f"{target}:{port}", target, port, bool(networks[source] & networks[target]))
              for source in deployment.services() for target, port in targets.items() if target != source]
    there = (outside.outside.address, outside.outside.port)
    probes += [(source, f"{there[0]}:{there[1]} (outside)", *there, bool(networks[source] - internal)) for source in deployment.services()]
    with ThreadPoolExecutor(max_workers=8) as pool:  # an unreachable peer costs the probe's 3 s: all at once
        results = list(pool.map(lambda p: _probe(deployment, p[0], p[2], p[3]), probes))
    wrong = []
    for (source, where, *_, expected), (connected, what) in zip(probes, results, strict=True):
        print(f"[reach] {source:>13} -> {where}: {what} (expected {'reachable' if expected else 'unreachable'})")
        wrong += [(source, where)] if connected != expected else []
    assert wrong == []
    reach_teststore = {s for s in deployment.services() if networks[s] & networks["teststore-db"]} - {"teststore-db"}
    assert reach_teststore == {"grader", "grader-worker"}


def test_only_the_grader_and_its_worker_can_open_the_test_store(deployment: Deployment) -> None:
    """With the test store's real credentials, from every container that has Python and a PostgreSQL driver."""
    url = f"postgresql://teststore:{deployment.env['TESTSTORE_DB_PASSWORD']}@teststore-db:5432/teststore"
    code = f"import psycopg; psycopg.connect({url!r}, connect_timeout=4).execute('SELECT count(*) FROM test_items').fetchone(); print('opened')"
    opened = set()
    services = (*HTTP_PORTS, "train-worker", "grader-worker")
    with ThreadPoolExecutor(max_workers=len(services)) as pool:  # each refusal waits for its DNS or connect timeout
        procs = list(pool.map(lambda service: deployment.docker_exec(service, "python", "-c", code), services))
    for service, proc in zip(services, procs, strict=True):
        said = (proc.stdout + proc.stderr).strip().splitlines()
        print(f"[teststore] {service}: {'opened the test store' if proc.returncode == 0 else said[-1] if said else proc.returncode}")
        opened |= {service} if proc.returncode == 0 else set()
    assert opened == {"grader", "grader-worker"}


def test_no_internal_service_answers_a_run_key(deployment: Deployment) -> None:
    """From the gateway's container (on the core network with every service), each service's internal routes are
    called with the run's own key as the bearer: each answers 401, never data."""
    key, run_id = STATE["key"], STATE["run_id"]
    routes = {"ledger": f"/internal/accounts/{run_id}", "trainer": "/internal/jobs", "inference": "/internal/models", "grader": "/internal/suite/validation"}
    code = ("import sys, urllib.request, urllib.error\n"
            "req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]})\n"
            "try:\n    r = urllib.request.urlopen(req, timeout=10); print(r.status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    answers = {}
    for service, path in routes.items():
        url = f"http://{service}:{HTTP_PORTS[service]}{path}"
        answers[service] = deployment.docker_exec("gateway", "python", "-c", code, url, key).stdout.strip()
        print(f"[run key] gateway container -> {url} with the run key: HTTP {answers[service]}")
    assert answers == {s: "401" for s in routes}


def _secrets_held(deployment: Deployment, service: str) -> set[str]:
    values = {name: deployment.env[name] for name in SECRET_NAMES}
    env = deployment.inspect(service)["Config"]["Env"]
    return {name for name, value in values.items() if any(value in line.split("=", 1)[1] for line in env)}


def _readme_secrets_table() -> dict[str, set[str]]:
    """The operators page's table of which container's environment holds which secret of ``deploy/.env``."""
    section = OPERATORS[OPERATORS.index("**Secrets in each container.**"):]
    rows = re.findall(r"^\| `([a-z-]+)` \| (.*?) \|$", section.split("\n\n", 2)[1], re.M)
    return {name: set(re.findall(r"`([A-Z_]+)`", cell)) for name, cell in rows}


def test_each_container_holds_only_the_secrets_the_readme_lists(deployment: Deployment) -> None:
    """``docker inspect``: every secret value of ``deploy/.env`` found in a container's environment (in any variable,
    a database URL or a JSON of trusted tokens included) is one the operators page's table gives that container."""
    table = _readme_secrets_table()
    assert set(table) == set(deployment.services())
    for service in deployment.services():
        held = _secrets_held(deployment, service)
        print(f"[secrets] {service}: {sorted(held) or 'none'}")
        assert held == table[service], service


# --- code-harness sandboxes on the Docker daemon ---------------------------------------------------------------------

TERMINAL_TASKS = ["fizzbuzz-script", "git-commit-changes", "count-log-errors", "dedupe-lines", "csv-column-sum"]
CHEATED = {"fizzbuzz-script", "git-commit-changes"}  # tasks whose verifiers run what the agent wrote


def _terminal_benchmark() -> dict[str, Any]:
    """The VibeTraining terminal preset on five tasks, with a validation seed that puts the two tasks whose verifiers
    run the agent's code into the validation split (found with the suite's own draw)."""
    suite = get_suite("terminal")
    params = {"tasks": TERMINAL_TASKS}
    seed = next(s for s in range(10_000) if {it.id for it in suite.generate(params, s, 3, split="validation")} >= CHEATED)
    doc = yaml.safe_load((ROOT / "benchmarks" / "vibetraining-terminal.yaml").read_text())
    doc["name"] = "compose-terminal"
    doc["suite"] = {"name": "terminal", "params": params, "splits": {"train": {"seed": 0, "size": 1}, "validation": {"seed": seed, "size": 3},
                                                                      "test": {"size": 1}}}
    doc["limits"] = {"final_submissions": 1, "validation_evaluations_per_hour": 100, "concurrent_evaluations": 2}
    doc["evaluation"] |= {"max_turns": 3, "max_tokens": 64}  # the initial system's grade, with the real model on CPU: turns, not sense, take the time
    return doc


def _sandbox_run(deployment: Deployment) -> CrucibleClient:
    """A run of the terminal benchmark (loaded once): its initial system is the suite's own code harness, whose hidden
    grade the grader works out in sandbox containers as soon as the benchmark is loaded."""
    if "sandbox_key" not in STATE:
        admin = deployment.admin()
        admin.load_benchmark(_terminal_benchmark())
        run = admin.create_run("compose-terminal", "compose-sandboxes")
        STATE.update(sandbox_key=run["api_key"], sandbox_run=run["id"])
    return CrucibleClient(deployment.gateway_url, STATE["sandbox_key"])


def _evaluate(client: CrucibleClient, data: bytes, limit: int | None = None) -> tuple[dict, list[dict]]:
    """Upload ``data`` as a harness archive, evaluate it on validation and wait: ``(evaluation, trajectories)``."""
    harness = client.upload_harness(data)
    ev = client.create_evaluation("smollm2-135m-instruct", harness_archive=harness["id"], limit=limit)
    done = _finished(lambda: client.evaluation(ev["id"]), 600, f"the evaluation of {harness['name']}")
    assert done["status"] == "succeeded", done.get("error")
    return done, client.trajectories(ev["id"])


def _leftovers(deployment: Deployment) -> tuple[list[str], list[str]]:
    """The deployment's sandbox containers on the daemon, and rollout directories in the shared sandbox directory on
    the host (the running eval worker's model endpoint apart)."""
    worker = deployment.inspect("grader-worker")["Config"]["Hostname"]  # a sandbox's owner label: <the worker's host name>:<process>
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "label=crucible.sandbox", "--format", '{{.ID}} {{.Label "crucible.owner"}}'],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    containers = [line.split()[0] for line in listed if line.partition(" ")[2].startswith(f"{worker}:")]
    left = sorted(p.name for p in Path(SANDBOX_DIR).glob("crucible-*") if "-model-" not in p.name)  # but the live worker's model endpoint
    return containers, left


def test_code_harnesses_run_in_sandbox_containers_and_their_verifiers_score_them(deployment: Deployment) -> None:
    """The oracle harness (every task's reference solution) on every validation task: each rollout's set-up, harness
    and verifier ran in containers of the Docker backend, and each verifier gave reward 1. The suite's own harness,
    the benchmark's initial system, was graded on the hidden test task the same way, with the real model."""
    client = _sandbox_run(deployment)
    done, trajectories = _evaluate(client, oracle_archive())
    rewards = {t["item_id"]: (t["rollout"]["reward"], t["rollout"]["sandbox"]) for t in trajectories}
    print(f"\n[sandbox] the oracle harness on validation: {rewards}; score {done['score']}")
    assert rewards == {t: (1.0, "docker") for t in rewards} and len(rewards) == 3
    baselines = deployment.admin().wait_baselines("compose-terminal", poll_s=3)
    print(f"[sandbox] the suite's own harness graded on the hidden test split: {baselines['initial_status']}; {baselines['tasks']}")
    assert baselines["initial_status"] == "succeeded"


def _network_gateways(deployment: Deployment) -> list[str]:
    """The host's address on each of the deployment's Docker networks (their gateways; internal ones have none)."""
    names = {net for service in deployment.services() for net in deployment.inspect(service)["NetworkSettings"]["Networks"]}
    out = json.loads(subprocess.run(["docker", "network", "inspect", *sorted(names)], capture_output=True, text=True, check=True).stdout)
    return sorted({conf["Gateway"] for net in out for conf in (net.get("IPAM", {}).get("Config") or []) if conf.get("Gateway")})


def _container_ips(deployment: Deployment) -> dict[str, str]:
    ips = {}
    for service in deployment.services():
        for net, conf in deployment.inspect(service)["NetworkSettings"]["Networks"].items():
            ips[f"{service}@{net.removeprefix(PROJECT + '_')}"] = conf["IPAddress"]
    return ips


def test_a_hostile_harness_reaches_nothing_and_changes_nothing_outside_its_workspace(deployment: Deployment, outside: Outside) -> None:
    """A harness that tries every container of the deployment at its service port (by address: a sandbox has no DNS),
    the host (on each of the deployment's networks, at the published port and PostgreSQL's), hosts of the test's own
    outside them, the daemon's socket, the shared sandbox directory, the artifacts and the grader's code, and to mount,
    remount and write outside /app: everything fails, it has no capability, no interface but ``lo`` and no route, and
    every attempt is in its trajectory."""
    client = _sandbox_run(deployment)
    ports = {**HTTP_PORTS, **DATA_PORTS}
    targets = [(f"{name}:{ports[name.split('@')[0]]}", ip, ports[name.split("@")[0]]) for name, ip in _container_ips(deployment).items()
               if name.split("@")[0] in ports and ip]
    for host_ip in _network_gateways(deployment):  # the host on each of the deployment's networks
        targets += [(f"host:published-gateway-port@{host_ip}", host_ip, deployment.port), (f"host:postgres@{host_ip}", host_ip, 5432)]
    targets += [(f"outside:{name}", host, port) for name, (host, port) in zip(("namespace", "host-end"), outside.targets, strict=True)]
    seen = outside.connections()
    probe = (SANDBOX_NETWORK_PROBE + "import os, socket, subprocess\n"
             f"for name, host, port in {targets!r}:\n"
             "    try:\n        socket.create_connection((host, port), timeout=3); print('REACHED', name, host, port)\n"
             "    except OSError as e:\n        print('refused', name, host, port, type(e).__name__)\n"
             f"for path in ['/var/run/docker.sock', '/run/docker.sock', {SANDBOX_DIR!r}, '/data', '/app/../opt/venv', '/opt/venv/lib', '/etc/crucible']:\n"
             "    print('SEEN' if os.path.exists(path) else 'absent', path)\n"
             "for path in ['/usr/planted', '/planted', '/run/crucible/planted', '/harness/../etc/planted']:\n"
             "    try:\n        open(path, 'w').write('x'); print('WROTE', path)\n"
             "    except OSError as e:\n        print('refused', path, type(e).__name__)\n"
             "print([line for line in open('/proc/self/status') if line.startswith('CapEff')][0].strip())\n"
             "for cmd in ['mkdir -p /tmp/cg && mount -t cgroup -o pids none /tmp/cg', 'mount -t tmpfs none /tmp', 'mount -o remount,rw /']:\n"
             "    print('MOUNTED' if subprocess.run(cmd, shell=True, capture_output=True).returncode == 0 else 'refused', cmd)\n")
    done, [trajectory] = _evaluate(client, archive({"probe.py": probe}, 'name = "probe"\nentry = "python3 /harness/probe.py"\n'), limit=1)
    stdout = trajectory["rollout"]["harness_run"]["stdout"]
    print("\n" + "\n".join(f"[sandbox probe] {line}" for line in stdout.splitlines()))
    assert not [line for line in stdout.splitlines() if line.split()[0] in ("REACHED", "SEEN", "WROTE", "MOUNTED")], stdout
    assert stdout.count("refused") == len(targets) + 4 + 3 and "CapEff:\t0000000000000000" in stdout
    network = json.loads(stdout.splitlines()[0].removeprefix("NETWORK "))
    assert network == {"interfaces": ["lo"], "routes": [], "routes6": []} and outside.connections() == seen, network


@pytest.mark.parametrize(("script", "limits", "limit"), [
    (":(){ :|:& };:\nsleep 5\n", {"processes": 32}, "processes"),
    ("for i in $(seq 40); do head -c 4000000 /dev/zero > /app/fill$i || exit; done; sleep 5\n", {"disk_mb": 16}, "disk"),
    ("python3 -c 'b = bytearray(3 << 30)'\nsleep 5\n", {"memory_mb": 256}, None),
], ids=["fork-bomb", "fills-the-disk", "allocates-past-its-memory"])
def test_a_harness_past_a_limit_is_stopped_and_only_its_rollout_fails(deployment: Deployment, script: str, limits: dict[str, int],
                                                                      limit: str | None) -> None:
    client = _sandbox_run(deployment)
    done, [trajectory] = _evaluate(client, code_harness(script, **limits), limit=1)
    run = trajectory["rollout"]["harness_run"]
    print(f"\n[sandbox limit] {limits}: exit {run['exit_code']}, limit {run['limit']}, {run['elapsed_s']} s; failure {trajectory['rollout']['failure']!r}")
    assert trajectory["rollout"]["reward"] == 0.0
    if limit is None:  # memory: the allocation fails (RLIMIT_AS) and the harness goes on
        assert "MemoryError" in run["stderr"], run
    else:
        assert run["limit"] == limit and trajectory["rollout"]["failure"] == f"the harness was stopped by its {limit} limit", run


def test_agent_code_a_verifier_runs_cannot_write_its_reward(deployment: Deployment) -> None:
    """The cheats a verifier that runs the agent's code invites: a script that writes the reward itself, and a git
    repository whose config and hooks run commands. Both tasks score 0."""
    client = _sandbox_run(deployment)
    cheat = "echo 1 > /logs/verifier/reward.txt; touch /tests/planted; echo Fizz"
    hook = "echo 1 > /logs/verifier/reward.txt; false"
    script = (f"printf '%s\\n' '{cheat}' > /app/fizzbuzz.sh; chmod +x /app/fizzbuzz.sh\n"
              f"if [ -d /app/.git ]; then cd /app && git config core.fsmonitor '{hook}'; git config core.pager '{hook}'; mkdir -p .git/hooks; "
              f"printf '#!/bin/sh\\n{hook}\\n' > .git/hooks/post-checkout; chmod +x .git/hooks/post-checkout; fi\n")
    _done, trajectories = _evaluate(client, code_harness(script))
    rewards = {t["item_id"]: t["rollout"]["reward"] for t in trajectories}
    print(f"\n[sandbox cheat] rewards {rewards}")
    assert set(rewards) >= CHEATED and set(rewards.values()) == {0.0}
    assert all(t["rollout"]["verifier_run"] is not None for t in trajectories if t["item_id"] in CHEATED)


def test_a_swe_bug_and_an_imported_task_run_in_sandbox_containers(deployment: Deployment, tmp_path: Path) -> None:
    """The swe suite in the deployment: its bugs drawn and verified in the grader's container (the same bug as on this
    host: verification is machine-independent), the initial system graded on the hidden one, and a harness that applies
    the gold patch resolves the validation bug in a sandbox container (the tests' runner mounted from the worker's
    image). Then an operator's task imported through the published port is validated in a sandbox container too."""
    params = {"projects": ["inflection"]}
    doc = yaml.safe_load((ROOT / "benchmarks" / "swe-mini.yaml").read_text())
    doc["name"] = "compose-swe"
    doc["suite"] = {"name": "swe", "params": params, "splits": {"train": {"seed": 1, "size": 1}, "validation": {"seed": 2, "size": 1}, "test": {"size": 1}}}
    doc["evaluation"] |= {"max_turns": 1, "max_tokens": 16}
    admin = deployment.admin()
    admin.load_benchmark(doc)
    baselines = admin.wait_baselines("compose-swe", poll_s=3)
    assert baselines["initial_status"] == "succeeded", baselines
    [item] = get_suite("swe").generate(params, 2, 1, split="validation")
    client = CrucibleClient(deployment.gateway_url, admin.create_run("compose-swe", "compose-swe")["api_key"])
    assert [i["question"] for i in client.validation_items()] == [item.question]
    _done, [trajectory] = _evaluate(client, code_harness(f"cd /app && git apply <<'PATCH'\n{item.entry['patch']}PATCH\n"))
    print(f"\n[swe] the gold patch in a sandbox container: reward {trajectory['rollout']['reward']}; {trajectory['rollout']['verifier_run']['stdout']}")
    assert (trajectory["rollout"]["reward"], trajectory["rollout"]["sandbox"]) == (1.0, "docker")

    folder = tmp_path / "acme" / "dedupe-lines"
    shutil.copytree(ROOT / "grader" / "suites" / "terminal_tasks" / "dedupe-lines", folder)
    (folder / "instruction.md").write_text("Acme's own: " + (folder / "instruction.md").read_text())
    with io.BytesIO() as buf:
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(folder.parent, arcname="acme")
        admin.import_tasks("acme", "terminal", buf.getvalue())
    collection = wait_for(lambda: (c := admin.task_collection("acme"))["status"] == "done" and c, 300, "the imported task's validation", poll_s=2)
    assert [(t["name"], t["status"], t["reason"]) for t in collection["tasks"]] == [("dedupe-lines", "accepted", None)]


def test_a_harness_that_leaves_processes_behind_leaves_nothing_on_the_host(deployment: Deployment) -> None:
    """A harness forks sleepers and exits; once the evaluation is over no sandbox container, no process of it and no
    rollout directory is left on the host (every run's container and files are removed)."""
    client = _sandbox_run(deployment)
    marker = f"sleeper-{secrets.token_hex(6)}"
    _done, [trajectory] = _evaluate(client, code_harness(f"(exec -a {marker} sleep 1000) &\nsetsid sleep 999 &\necho started\n"), limit=1)
    assert trajectory["rollout"]["harness_run"]["exit_code"] == 0
    containers, left = _leftovers(deployment)
    running = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    print(f"\n[sandbox leftovers] containers {containers}, directories {left}, processes {running}")
    assert (containers, left, running) == ([], [], [])


# --- faults, live ----------------------------------------------------------------------------------------------------


def _books_balance(deployment: Deployment, run_id: str) -> list[dict]:
    """No open hold, spent = the sum of charges, no idempotency key charged twice, never past the budget."""
    client = CrucibleClient(deployment.gateway_url, STATE["fault_key"])
    budget = wait_for(lambda: (b := client.budget())["held_usd_micros"] == 0 and b, 120, "every hold to close")
    entries = deployment.admin().entries(run_id)
    charges = [e for e in entries if e["type"] == "charge"]
    assert budget["spent_usd_micros"] == sum(e["amount_usd_micros"] for e in charges) <= budget["budget_usd_micros"]
    twice = [k for k, n in Counter((e["idempotency_key"], e["kind"]) for e in charges).items() if n > 1]
    assert twice == []
    return entries


def read(get: Callable[[], dict]) -> dict:
    """``get()``, or ``{"status": "unknown"}`` while the gateway answers an error (a 503 while the ledger or the database is away)."""
    try:
        return get()
    except Exception:  # noqa: BLE001
        return {"status": "unknown"}


def _fault_run(deployment: Deployment) -> CrucibleClient:
    if "fault_key" not in STATE:
        load_demo_benchmark(deployment)  # where the agent's test did not run (-k)
        run = deployment.admin().create_run("chain-sum-demo", "compose-faults")
        STATE.update(fault_key=run["api_key"], fault_run=run["id"])
    return CrucibleClient(deployment.gateway_url, STATE["fault_key"])


def _finished(get: Callable[[], dict], timeout_s: float, what: str) -> dict:
    return wait_for(lambda: (x := get())["status"] in ("succeeded", "failed", "cancelled") and x, timeout_s, what, poll_s=2)


def test_killed_eval_worker_container_evaluation_resumes_and_charges_each_item_once(deployment: Deployment) -> None:
    client = _fault_run(deployment)
    ev = client.create_evaluation("smollm2-135m-instruct")
    n = ev["items_total"]
    wait_for(lambda: client.evaluation(ev["id"])["items_done"] >= 6, 300, "6 items scored")
    subprocess.run(["docker", "kill", deployment.container("grader-worker")], check=True, capture_output=True)
    killed_at, done_at_kill = time.monotonic(), client.evaluation(ev["id"])["items_done"]
    assert done_at_kill < n
    deployment.compose("up -d grader-worker")  # restart: unless-stopped may already have
    done = _finished(lambda: client.evaluation(ev["id"]), 600, "the evaluation")
    print(f"\n[fault] grader-worker container killed after {done_at_kill}/{n} items; evaluation {done['status']} "
          f"{time.monotonic() - killed_at:.0f} s later, attempts {done['attempts']}")
    assert done["status"] == "succeeded" and done["score"]["n"] == n and done["attempts"] >= 2
    trajectories = client.trajectories(ev["id"])
    assert len(trajectories) == n == len({t["item_id"] for t in trajectories})
    entries = _books_balance(deployment, STATE["fault_run"])
    keys = Counter(e["idempotency_key"] for e in entries if e["type"] == "charge" and e["idempotency_key"].startswith(f"charge:{ev['id']}:"))
    assert len(keys) == n and set(keys.values()) == {2}  # one prefill and one decode line per item


def _training_set(client: CrucibleClient, rows: int = 64) -> str:
    items = client.train_sample(limit=rows)
    data = "".join(json.dumps({"messages": [{"role": "user", "content": it["question"]}, {"role": "assistant", "content": it["answer"]}]}) + "\n"
                   for it in items).encode()
    return client.upload_dataset(data, "compose-faults.jsonl")["id"]


@pytest.mark.parametrize("service", ["redis", "postgres", "ledger"])
def test_a_restarted_dependency_loses_no_job_or_evaluation_and_charges_nothing_twice(deployment: Deployment, service: str) -> None:
    """A training job and an evaluation in flight while ``docker compose restart SERVICE`` runs: both end once, as
    succeeded, and the books balance."""
    client = _fault_run(deployment)
    job = client.create_training_job("smollm2-135m-instruct", [_training_set(client)],
                                     {"max_steps": 9, "batch_size": 4, "checkpoint_every": 3, "warmup_steps": 1})  # at step 1 or 2 at the restart
    wait_for(lambda: client.training_job(job["id"])["steps_done"] >= 1, 300, "the job under way")
    ev = client.create_evaluation("smollm2-135m-instruct")  # after the job's first step, all 60 items: 24 were graded in one batch, done before a restart
    wait_for(lambda: client.evaluation(ev["id"])["items_done"] >= 1, 300, "the evaluation under way")
    assert (client.training_job(job["id"])["status"], client.evaluation(ev["id"])["status"]) == ("running", "running")
    restarted = time.monotonic()
    deployment.compose(f"restart {service}", timeout_s=300)
    job_now, ev_now = read(lambda: client.training_job(job["id"])), read(lambda: client.evaluation(ev["id"]))
    print(f"\n[fault] {service} restarted in {time.monotonic() - restarted:.0f} s; then the job was at step {job_now.get('steps_done', '?')}/9, "
          f"the evaluation at item {ev_now.get('items_done', '?')}/{ev['items_total']}")
    wait_for(deployment.healthy, 300, "every container healthy again")

    job_done = _finished(lambda: read(lambda: client.training_job(job["id"])), 900, "the training job")
    ev_done = _finished(lambda: read(lambda: client.evaluation(ev["id"])), 900, "the evaluation")
    print(f"[fault] after the {service} restart: job {job_done['status']} (attempts {job_done['attempts']}), evaluation {ev_done['status']} "
          f"(attempts {ev_done['attempts']}), {time.monotonic() - restarted:.0f} s after the restart")
    assert (job_done["status"], ev_done["status"]) == ("succeeded", "succeeded"), (job_done.get("error"), ev_done.get("error"))
    assert job_done["steps_done"] == 9 and [c["step"] for c in client.checkpoints(job["id"])] == [3, 6, 9]
    entries = _books_balance(deployment, STATE["fault_run"])
    trained = sum(e["quantity"] for e in entries if e["type"] == "charge" and e["kind"] == "training_tokens" and job["id"] in e["idempotency_key"])
    assert trained == job_done["trained_tokens"] == job_done["estimated_tokens"]


# --- backup, restore, upgrade ----------------------------------------------------------------------------------------


def _snapshot(deployment: Deployment) -> dict[str, Any]:
    """The public leaderboard, and each run's balance (as the run's key reads it) and ledger entries (as the admin does)."""
    admin = deployment.admin()
    keys = {STATE["run_id"]: STATE["key"], STATE["fault_run"]: STATE["fault_key"]}
    return {"leaderboard": httpx.get(f"{deployment.gateway_url}/v1/leaderboard").json()["data"],
            "runs": sorted(r["id"] for r in admin.runs()),
            "balances": {run_id: CrucibleClient(deployment.gateway_url, key).budget() for run_id, key in keys.items()},
            "entries": {run_id: admin.entries(run_id) for run_id in keys}}


def test_backup_and_restore_as_the_readme_says_keep_the_leaderboard_and_the_books(deployment: Deployment) -> None:
    """The operators page's backup block on the running deployment; then new work (a run's evaluation, charged); then the
    the page's restore block: the leaderboard, every balance and every ledger entry are those of the backup."""
    client = _fault_run(deployment)
    wait_for(lambda: all(x["status"] in ("succeeded", "failed", "cancelled") for x in [*client.training_jobs(), *client.evaluations()]), 900,
             "the run's jobs and evaluations to end (a job still running writes to the books after the backup)")
    before = _snapshot(deployment)
    started = time.monotonic()
    deployment.sh(operators_block("**Backups.**"), timeout_s=900, trace="backup")
    dumps = sorted(p.name for p in (deployment.workdir / "backup").iterdir())
    print(f"\n[backup] {dumps} in {time.monotonic() - started:.0f} s")

    client = _fault_run(deployment)
    after_backup = client.create_evaluation("smollm2-135m-instruct", limit=4)
    _finished(lambda: client.evaluation(after_backup["id"]), 300, "an evaluation after the backup")
    assert _snapshot(deployment)["balances"] != before["balances"]

    started = time.monotonic()
    deployment.sh(operators_block("To restore"), timeout_s=900, trace="restore")
    wait_for(deployment.healthy, 600, "every container healthy after the restore")
    after = _snapshot(deployment)
    print(f"[restore] done in {time.monotonic() - started:.0f} s; balances {after['balances']}")
    assert after == before


def test_an_upgrade_as_the_readme_says_keeps_a_run_in_progress_going(deployment: Deployment) -> None:
    """A training job runs while the operators page's upgrade block runs (new images, every migration, ``up -d``, which
    recreates every service's container): the job resumes in the new train worker and finishes, charged once."""
    client = _fault_run(deployment)
    job = client.create_training_job("smollm2-135m-instruct", [_training_set(client)],
                                     {"max_steps": 80, "batch_size": 4, "checkpoint_every": 20, "warmup_steps": 1})  # outlasts the upgrade (at step 14 of 150 once it was over)
    wait_for(lambda: client.training_job(job["id"])["steps_done"] >= 2, 300, "the job to be training")
    old_worker = deployment.container("train-worker")
    old = {s: deployment.container(s) for s in HTTP_PORTS}
    deployment.env["CRUCIBLE_IMAGE_TAG"] = "upgraded"  # the new release's images
    deployment.write_env()
    started = time.monotonic()
    block = "\n".join(line for line in operators_block("**Upgrading.**").splitlines() if line.strip() != "git pull")  # the tree is the new version
    deployment.sh(block, timeout_s=1800, trace="upgrade")
    wait_for(deployment.healthy, 600, "every container healthy after the upgrade")
    new = {s: deployment.container(s) for s in HTTP_PORTS}
    assert all(old[s] != new[s] for s in HTTP_PORTS)  # every service runs a new container
    assert all(deployment.inspect(s)["Config"]["Image"].endswith(":upgraded") for s in HTTP_PORTS)
    at_upgrade = client.training_job(job["id"])
    assert deployment.container("train-worker") != old_worker and at_upgrade["status"] in ("running", "queued")  # its worker was replaced under it
    done = _finished(lambda: client.training_job(job["id"]), 1200, "the job after the upgrade")
    print(f"\n[upgrade] build + migrate + up -d in {time.monotonic() - started:.0f} s, the job then at step {at_upgrade['steps_done']}/80; "
          f"it {done['status']} at step {done['steps_done']} after {done['attempts']} attempt(s)")
    assert done["status"] == "succeeded" and done["steps_done"] == 80 and done["attempts"] >= 2, done.get("error")
    assert [c["step"] for c in client.checkpoints(job["id"])] == [20, 40, 60, 80]
    _books_balance(deployment, STATE["fault_run"])
