#!/usr/bin/env bash
# perf/sim_bench.sh: the control plane at full cluster scale, on one machine.
#
# A `dsecd --coordinator --backend sim --sim-nodes N` (simulated nodes and
# sandboxes in the coordinator's process, no runtime) and the real dsec-load in
# its own process, so that every request crosses CAF's network layer:
#  1. batched: --count B_COUNT sandboxes created in requests of --batch, all
#     held live (--hold), then destroyed; prints placements/s (all created
#     over the time until they all existed);
#  2. unbatched: the same with --batch 1;
#  3. density: --hold of --live sandboxes; at the peak (dsec-load's
#     --peak-file) reads the coordinator's VmRSS and VmHWM from /proc and
#     prints KiB per live sandbox (RSS at the peak minus RSS before the run,
#     over the count).
# Needs no root and no state dir.
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
usage() {
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  cat <<USAGE

usage: perf/sim_bench.sh [--build DIR] [--nodes N] [--count C] [--unbatched-count U]
                         [--live L] [--batch B] [--concurrency K] [--threads T] [--port P]
  --build DIR       the build dir (default $repo/build)
  --nodes N         simulated nodes (default 160)
  --count C         sandboxes of the batched run (default 200000)
  --unbatched-count U   of the unbatched run (default 50000)
  --live L          sandboxes live at once in the density run (default 380000)
  --batch B         sandboxes per create request in the batched run (default 1000)
  --concurrency K   creates in flight (default 4096)
  --threads T       the coordinator's CAF threads (default 2)
  --port P          the coordinator's port (default 7500)
  --report DIR      also write each dsec-load run's report there: batched.html,
                    unbatched.html, density.html (dsec-load --report)
USAGE
}
build=$repo/build nodes=160 count=200000 ucount=50000 live=380000 batch=1000 conc=4096
threads=2 port=7500 report=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0;;
    --report) [[ $# -ge 2 && -n "$2" ]] || { echo "sim_bench.sh: --report needs a dir" >&2; exit 2; }
      mkdir -p "$2" || exit 2; report=$(cd "$2" && pwd); shift 2;;
    --build) [[ $# -ge 2 ]] || { echo "sim_bench.sh: --build needs a dir" >&2; exit 2; }
      build=$2; shift 2;;
    --nodes|--count|--unbatched-count|--live|--batch|--concurrency|--threads|--port)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || { echo "sim_bench.sh: $1 needs a positive number" >&2; exit 2; }
      case "$1" in --nodes) nodes=$2;; --count) count=$2;; --unbatched-count) ucount=$2;;
                   --live) live=$2;; --batch) batch=$2;; --concurrency) conc=$2;;
                   --threads) threads=$2;; --port) port=$2;; esac
      shift 2;;
    *) echo "sim_bench.sh: unknown argument '$1' (try --help)" >&2; exit 2;;
  esac
done
dsecd=$build/tools/dsecd load=$build/tools/dsec-load
for b in "$dsecd" "$load"; do
  [[ -x $b ]] || { echo "sim_bench.sh: $b missing: ninja -C $build" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/dsec-sim-bench.XXXXXX")
daemon=""
cleanup() {
  if [[ -n $daemon ]]; then kill -TERM "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

start() {
  "$dsecd" --coordinator --backend sim --sim-nodes "$nodes" --threads "$threads" \
    --listen "127.0.0.1:$port" > "$work/dsecd.log" 2>&1 &
  daemon=$!
  for _ in $(seq 600); do
    grep -q "listening on" "$work/dsecd.log" && [[ $(grep -c "joined" "$work/dsecd.log") -ge $nodes ]] && return 0
    kill -0 "$daemon" 2>/dev/null || { cat "$work/dsecd.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "sim_bench.sh: the simulated nodes did not all join" >&2; exit 1
}
stop() { kill -TERM "$daemon"; wait "$daemon" || true; daemon=""; }
kib() { awk -v k="$1" '$1 == k":" { print $2 }' "/proc/$daemon/status"; }
field() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2], 0))' "$1" "$2"; }

# NAME ARGS...: one --hold run (its report NAME.html, with --report); prints
# "placements/s created failed"
run_hold() {
  local json=$work/load.json rep=()
  [[ -n $report ]] && rep=(--report "$report/$1.html")
  shift
  "$load" --connect "127.0.0.1:$port" --quiet --json "$json" "${rep[@]}" --hold --commands 0 \
    --base sim@1 "$@" > "$work/load.out" || true
  printf '%.0f %s %s\n' "$(field "$json" placements_per_s)" "$(field "$json" created)" "$(field "$json" failed)"
}

echo "== $nodes simulated nodes; dsec-load in its own process over loopback"
start
read -r rate created failed < <(run_hold batched --count "$count" --concurrency "$conc" --batch "$batch" --sessions 4)
echo "batched   (--count $count --batch $batch --concurrency $conc): $rate placements/s ($created created, $failed failed)"
read -r rate created failed < <(run_hold unbatched --count "$ucount" --concurrency "$conc" --batch 1 --sessions 4)
echo "unbatched (--count $ucount --batch 1 --concurrency $conc): $rate placements/s ($created created, $failed failed)"
stop

start
before=$(kib VmRSS)
peak=$work/peak
rm -f "$peak"
density_rep=()
[[ -n $report ]] && density_rep=(--report "$report/density.html")
"$load" --connect "127.0.0.1:$port" --quiet --json "$work/live.json" "${density_rep[@]}" --hold --commands 0 \
  --base sim@1 --count "$live" --concurrency "$conc" --batch "$batch" --sessions 4 \
  --peak-file "$peak" > "$work/live.out" &
loader=$!
while [[ ! -f $peak ]] && kill -0 "$loader" 2>/dev/null; do sleep 0.2; done
if [[ -f $peak ]]; then
  n=$(cat "$peak")
  sleep 1 # let the last messages settle
  rss=$(kib VmRSS) hwm=$(kib VmHWM)
  rm -f "$peak"
  wait "$loader" || true
  echo "density: $n live sandboxes: coordinator VmRSS $((rss / 1024)) MiB (VmHWM $((hwm / 1024)) MiB, $((before / 1024)) MiB before)"
  awk -v r="$rss" -v b="$before" -v n="$n" 'BEGIN { printf "          %.2f KiB per live sandbox (RSS at the peak minus before, over %d)\n", (r - b) / n, n }'
  awk -v r="$rss" 'BEGIN { printf "          %s 1 GiB\n", r < 1048576 ? "under" : "NOT under" }'
else
  wait "$loader" || true
  echo "density: dsec-load ended before all $live existed:" >&2
  cat "$work/live.out" >&2
fi
stop
