#!/usr/bin/env bash
# perf/metrics_cost.sh: what /metrics costs (docs/observability.md, issue 21).
#
#   perf/metrics_cost.sh [-n EPISODES] [-r ROUNDS] [-c CONCURRENCY]   (default 300, 3, 8)
#
# Builds a busybox base layer in a temporary state dir, then in ROUNDS rounds
# runs dsec-load (create, `true`, destroy; EPISODES each) against a dsecd
# without --metrics and one with --metrics 127.0.0.1:0 that a curl loop
# scrapes every 100 ms (ten times Prometheus' usual 1 s), alternating which
# goes first, after a warm-up run that is not counted. Prints each run's creation rate and the ratio of the medians:
# the peer is the same daemon without metrics, in the same run. Root, like
# dsecd. Everything it made is removed at the end, also on failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$root/build}"
n=300 rounds=3 conc=8
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n="$2"; shift 2;;
    -r) rounds="$2"; shift 2;;
    -c) conc="$2"; shift 2;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
    *) echo "perf/metrics_cost.sh: unknown argument '$1' (try --help)" >&2; exit 2;;
  esac
done
tmp="$(mktemp -d /tmp/dsec-metrics-cost.XXXXXX)"
dpid="" spid=""
cleanup() {
  [ -n "$spid" ] && kill "$spid" 2>/dev/null && wait "$spid" 2>/dev/null || true
  [ -n "$dpid" ] && kill -TERM "$dpid" 2>/dev/null && wait "$dpid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
export DSEC_SPAWNER="$build/tools/dsec-spawner"
mkdir -p "$tmp/src/bin"
cp /bin/busybox "$tmp/src/bin/"
for l in sh true; do ln -s busybox "$tmp/src/bin/$l"; done
"$build/tools/dsec" --state "$tmp/state" layer build --kind base mcost@1 "$tmp/src" >/dev/null

# One dsec-load run against a fresh dsecd; prints its rate (creates/s).
run() { # on|off
  local extra=() out="$tmp/dsecd.out"
  [ "$1" = on ] && extra=(--metrics 127.0.0.1:0)
  "$build/tools/dsecd" --listen 127.0.0.1:0 --state "$tmp/state" --slots 64 "${extra[@]}" >"$out" 2>&1 &
  dpid=$!
  local port="" mport=""
  for _ in $(seq 200); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out")
    [ "$1" = on ] && mport=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' "$out")
    [ -n "$port" ] && { [ "$1" = off ] || [ -n "$mport" ]; } && break
    sleep 0.05
  done
  [ -n "$port" ] || { echo "dsecd did not start: $(cat "$out")" >&2; exit 1; }
  if [ "$1" = on ]; then
    ( while :; do curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null || true; sleep 0.1; done ) &
    spid=$!
  fi
  "$build/tools/dsec-load" --connect "127.0.0.1:$port" --base mcost@1 --count "$n" \
    --concurrency "$conc" --quiet --json "$tmp/load.json" -- true >/dev/null
  if [ -n "$spid" ]; then kill "$spid"; wait "$spid" 2>/dev/null || true; spid=""; fi
  kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
  sed -n 's/.*"rate_per_s": \([0-9.]*\).*/\1/p' "$tmp/load.json"
}

# A first run warms what the first daemon on a state dir makes (the system
# layer, page cache, cgroups); it is not counted.
rate=$(run off)
echo "warm-up, metrics off: $rate creates/s (not counted)"
on=() off=()
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order=(off on); else order=(on off); fi
  for m in "${order[@]}"; do
    rate=$(run "$m")
    echo "round $r, metrics $m: $rate creates/s"
    if [ "$m" = on ]; then on+=("$rate"); else off+=("$rate"); fi
  done
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mon=$(median "${on[@]}") moff=$(median "${off[@]}")
awk -v on="$mon" -v off="$moff" 'BEGIN {
  printf "median: metrics off %.1f creates/s, on (scraped every 100 ms) %.1f creates/s: on/off = %.3f (%+.1f%%)\n",
         off, on, on / off, 100 * (on - off) / off }'
