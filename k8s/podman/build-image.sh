#!/usr/bin/env bash
# Build the CPU image with podman, torch's wheel taken from a local folder (no access to
# torch's index needed; its dependencies and the project's come from PyPI).
#   bash k8s/podman/build-image.sh [WHEEL_DIR] [TAG]     (defaults /opt/wheels, noloco-rt:0.1.0-cpu)
set -euo pipefail
wheels=${1:-/opt/wheels} tag=${2:-noloco-rt:0.1.0-cpu}
cd "$(dirname "$0")/../.."
podman image exists docker.io/library/python:3.11-slim || {
  echo "no python:3.11-slim image: pull it, or make one from Debian's packages (docs/deploy.md)" >&2; exit 1; }
ls "$wheels"/torch-*.whl >/dev/null 2>&1 || { echo "no torch wheel in $wheels" >&2; exit 1; }
start=$SECONDS
podman build --pull=never --network host --format docker --build-arg VARIANT=cpu \
  --build-arg TORCH_FIND_LINKS="$wheels" --volume "$wheels:$wheels:ro" -t "$tag" .
echo "built $tag in $((SECONDS - start)) s"
