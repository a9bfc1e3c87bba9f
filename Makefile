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

.PHONY: install prometheus clients test test-gpu test-e2e e2e-image lint format serve bench bench-serve clean image

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

# Client libraries whose pins clash with the project's get a venv of their own: instructor
# caps jiter below what the current openai needs, so in .venv it would downgrade openai.
# tests/router/test_client_libraries.py runs its client with this venv's python.
CLIENTS_VENV ?= .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed-stamp
clients: $(CLIENTS_STAMP)

$(CLIENTS_STAMP): Makefile
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/python -P -m pip install -q "instructor>=1.10" "pydantic>=2.8"
	touch $(CLIENTS_STAMP)

test: install prometheus clients
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not gpu and not e2e" $(PYTEST_ARGS)

# On a CUDA machine: the kernels compiled for real, bf16, CUDA graphs, engine parity on GPU.
test-gpu: install
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# A real Kubernetes API server: the control plane from $$TANDEM_KUBE_BIN, else $$KUBECONFIG's;
# with a node beside it where the machine has one's parts (tests/operator/e2e/node.py), and
# the image built first where buildah is (e2e-image).
test-e2e: install
	if command -v buildah >/dev/null && [ -n "$$TANDEM_KUBE_BIN" ]; then $(MAKE) e2e-image; fi
	$(PY) -m pytest -q -m e2e $(PYTEST_ARGS)

# The images the e2e suite's node runs, built here without a registry: Debian's base and
# the pause image (image/local-base.sh), then the Tandem image on that base.
e2e-image:
	image/local-base.sh
	$(MAKE) image BASE_IMAGE=localhost/tandem-base:bookworm TORCH_INDEX_URL=

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

# The image (Dockerfile), tagged with the chart's appVersion, by the first builder found:
# docker (BuildKit), buildah or nerdctl. `make image VARIANT=cuda` builds the CUDA target.
# Without a registry: `image/local-base.sh`, then BASE_IMAGE=localhost/tandem-base:bookworm
# TORCH_INDEX_URL= (torch from /opt/wheels, linked into image/wheels/).
APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/tandem/Chart.yaml)
VARIANT ?= cpu
IMAGE ?= ghcr.io/tandem-serving/tandem:$(APP_VERSION)$(if $(filter cuda,$(VARIANT)),-cuda,)
BASE_IMAGE ?= python:3.11-slim-bookworm
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
BUILDER ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
  elif command -v buildah >/dev/null; then echo buildah; \
  elif command -v nerdctl >/dev/null; then echo nerdctl; fi)
IMAGE_ARGS = --build-arg VARIANT=$(VARIANT) \
  --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg TORCH_INDEX_URL=$(TORCH_INDEX_URL) \
  $(if $(CA_BUNDLE),--secret id=ca$(,)src=$(CA_BUNDLE),) -t $(IMAGE) -f Dockerfile .
, := ,
image:
	@test -n "$(BUILDER)" || { echo "no image builder: install docker, buildah or nerdctl"; exit 1; }
	for w in /opt/wheels/torch-$(TORCH_VERSION)+cpu-*.whl; do \
	  if [ -f "$$w" ]; then ln -f "$$w" image/wheels/ 2>/dev/null || cp "$$w" image/wheels/; fi; done
	$(if $(filter buildah,$(BUILDER)),buildah bud --layers,$(BUILDER) build) $(IMAGE_ARGS)
	@echo "built $(IMAGE) with $(BUILDER)"

clean:
	rm -rf $(VENV) $(CLIENTS_VENV) .pytest_cache .ruff_cache models
