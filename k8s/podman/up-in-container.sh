#!/usr/bin/env bash
# `noloco-rt up` inside one container of the image: embedded Redis, coordinator and 2 x 2 workers.
#   bash k8s/podman/up-in-container.sh [IMAGE]            (default noloco-rt:0.1.0-cpu)
set -euo pipefail
image=${1:-noloco-rt:0.1.0-cpu}
start=$SECONDS
# The image binds 0.0.0.0 (NOLOCO_NETWORK_BIND_HOST): --secure gives the run CURVE keys, as a
# worker reachable beyond loopback needs.
output=$(podman run --rm "$image" up --stages 2 --replicas 2 --steps "${STEPS:-40}" --out /var/lib/noloco/run \
  --no-tensorboard --secure --set outer.h=5 2>&1) || { echo "$output" | tail -20 >&2; echo "up failed" >&2; exit 1; }
echo "$output" | grep '"up_done"' || { echo "$output" | tail -20 >&2; echo "up did not finish" >&2; exit 1; }
echo "up in one container: $((SECONDS - start)) s"
