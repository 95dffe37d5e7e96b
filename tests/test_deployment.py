"""The compose file's isolation rules, checked statically (no Docker engine runs on development machines)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
GRADER_SIDE = {"grader", "grader-worker", "teststore-db"}


def _env(svc: dict) -> dict:
    env = svc.get("environment") or {}
    return env if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def test_only_the_gateway_publishes_a_port() -> None:
    assert [name for name, svc in SERVICES.items() if svc.get("ports")] == ["gateway"]


def test_only_the_grader_joins_the_grading_network() -> None:
    assert {name for name, svc in SERVICES.items() if "grading" in svc.get("networks", [])} == GRADER_SIDE
    assert SERVICES["teststore-db"]["networks"] == ["grading"]


def test_only_the_grader_knows_the_test_store_and_seed() -> None:
    for name, svc in SERVICES.items():
        secret = {k for k in _env(svc) if k.startswith("CRUCIBLE_GRADER_TEST")} | {k for k in _env(svc) if k == "POSTGRES_PASSWORD" and name == "teststore-db"}
        if name in GRADER_SIDE:
            continue
        assert not secret, name
        assert "TESTSTORE_DB_PASSWORD}" not in yaml.safe_dump(svc), name


def test_internal_networks_have_no_egress() -> None:
    nets = COMPOSE["networks"]
    assert nets["sandbox"]["internal"] and nets["grading"]["internal"] and nets["core"]["internal"]
    assert not (nets["edge"] or {}).get("internal")


def test_services_are_health_checked_and_started_in_order() -> None:
    for name in ("gateway", "ledger", "trainer", "inference", "grader", "postgres", "teststore-db", "redis"):
        assert "healthcheck" in SERVICES[name], name
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert cond == {"condition": "service_healthy"}, (name, dep)
