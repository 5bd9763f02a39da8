#!/usr/bin/env bash
# perf/microvm_pool_bench.sh: what a warm pool of microVMs saves, in one run,
# on a dsecd of its own (a temporary state dir with a busybox base layer):
#   - cold: `dsec run --backend microvm -- true` (boot, exec, destroy), ROUNDS times;
#   - pooled: the same command with `pool set --backend microvm --size 1` on
#     the same environment, each round waiting first until the pool has one
#     booted again (the refill is not timed: that is what a pool is for);
#   - the peer in the same run: `dsec run -- true` (a container).
# Each figure is one CLI call, its start-up included. Medians are printed.
#
#   perf/microvm_pool_bench.sh [-r ROUNDS] [BUILD_DIR]
#
# Needs root, busybox, qemu-system-x86 and a guest (tools/microvm-guest).
set -euo pipefail

rounds=5
while getopts "r:h" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    h) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-r ROUNDS] [BUILD_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
dsec=$build/tools/dsec
dsecd=$build/tools/dsecd
export DSEC_SPAWNER=$build/tools/dsec-spawner
for b in "$dsec" "$dsecd" "$DSEC_SPAWNER"; do
  [ -x "$b" ] || { echo "microvm_pool_bench: no $b (build first)" >&2; exit 2; }
done
guest=$("$here/tools/microvm-guest" --guest "$build/tools/dsec-guest" \
          --cache "${DSEC_MICROVM_CACHE:-$build/microvm-cache}" | tail -1)
[ -f "$guest/vmlinux" ] || { echo "microvm_pool_bench: no guest ($guest)" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-microvm-pool-bench.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/base/bin"
cp /bin/busybox "$tmp/base/bin/busybox"
for a in sh cat true; do ln -s busybox "$tmp/base/bin/$a"; done
"$dsec" --state "$tmp/state" layer build --kind base bb@1 "$tmp/base" >/dev/null
"$dsecd" --listen 127.0.0.1:0 --state "$tmp/state" --slots 8 --microvm-slots 3 \
  --microvm-guest "$guest" >"$tmp/dsecd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$tmp/dsecd.log" && break; sleep 0.1; done
addr=$(grep -o "listening on [0-9.:]*" "$tmp/dsecd.log" | awk '{print $3}')
d() { "$dsec" --connect "$addr" "$@"; }
ms() { date +%s%N | cut -c1-13; }
median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
pool_ready() { d pool ls | awk 'NR > 1 && /microvm/ {print $(NF - 4)}' | head -1; }

cold= pooled= container=
for ((i = 0; i < rounds; i++)); do
  t0=$(ms); d run --backend microvm --memory 128m --base bb@1 -- true; t1=$(ms)
  cold="$cold $((t1 - t0))"
  t0=$(ms); d run --base bb@1 --memory 128m -- true; t1=$(ms)
  container="$container $((t1 - t0))"
done
d pool set --backend microvm --memory 128m --base bb@1 --size 1 >/dev/null
for ((i = 0; i < rounds; i++)); do
  for _ in $(seq 1200); do [ "$(pool_ready)" = 1 ] && break; sleep 0.1; done
  [ "$(pool_ready)" = 1 ] || { echo "microvm_pool_bench: the pool did not refill" >&2; exit 1; }
  t0=$(ms); d run --backend microvm --memory 128m --base bb@1 -- true; t1=$(ms)
  pooled="$pooled $((t1 - t0))"
done
claimed=$(d pool ls | awk 'NR > 1 && /microvm/ {print $(NF - 2)}' | head -1)
d pool set --backend microvm --memory 128m --base bb@1 --size 0 >/dev/null
echo "microvm_pool_bench: $rounds rounds, medians (each one CLI call: create + exec true + destroy)"
echo "  microvm, cold boot         $(echo "$cold" | median) ms   (all:$cold)"
echo "  microvm, from a warm pool  $(echo "$pooled" | median) ms   (all:$pooled; claims $claimed)"
echo "  container (the peer)       $(echo "$container" | median) ms   (all:$container)"
