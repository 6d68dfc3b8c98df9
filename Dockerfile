# syntax=docker/dockerfile:1
# noloco-rt image: `noloco-rt` is the entrypoint (worker, coordinator, launch, status, ...).
#
#   CUDA (default):  docker build -t noloco-rt:0.1.0-cuda .
#   CPU only:        docker build --build-arg VARIANT=cpu -t noloco-rt:0.1.0-cpu .
#   CPU, torch's wheel from a local folder (no access to torch's index; docs/deploy.md):
#     podman build --build-arg VARIANT=cpu --build-arg TORCH_FIND_LINKS=/opt/wheels \
#                  --volume /opt/wheels:/opt/wheels:ro -t noloco-rt:0.1.0-cpu .
#
# VARIANT picks the runtime base and torch's wheel index: cuda = the CUDA runtime image with
# Python 3.11 and torch's cu128 wheel; cpu = python:3.11-slim with the CPU wheel.
ARG VARIANT=cuda
ARG TORCH_VERSION=2.13.0
ARG TORCH_FIND_LINKS=

# --- build: the project's wheel (no torch here; the runtime stage installs the right one) ----------
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY noloco_rt ./noloco_rt
COPY workers ./workers
COPY coordinator ./coordinator
RUN pip install --no-cache-dir build==1.2.2 && python -m build --wheel --outdir /wheels .

# --- runtime bases --------------------------------------------------------------------------------
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 AS base-cuda
ENV TORCH_INDEX=https://download.pytorch.org/whl/cu128 \
    DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common=0.99.* gpg-agent=2.2.* \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11=3.11.* python3.11-venv=3.11.* \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv

FROM python:3.11-slim AS base-cpu
ENV TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m venv /opt/venv

# --- runtime --------------------------------------------------------------------------------------
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
ARG TORCH_VERSION
ARG TORCH_FIND_LINKS
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NOLOCO_NETWORK_BIND_HOST=0.0.0.0 \
    NOLOCO_NETWORK_METRICS_PORT=9100
# torch first and from its own index (the pin in pyproject is the same version), then the project.
# With TORCH_FIND_LINKS, torch's wheel comes from that folder (mounted into the build) and its
# dependencies from PyPI.
RUN if [ -n "${TORCH_FIND_LINKS}" ]; then \
      pip install --no-cache-dir --find-links "${TORCH_FIND_LINKS}" "torch==${TORCH_VERSION}"; \
    else \
      pip install --no-cache-dir --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"; \
    fi
COPY --from=build /wheels /wheels
# the hf extra: --model hf:PATH (transformers) works in the image as on bare metal
RUN pip install --no-cache-dir "$(ls /wheels/*.whl)[hf]" && rm -rf /wheels
RUN groupadd --gid 10001 noloco \
 && useradd --uid 10001 --gid noloco --create-home --home-dir /home/noloco noloco \
 && mkdir -p /var/lib/noloco \
 && chown noloco:noloco /var/lib/noloco
USER 10001:10001
WORKDIR /var/lib/noloco
# 9100 worker metrics, 5555/5556 worker data/exchange (network.*_port), 8780 coordinator /status.
EXPOSE 9100 5555 5556 8780
# Workers serve /metrics on network.metrics_port (NOLOCO_NETWORK_METRICS_PORT); a coordinator
# container overrides this (its /status port) or disables it (HEALTHCHECK NONE in docker run).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/metrics' % os.environ.get('NOLOCO_NETWORK_METRICS_PORT', '9100'), timeout=4)"]
ENTRYPOINT ["noloco-rt"]
CMD ["--help"]
