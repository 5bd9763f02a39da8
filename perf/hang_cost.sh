#!/usr/bin/env bash
# perf/hang_cost.sh: what a hang of a node costs once it ends (docs/cluster.md).
#
#   perf/hang_cost.sh [SECONDS...]   (default: 3 4 5)
#
# Starts a cluster of a coordinator and 2 nodes with tools/cluster (in
# $DSEC_CLUSTER_DIR, default /tmp/dsec-hang-cost; port $PORT, default 27170),
# builds a small base layer from /bin/busybox, then for each SECONDS: SIGSTOPs
# node 2, sleeps, SIGCONTs it and times, from the SIGCONT, until `cluster
# status` shows it up again and until a `run --detach` through the coordinator
# lands on it. Stops the cluster at the end. Root, like tools/cluster.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
export DSEC_CLUSTER_DIR="${DSEC_CLUSTER_DIR:-/tmp/dsec-hang-cost}"
port="${PORT:-27170}"
dsec="${DSEC:-$root/build/tools/dsec}"
c="127.0.0.1:$port"
n2="127.0.0.1:$((port + 2))"
hangs=("$@")
[ ${#hangs[@]} -gt 0 ] || hangs=(3 4 5)
src="$(mktemp -d)"
trap '"$root/tools/cluster" down >/dev/null 2>&1 || true; rm -rf "$src"' EXIT
"$root/tools/cluster" up 2 --port "$port" --slots 20 >/dev/null
mkdir -p "$src/bin"
cp /bin/busybox "$src/bin/"
ln -s busybox "$src/bin/sh"
ln -s busybox "$src/bin/sleep"
"$dsec" --state "$DSEC_CLUSTER_DIR/coordinator/state" layer build --kind base hangcost@1 "$src" >/dev/null
ms() { date +%s%3N; }
for h in "${hangs[@]}"; do
  pid=$(cat "$DSEC_CLUSTER_DIR/node-2/pid")
  kill -STOP "$pid"; sleep "$h"; kill -CONT "$pid"; t0=$(ms)
  up=""; served=""
  while [ -z "$served" ] && [ $(($(ms) - t0)) -lt 60000 ]; do
    if [ -z "$up" ] && "$dsec" --connect "$c" cluster status --json | grep -q "\"name\":\"$n2\",\"state\":\"up\""; then
      up=$(($(ms) - t0))
    fi
    id=$("$dsec" --connect "$c" run --detach --base hangcost@1 -- sleep 1000 2>/dev/null || true)
    if [ -n "$id" ] && "$dsec" --connect "$c" ps 2>/dev/null | grep "^$id" | grep -q "$n2"; then
      served=$(($(ms) - t0))
    fi
    sleep 0.05
  done
  echo "hang ${h}s: node 2 up again ${up:-?} ms after SIGCONT; a create through the coordinator ran on it after ${served:-?} ms"
  sleep 1
done
