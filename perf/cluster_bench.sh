#!/usr/bin/env bash
# perf/cluster_bench.sh: what the cluster's control plane costs, on this machine.
#
#  1. rate: dsec-load (create, run /bin/exit0, destroy; --count, --concurrency)
#     against one dsecd, then against a coordinator and N nodes on loopback
#     (tools/cluster; the coordinator runs sandboxes too: N+1 nodes), in the
#     same run; prints both rates and their ratio. On a 2-core machine the
#     nodes share the cores, so the point is what placement, heartbeats and the
#     extra hops cost, not more throughput.
#  2. layer distribution: a coordinator that runs no sandboxes (--slots 0) and
#     N nodes; a tool layer of --layer-mb MiB of random bytes is built on the
#     coordinator only; a batch of N sandboxes using it lands one per node, and
#     each node fetches it (1 MiB chunks over CAF, sha256 checked). Prints the
#     batch's create time then, and again once every node holds the layer.
#  3. failure detection: a coordinator and N nodes (N >= 2), a session with
#     sandboxes on every node, watched from Python (the SDK in build/python);
#     one node is killed with SIGKILL, another stopped with SIGSTOP (hung);
#     prints how long after each the session had a `lost` event for every
#     sandbox there (the promise: within 2 s).
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  cat <<USAGE

usage: perf/cluster_bench.sh [--nodes N] [--count C] [--concurrency K] [--layer-mb M]
  --nodes N         nodes besides the coordinator (default 3)
  --count C         episodes per rate run (default 2000)
  --concurrency K   episodes in flight (default 32)
  --layer-mb M      size of the distributed layer (default 100)
  --port P          first port (default 7400; uses P..P+N+1)
  --report DIR      also write each dsec-load run's report there: one.html,
                    many.html, fetch.html (dsec-load --report; JSON beside each)
USAGE
}
nodes=3 count=2000 conc=32 mb=100 port=7400 report=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0;;
    --report) [[ $# -ge 2 && -n "$2" ]] || { echo "cluster_bench.sh: --report needs a dir" >&2; exit 2; }
      mkdir -p "$2" || exit 2; report=$(cd "$2" && pwd); shift 2;;
    --nodes|--count|--concurrency|--layer-mb|--port)
      [[ $# -ge 2 && "$2" =~ ^[0-9]+$ && "$2" -gt 0 ]] || { echo "cluster_bench.sh: $1 needs a positive number" >&2; exit 2; }
      case "$1" in --nodes) nodes=$2;; --count) count=$2;; --concurrency) conc=$2;;
                   --layer-mb) mb=$2;; --port) port=$2;; esac
      shift 2;;
    *) echo "cluster_bench.sh: unknown argument '$1' (try --help)" >&2; exit 2;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "cluster_bench.sh: needs root" >&2; exit 1; }
dsec=$repo/build/tools/dsec dsecd=$repo/build/tools/dsecd load=$repo/build/tools/dsec-load
exit0=$repo/build/perf/exit0
for b in "$dsec" "$dsecd" "$load" "$exit0"; do
  [[ -x $b ]] || { echo "cluster_bench.sh: $b missing: ninja -C $repo/build" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/dsec-cluster-bench.XXXXXX")
single=""
cleanup() {
  [[ -n $single ]] && kill -TERM "$single" 2>/dev/null && wait "$single" 2>/dev/null || true
  "$repo/tools/cluster" down --dir "$work/cluster" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# The base: busybox and the exit0 binary.
mkdir -p "$work/root/bin"
cp /bin/busybox "$work/root/bin/"
ln -s busybox "$work/root/bin/sh"
cp "$exit0" "$work/root/bin/exit0"
build_base() { "$dsec" --state "$1" layer build --kind base perf-bb@1 "$work/root" >/dev/null; }
rate_of() { /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f %d %d %.2f %.2f" % (d["rate_per_s"], d["created"], d["failed"], d["create_ms"]["p50"], d["create_ms"]["p99"]))' "$1"; }
run_load() { # ADDR JSON ARGS...
  local addr=$1 json=$2 name
  shift 2
  local rep=()
  name=$(basename "$json" .json)
  # The measured runs (not the warm-ups) also write a report, with --report.
  [[ -n $report && $name != warm* ]] && rep=(--report "$report/$name.html")
  "$load" --connect "$addr" --quiet --json "$json" "${rep[@]}" "$@" >/dev/null
}

echo "== rate: one dsecd vs a coordinator and $nodes nodes ($count episodes, $conc at a time)"
mkdir -p "$work/single"
build_base "$work/single"
"$dsecd" --listen "127.0.0.1:$port" --state "$work/single" > "$work/single.log" 2>&1 &
single=$!
for _ in $(seq 100); do grep -q "listening on" "$work/single.log" && break; sleep 0.1; done
run_load "127.0.0.1:$port" "$work/warm1.json" --count 64 --concurrency "$conc" --base perf-bb@1 -- /bin/exit0
run_load "127.0.0.1:$port" "$work/one.json" --count "$count" --concurrency "$conc" --base perf-bb@1 -- /bin/exit0
kill -TERM "$single"; wait "$single" || true; single=""

"$repo/tools/cluster" up "$nodes" --dir "$work/cluster" --port $((port + 1)) >/dev/null
coord=127.0.0.1:$((port + 1))
build_base "$work/cluster/coordinator/state"
# Warm-up: every node fetches the base once.
run_load "$coord" "$work/warm2.json" --count $((64 * (nodes + 1))) --concurrency "$conc" --batch 16 --base perf-bb@1 -- /bin/exit0
run_load "$coord" "$work/many.json" --count "$count" --concurrency "$conc" --base perf-bb@1 -- /bin/exit0
"$dsec" --connect "$coord" cluster status
read -r r1 c1 f1 p50_1 p99_1 < <(rate_of "$work/one.json")
read -r rn cn fn p50_n p99_n < <(rate_of "$work/many.json")
printf '%-28s %8s %8s %8s %12s %12s\n' "" "rate/s" created failed "create p50" "create p99"
printf '%-28s %8s %8s %8s %10sms %10sms\n' "one dsecd" "$r1" "$c1" "$f1" "$p50_1" "$p99_1"
printf '%-28s %8s %8s %8s %10sms %10sms\n' "coordinator + $nodes nodes" "$rn" "$cn" "$fn" "$p50_n" "$p99_n"
/usr/bin/python3 -c 'import sys; print("ratio cluster / one: %.2f" % (float(sys.argv[2]) / float(sys.argv[1])))' "$r1" "$rn"
"$repo/tools/cluster" down --dir "$work/cluster" >/dev/null

echo
echo "== layer distribution: a ${mb} MiB tool layer from the coordinator to $nodes nodes"
"$repo/tools/cluster" up "$nodes" --dir "$work/cluster" --port $((port + 1)) --coordinator-slots 0 >/dev/null
cstate=$work/cluster/coordinator/state
build_base "$cstate"
mkdir -p "$work/big"
head -c $((mb * 1024 * 1024)) /dev/urandom > "$work/big/blob"
"$dsec" --state "$cstate" layer build --kind tool big@1 "$work/big"
# Every node holds the base first, so that only the big layer travels.
run_load "$coord" "$work/warm3.json" --count "$nodes" --concurrency "$nodes" --batch "$nodes" --base perf-bb@1 -- /bin/exit0
t0=$EPOCHREALTIME
run_load "$coord" "$work/fetch.json" --count "$nodes" --concurrency "$nodes" --batch "$nodes" --base perf-bb@1 --tool big@1 -- /bin/exit0
t1=$EPOCHREALTIME
run_load "$coord" "$work/cached.json" --count "$nodes" --concurrency "$nodes" --batch "$nodes" --base perf-bb@1 --tool big@1 -- /bin/exit0
t2=$EPOCHREALTIME
sleep 1.5 # a heartbeat or two, so that the table shows what each node fetched
"$dsec" --connect "$coord" cluster status
/usr/bin/python3 - "$work/fetch.json" "$work/cached.json" "$t0" "$t1" "$t2" "$mb" "$nodes" <<'PY'
import json, sys
f, c = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
t0, t1, t2, mb, n = map(float, sys.argv[3:8])
print("batch of %d with big@1, fetched by each node: create max %.0f ms (episodes %.2f s), %d created, %d failed"
      % (n, f["create_ms"]["max"], t1 - t0, f["created"], f["failed"]))
print("the same once every node holds it:          create max %.0f ms (episodes %.2f s)"
      % (c["create_ms"]["max"], t2 - t1))
print("distribution: %.0f MiB to %d nodes in %.2f s (%.0f MiB/s out of the coordinator)"
      % (mb, n, f["create_ms"]["max"] / 1000, mb * n / (f["create_ms"]["max"] / 1000)))
PY
"$repo/tools/cluster" down --dir "$work/cluster" >/dev/null

if [[ $nodes -ge 2 ]]; then
  echo
  echo "== failure detection: kill -9 of one node, SIGSTOP of another"
  "$repo/tools/cluster" up "$nodes" --dir "$work/cluster" --port $((port + 1)) >/dev/null
  build_base "$work/cluster/coordinator/state"
  PYTHONPATH=$repo/build/python /usr/bin/python3 - "$coord" "$work/cluster" <<'PY'
import os, signal, sys, time
import dsec
addr, cdir = sys.argv[1], sys.argv[2]
def pid_of(i):
    return int(open("%s/node-%d/pid" % (cdir, i)).read())
def port_of(i):
    return open("%s/node-%d/port" % (cdir, i)).read().strip()
with dsec.connect(addr) as c, c.session(quota=400, trajectory=False) as s:
    s.create(base="perf-bb@1", count=40)
    by_node = {}
    for i in s.list():
        by_node.setdefault(i.node, set()).add(i.id)
    events = s.events(timeout=10)
    for i, (how, sig) in enumerate([("killed (SIGKILL)", signal.SIGKILL),
                                    ("hung (SIGSTOP)", signal.SIGSTOP)], start=1):
        name = "127.0.0.1:" + port_of(i)
        doomed = set(by_node.get(name, ()))
        t0 = time.monotonic()
        os.kill(pid_of(i), sig)
        seen = set()
        for ev in events:
            if ev.kind == "lost" and ev.sandbox in doomed:
                seen.add(ev.sandbox)
                if seen == doomed:
                    break
        ms = (time.monotonic() - t0) * 1000
        print("node %s %s: %d of %d sandboxes reported lost after %.0f ms"
              % (name, how, len(seen), len(doomed), ms))
        if sig == signal.SIGSTOP:
            os.kill(pid_of(i), signal.SIGCONT)
PY
  "$repo/tools/cluster" down --dir "$work/cluster" >/dev/null
fi
