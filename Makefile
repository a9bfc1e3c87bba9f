# The README's commands: `make test` and `make serve`. Both set up .venv from scratch.
PYTHON ?= python3
VENV ?= .venv
# -P keeps the working directory off sys.path: from the repo root, the `operator/` folder
# would otherwise shadow the standard library's `operator` before the project is installed.
PY := $(VENV)/bin/python -P
STAMP := $(VENV)/.installed-stamp
# The CPU wheel of torch is local on our machines; a CUDA build elsewhere.
TORCH_VERSION ?= 2.13.0
# 3.9 is the first whose CPU interpreter runs on NumPy 2.4 (scalar loop bounds).
TRITON_VERSION ?= 3.9.0
PYTEST_ARGS ?=
SERVE_ARGS ?=

.PHONY: install prometheus test test-gpu test-e2e lint format serve bench bench-serve clean

install: $(STAMP)

# Debian's prometheus and promtool, for tests/router/test_prometheus.py (only `make test`
# needs them). A failed apt-get fails the target. No service is left running: without
# recommends (no node exporter), and one the package's scripts started (init.d or systemd) is
# stopped.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
prometheus:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then \
	  set -e; \
	  $(SUDO) apt-get update -qq; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus; \
	  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then \
	    $(SUDO) systemctl disable --now prometheus; fi; \
	  if [ -x /etc/init.d/prometheus ]; then $(SUDO) /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi; \
	fi

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)" "triton==$(TRITON_VERSION)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: install prometheus
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not gpu and not e2e" $(PYTEST_ARGS)

# On a CUDA machine: the kernels compiled for real, bf16, CUDA graphs, engine parity on GPU.
test-gpu: install
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# A real Kubernetes API server: the control plane from $$TANDEM_KUBE_BIN, else $$KUBECONFIG's.
test-e2e: install
	$(PY) -m pytest -q -m e2e $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

serve: install
	$(VENV)/bin/tandem serve $(SERVE_ARGS)

bench: install
	OMP_NUM_THREADS=2 $(PY) bench/offline.py

bench-serve: install
	$(PY) bench/serve.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache models
