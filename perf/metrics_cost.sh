#!/usr/bin/env bash
# perf/metrics_cost.sh: what /metrics costs (docs/observability.md, issue 21).
#
#   perf/metrics_cost.sh [-n EPISODES] [-r ROUNDS] [-c CONCURRENCY] [-i SECONDS]
#                        [--report DIR]
#                        (default 1000 episodes, 3 rounds, 8 at once, a scrape every 0.1 s;
#                        --report: each counted run's dsec-load report,
#                        DIR/roundR-metrics-on|off.html)
#
# Builds a busybox base layer in a temporary state dir, then in ROUNDS rounds
# runs dsec-load (create, `true`, destroy; EPISODES each) against a dsecd
# without --metrics and one with --metrics 127.0.0.1:0, alternating which goes
# first, after a warm-up run that is not counted. A curl loop scrapes every
# -i SECONDS (0.1: ten times Prometheus' usual 1 s) in both: the metrics port of the
# one, a closed port for the other, so that the scraper's own processes load
# the machine alike and the difference is dsecd's. Prints each run's creation
# rate and the ratio of the medians: the peer is the same daemon without
# metrics, in the same run. Root, like dsecd. Everything it made is removed at
# the end, also on failure.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD:-$root/build}"
n=1000 rounds=3 conc=8 every=0.1 report=""
while [ $# -gt 0 ]; do
  case "$1" in
    --report) [ $# -ge 2 ] && [ -n "$2" ] || { echo "perf/metrics_cost.sh: --report needs a dir" >&2; exit 2; }
      mkdir -p "$2" || exit 2; report=$(cd "$2" && pwd); shift 2;;
    -n) n="$2"; shift 2;;
    -r) rounds="$2"; shift 2;;
    -c) conc="$2"; shift 2;;
    -i) every="$2"; shift 2;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0;;
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
# A loopback port nothing listens on (bound and closed; the "off" runs' scrapes fail there).
closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# One dsec-load run against a fresh dsecd; prints its rate (creates/s).
run() { # on|off [REPORT_NAME]
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
  [ "$1" = on ] || mport=$closed
  ( while :; do curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null || true; sleep "$every"; done ) &
  spid=$!
  local rep=()
  [ -n "$report" ] && [ -n "${2:-}" ] && rep=(--report "$report/$2.html")
  "$build/tools/dsec-load" --connect "127.0.0.1:$port" --base mcost@1 --count "$n" \
    --concurrency "$conc" --quiet --json "$tmp/load.json" "${rep[@]}" -- true >/dev/null
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
    rate=$(run "$m" "round$r-metrics-$m")
    echo "round $r, metrics $m: $rate creates/s"
    if [ "$m" = on ]; then on+=("$rate"); else off+=("$rate"); fi
  done
done
# The direct figure: dsecd's CPU time (utime + stime of /proc/PID/stat) over
# 500 back-to-back scrapes of an idle daemon.
"$build/tools/dsecd" --listen 127.0.0.1:0 --state "$tmp/state" --slots 64 --metrics 127.0.0.1:0 >"$tmp/dsecd.out" 2>&1 &
dpid=$!
mport=""
for _ in $(seq 200); do
  mport=$(sed -n 's|.*metrics on http://127\.0\.0\.1:\([0-9]*\)/.*|\1|p' "$tmp/dsecd.out")
  [ -n "$mport" ] && break
  sleep 0.05
done
cpu() { awk '{sub(/.*\) /, ""); print $12 + $13}' "/proc/$dpid/stat"; }
c0=$(cpu)
for _ in $(seq 500); do curl -sf "http://127.0.0.1:$mport/metrics" >/dev/null; done
c1=$(cpu)
bytes=$(curl -sf "http://127.0.0.1:$mport/metrics" | wc -c)
kill -TERM "$dpid"; wait "$dpid" || true; dpid=""
awk -v a="$c0" -v b="$c1" -v t="$(getconf CLK_TCK)" -v bytes="$bytes" 'BEGIN {
  us = (b - a) / t / 500 * 1e6
  printf "dsecd CPU per scrape (%d bytes): %.0f us, i.e. %.3f%% of a core at one scrape a second\n",
         bytes, us, us / 1e4 }'

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mon=$(median "${on[@]}") moff=$(median "${off[@]}")
awk -v on="$mon" -v off="$moff" -v every="$every" 'BEGIN {
  printf "median: metrics off %.1f creates/s, on (scraped every %s s) %.1f creates/s: on/off = %.3f (%+.1f%%)\n",
         off, every, on, on / off, 100 * (on - off) / off }'
