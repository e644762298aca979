# The two commands of the quickstart: `make up` runs warmgate on its embedded default
# (three simulated instances behind the gateway on :8000), `make test` runs the checks.
VENV ?= .venv
PY := $(VENV)/bin/python
REDIS_URL ?= redis://127.0.0.1:6379
NATIVE_SRC := $(wildcard tierd/native/*.c tierd/native/*.h tierd/native/*.cu router/*.c router/*.h)

.PHONY: up test lint typecheck pytest clean

$(VENV)/.installed: pyproject.toml setup.py $(NATIVE_SRC)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[dev]'
	# xds-protos (the epp extra) ships an older copy of opentelemetry-proto's modules and
	# overwrites them, which breaks the OTLP exporter (the otel extra): put the real ones back.
	$(PY) -m pip install -q --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(PY) -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $@

up: $(VENV)/.installed
	$(VENV)/bin/warmgate up

test: $(VENV)/.installed
	REDIS_URL=$(REDIS_URL) bash scripts/ensure-redis.sh
	$(MAKE) lint typecheck pytest

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

# both cores: tests/conftest.py keeps the real-engine modules on one worker (docs/HACKING.md)
pytest: $(VENV)/.installed
	REDIS_URL=$(REDIS_URL) $(VENV)/bin/pytest -q -p no:cacheprovider --durations=15 -n 2

clean:
	rm -rf $(VENV) build *.egg-info tierd/native/*.so router/*.so
