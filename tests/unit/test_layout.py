"""The shape of the code: no import cycle among the project's modules, every ``/internal/…`` path spelled only by the
service that serves it (its ``api.py`` routes and its ``client.py``), services that call one way only, queries only in
each service's ``repository.py``, and each budget hold opened and closed by one service (docs/layout.md states the rules)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import networkx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "grader", "trainer_service", "inference_service", "services", "crucible")
SERVICE_FOLDERS = ("gateway", "grader", "trainer-service", "inference-service", "services/ledger")


def test_no_import_cycle() -> None:
    """Every import counts, at module level or inside a function (grimp's graph, networkx's strongly connected
    components): a cycle is a knot a newcomer must read as one, and a late import only hides it."""
    graph = grimp.build_graph(*PACKAGES)
    edges = networkx.DiGraph((module, imported) for module in graph.modules for imported in graph.find_modules_directly_imported_by(module))
    cycles = sorted(sorted(c) for c in networkx.strongly_connected_components(edges) if len(c) > 1)
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def _internal_paths(path: Path, *, prefix_allowed: bool = False) -> list[int]:
    """Lines of ``path`` that spell an internal path; ``prefix_allowed``: the router's bare ``"/internal"`` prefix is not one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and ((node.value == "/internal" and not prefix_allowed) or node.value.startswith("/internal/"))]


def test_internal_paths_are_spelled_only_by_their_service() -> None:
    """A caller of another service uses that service's typed client, never its paths: a path is spelled only in the
    service's ``client.py``; its ``api.py`` names only the router's ``"/internal"`` prefix (routes are relative to it)."""
    clients = {ROOT / folder / "client.py" for folder in SERVICE_FOLDERS}
    routers = {ROOT / folder / "api.py" for folder in SERVICE_FOLDERS}
    found = [f"{path.relative_to(ROOT)}:{line}"
             for path in sorted(ROOT.rglob("*.py"))
             if not ({".venv", "tests", "migrations", "versions", "teststore_migrations"} & set(path.relative_to(ROOT).parts)) and path not in clients
             for line in _internal_paths(path, prefix_allowed=path in routers)]
    assert found == [], "internal paths outside their service's client.py: " + ", ".join(found)


def test_every_service_reads_the_same_way() -> None:
    """Each service folder has its FastAPI app, thin routes, wire models and typed client in files of the same names."""
    for folder in SERVICE_FOLDERS:
        names = {p.name for p in (ROOT / folder).glob("*.py")}
        expected = {"app.py", "api.py", "schemas.py"} | ({"client.py"} if folder != "gateway" else set())
        assert expected <= names, f"{folder} lacks {sorted(expected - names)}"


PACKAGE_OF = {"gateway": "gateway", "ledger": "services.ledger", "trainer": "trainer_service", "inference": "inference_service", "grader": "grader"}
SHARED_MODULES = ("client", "schemas")  # what a caller may import of a service it calls: its typed client and wire models


def test_services_call_one_way_as_the_table_says() -> None:
    """In ``services.common.auth.MAY_CALL`` no two services call each other (a round about way stays: the grader asks
    inference for completions, inference the trainer for checkpoints, the trainer the grader for rewards), and a
    service imports another one only where the table lets it call that service, and then only its ``client`` and
    ``schemas`` (every import counts, module level or in a function)."""
    from services.common.auth import MAY_CALL

    both_ways = sorted({tuple(sorted((a, b))) for a, callees in MAY_CALL.items() for b in callees if a in MAY_CALL.get(b, ())})
    assert both_ways == [], f"services that call each other: {both_ways}"
    graph = grimp.build_graph(*PACKAGES)
    found = []
    for caller, package in PACKAGE_OF.items():
        for module in graph.find_descendants(package) | {package}:
            for imported in graph.find_modules_directly_imported_by(module):
                for callee, other in PACKAGE_OF.items():
                    if callee == caller or not (imported == other or imported.startswith(other + ".")):
                        continue
                    shared = imported.removeprefix(other + ".") in SHARED_MODULES
                    if not (shared and callee in MAY_CALL[caller]):
                        found.append(f"{module} imports {imported} ({caller} → {callee})")
    assert found == [], "imports across services that the call table does not allow:\n" + "\n".join(sorted(found))


QUERY_BUILDERS = {"select", "insert", "update", "delete", "func", "text", "and_", "or_", "exists"}


def test_queries_live_in_each_services_repository() -> None:
    """A service's modules hold rules, not SQL: only its ``repository.py`` (and ``models.py``, the tables) import
    SQLAlchemy's query builders. The grader's hidden test store is a database of its own whose storage module
    (``teststore.py``) is its repository."""
    found = []
    for folder in SERVICE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if {"migrations", "versions", "teststore_migrations"} & set(path.parts) or path.name in ("repository.py", "models.py", "teststore.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} {a.name}" for a in node.names if a.name in QUERY_BUILDERS]
    assert found == [], "query builders outside a repository: " + ", ".join(found)


# Each budget hold has one owner, the service that opened it: only the owner settles or releases it. The services the
# owner calls for that work may charge against it, by the owner's idempotency keys: inference charges an evaluation's
# tokens to the grader's hold (named in the X-Crucible-Hold header).
HOLD_OWNERS = {"trainer": "a training job's estimated cost", "grader": "a validation evaluation's", "inference": "a completion call's worst case"}
CHARGES_FOR = {"inference": "grader"}
OPEN, CLOSE, CHARGE = {"create_hold"}, {"settle_hold", "release_hold", "settle_or_charge"}, {"charge_hold"}


def _ledger_calls(package: str) -> set[str]:
    """The names of the ledger client's hold operations that ``package``'s modules call (or pass on to be called)."""
    folder = ROOT / {"trainer_service": "trainer-service", "inference_service": "inference-service"}.get(package, package.replace(".", "/"))
    return {node.attr for path in folder.rglob("*.py") if "migrations" not in path.parts
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr in OPEN | CLOSE | CHARGE}


def test_each_hold_is_opened_and_closed_by_one_service() -> None:
    """The services that open holds are :data:`HOLD_OWNERS`; a service closes (settles, releases) holds only if it opens
    them; one charges against a hold it does not open only where :data:`CHARGES_FOR` says whose."""
    calls = {name: _ledger_calls(package) for name, package in PACKAGE_OF.items() if name != "ledger"}
    assert {name for name, ops in calls.items() if ops & OPEN} == set(HOLD_OWNERS)
    assert {name for name, ops in calls.items() if ops & CLOSE} <= set(HOLD_OWNERS)
    for name, ops in calls.items():
        if ops & CHARGE and name in CHARGES_FOR:
            assert CHARGES_FOR[name] in HOLD_OWNERS
    assert calls["gateway"] == set(), "the gateway places no hold: the service doing the work owns it"
