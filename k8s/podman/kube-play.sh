#!/usr/bin/env bash
# The cpu-dev overlay's manifests run with `podman kube play` on this machine: Redis, the
# coordinator and 2 x 2 workers as pods on one podman network, with the ConfigMap, Secrets and
# the store's PersistentVolumeClaim. What podman cannot run as written is changed or left out
# by noloco_rt/deploy/kube_play.py, and printed.
#   bash k8s/podman/kube-play.sh [IMAGE]        (default noloco-rt:0.1.0-cpu; STEPS, default 40)
# Exits 0 when every worker pod's container exited 0 after its steps.
set -euo pipefail
image=${1:-noloco-rt:0.1.0-cpu}
cd "$(dirname "$0")/../.."
python=${PYTHON:-.venv/bin/python}
dir=$(mktemp -d /tmp/noloco-kube.XXXXXX)
net=noloco-kube-$$
cleanup() {
  [ -f "$dir/play.yaml" ] && podman kube down "$dir/play.yaml" >/dev/null 2>&1 || true
  for f in "$dir"/secret-*.json; do [ -e "$f" ] && podman secret rm "$(basename "$f" .json | cut -c8-)" >/dev/null 2>&1; done
  podman volume rm -f noloco-store noloco-curve >/dev/null 2>&1 || true
  podman network rm -f "$net" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT

echo "what podman runs differently from a cluster:"
"$python" -m noloco_rt.deploy.kube_play cpu-dev "$image" "$dir" NOLOCO_RUN_STEPS="${STEPS:-40}" NOLOCO_OUTER_H=5 \
  NOLOCO_COORDINATOR_EVAL_INTERVAL_S=5 | sed 's/^/  /'
for f in "$dir"/secret-*.json; do podman secret create "$(basename "$f" .json | cut -c8-)" "$f" >/dev/null; done
podman network create "$net" >/dev/null
start=$SECONDS
podman kube play --network "$net" "$dir/play.yaml" >/dev/null
workers=$(podman ps -a --filter name='^noloco-worker-stage-.*-worker$' --format '{{.Names}}')
failed=0
for w in $workers; do
  code=$(podman wait "$w")
  echo "$w exited $code: $(podman logs "$w" 2>&1 | grep -c '"outer_step_done"') outer steps," \
       "$(podman logs "$w" 2>&1 | grep '"outer_step_done"' | grep -c '"kind": "matched"') matched"
  [ "$code" = 0 ] || { failed=1; podman logs --tail 10 "$w" >&2; }
done
echo "coordinator: $(podman logs noloco-coordinator-coordinator 2>&1 | grep -c '"evaluated"') evaluations"
# The run's model: the coordinator makes it from the final states in the store, then keeps serving.
final=""
for _ in $(seq 120); do
  final=$(podman logs noloco-coordinator-coordinator 2>&1 | grep '"final_consensus"' || true)
  [ -n "$final" ] && break
  sleep 1
done
store=$(podman volume inspect noloco-store --format '{{.Mountpoint}}')
if [ -z "$final" ] || [ ! -f "$store/k8s/consensus.safetensors" ]; then
  echo "no final model in the store: $(podman logs --tail 5 noloco-coordinator-coordinator 2>&1)" >&2; failed=1
else
  echo "final model in the store: $(echo "$final" | "$python" -c 'import json,sys; e=json.loads(sys.stdin.read()); print("step", e["step"], "val_loss", round(e["val_loss"], 4), "replicas", e["replicas"])')"
  "$python" -m noloco_rt.cli eval "$store/k8s/consensus.safetensors" | tail -2 | sed 's/^/  eval: /'  # cpu-dev: stdlib data
fi
echo "kube play run: $((SECONDS - start)) s"
exit $failed
