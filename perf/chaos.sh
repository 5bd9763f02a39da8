#!/usr/bin/env bash
# perf/chaos.sh: a chaos run (issue 19; docs/cluster.md "Chaos").
#
#   perf/chaos.sh [--plan FILE | --minutes M] [OPTIONS] [-- DSEC-CHAOS OPTIONS]
#
# Brings up a cluster with tools/cluster (a coordinator that holds no
# sandboxes and N nodes, each daemon in a network namespace of its own, each
# state dir on a small disk of its own), runs dsec-chaos in the fabric's namespace:
# a trainer's load while the plan's faults are injected (kill -9 and restart
# of a node or the coordinator, SIGSTOP/SIGCONT, a partition and its healing,
# a slow link, a full state disk, a new layer every node must fetch), with the
# invariants checked at every step and at the end; then brings the cluster
# down and checks that nothing is left on the machine: no process, mount,
# cgroup, network namespace, link, nftables table or file of it. Prints
# dsec-chaos's table and exits non-zero on any violation or leftover.
#
# Options:
#   --plan FILE     the faults (dsec-chaos --help: AT ACTION [NAME [ARG]])
#   --minutes M     without --plan: a plan of M minutes made from --seed that
#                   cycles through every fault kind on random targets, one
#                   fault every ~15 s, each undone before the next (default 2)
#   --seed N        the seed of the plan and of the load (default 1)
#   --nodes N       nodes besides the coordinator (default 3)
#   --dir DIR       the cluster's dir (default: a new one under /tmp)
#   --port P        the coordinator's port (default 7600)
#   --json FILE     dsec-chaos's figures as JSON
#   --logs DIR      keep the daemons' logs and tools/cluster's output there
# The binaries: build/ (dsecd, dsec, perf/dsec-chaos), or $DSECD, $DSEC and
# $DSEC_CHAOS. Needs root, iproute2 (ip, tc with sch_tbf), nftables, busybox.
# Exit status: 0 no violation and nothing left; 1 a violation or a leftover;
# 2 bad arguments; 77 this machine cannot run it (what is missing is said).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
usage() { sed -n '2,/^[^#]/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; }
bad() { echo "perf/chaos.sh: $*" >&2; echo "Try 'perf/chaos.sh --help'." >&2; exit 2; }
skip() { echo "perf/chaos.sh: skipped: $*"; exit 77; }

plan="" minutes=2 seed=1 nodes=3 dir="" port=7600 json="" logs="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0;;
    --plan) [ $# -ge 2 ] || bad "--plan needs a value"; plan="$2"; shift 2;;
    --minutes) [ $# -ge 2 ] || bad "--minutes needs a value"; minutes="$2"; shift 2;;
    --seed) [ $# -ge 2 ] || bad "--seed needs a value"; seed="$2"; shift 2;;
    --nodes) [ $# -ge 2 ] || bad "--nodes needs a value"; nodes="$2"; shift 2;;
    --dir) [ $# -ge 2 ] || bad "--dir needs a value"; dir="$2"; shift 2;;
    --port) [ $# -ge 2 ] || bad "--port needs a value"; port="$2"; shift 2;;
    --json) [ $# -ge 2 ] || bad "--json needs a value"; json="$2"; shift 2;;
    --logs) [ $# -ge 2 ] || bad "--logs needs a value"; logs="$2"; shift 2;;
    --) shift; extra=("$@"); break;;
    *) bad "unknown argument '$1'";;
  esac
done
[[ "$minutes" =~ ^[0-9]+$ ]] && [ "$minutes" -ge 1 ] || bad "--minutes: expected a whole number of minutes, got '$minutes'"
[[ "$seed" =~ ^[0-9]+$ ]] || bad "--seed: expected a whole number, got '$seed'"
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 2 ] && [ "$nodes" -le 16 ] || bad "--nodes: expected 2 to 16, got '$nodes'"
[ -z "$plan" ] || [ -r "$plan" ] || bad "--plan: cannot read '$plan'"

[ "$(id -u)" -eq 0 ] || skip "needs root (namespaces, mounts, cgroups)"
export PATH="/usr/sbin:/sbin:$PATH"
for t in ip tc nft nsenter busybox; do
  command -v "$t" >/dev/null || skip "no $t on this machine"
done
dsecd="${DSECD:-$root/build/tools/dsecd}"
dsec="${DSEC:-$root/build/tools/dsec}"
chaos="${DSEC_CHAOS:-$root/build/perf/dsec-chaos}"
for b in "$dsecd" "$dsec" "$chaos"; do
  [ -x "$b" ] || bad "no $b: build first (ninja -C build)"
done
export DSECD="$dsecd" DSEC="$dsec"
unset DSEC_TLS
script="$root/tools/cluster"

# iproute2's first `ip netns add` makes /run/netns a mount of its own, which
# stays: made before the snapshot, so that it is the machine's, not the run's.
probe="dsec-chaos-probe-$$"
ip netns add "$probe" && ip netns del "$probe" || skip "ip netns add does not work here"
probe_tbf() { # sch_tbf, for `slow`
  ip netns add "$probe" || return 1
  ip -n "$probe" link add a0 type veth peer name b0 \
    && ip netns exec "$probe" tc qdisc add dev a0 root tbf rate 1mbit burst 32kbit latency 400ms
  local ok=$?
  ip netns del "$probe"
  return $ok
}
probe_tbf 2>/dev/null || skip "tc's tbf qdisc is not available (sch_tbf)"

# What the machine has now: compared after the run.
snapshot() {
  echo "## mounts"; awk '{print $5, $9}' /proc/self/mountinfo | sort
  echo "## cgroups"; find /sys/fs/cgroup -type d -path '*dsec*' 2>/dev/null | sort
  echo "## netns"; ip netns list 2>/dev/null | awk '{print $1}' | sort
  echo "## links"; ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
  echo "## nft"; nft list tables 2>/dev/null | sort
  echo "## loop devices"; losetup -a 2>/dev/null | sort
  echo "## processes"
  local p exe
  for p in /proc/[0-9]*; do
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case "$exe" in "$dsecd"|"$dsec"|"$chaos"|*/dsec-spawner) echo "${p#/proc/} $exe";; esac
  done | sort
}

[ -n "$dir" ] || dir=$(mktemp -d /tmp/dsec-chaos.XXXXXX)
dir=$(realpath -m -- "$dir")
work=$(mktemp -d /tmp/dsec-chaos-work.XXXXXX)
before="$work/before"
snapshot > "$before"
cleanup() {
  if [ -n "$logs" ] && [ -d "$dir/c" ]; then
    mkdir -p "$logs"
    for d in "$dir/c"/coordinator "$dir/c"/node-*; do cp "$d/log" "$logs/$(basename "$d").log" 2>/dev/null || true; done
    cp "$work/up.log" "$logs/" 2>/dev/null || true
  fi
  "$script" down --dir "$dir/c" > "$work/down.log" 2>&1 || { echo "perf/chaos.sh: tools/cluster down failed:" >&2; cat "$work/down.log" >&2; }
}
trap 'cleanup; rm -rf "$work"; rmdir "$dir" 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM

if [ -z "$plan" ]; then
  # Every fault kind in turn on random targets, each undone ~7 s later.
  plan="$work/plan"
  awk -v seed="$seed" -v minutes="$minutes" -v nodes="$nodes" 'BEGIN {
    srand(seed)
    split("slow kill stop partition fill coordinator", kinds, " ")
    t = 5; k = 0; end = minutes * 60 - 20
    while (t + 12 < end) {
      kind = kinds[k % 6 + 1]; k++
      node = "node-" int(1 + rand() * nodes)
      if (kind == "slow") { printf "%d slow coordinator %dkbit\n%d layer\n%d fast coordinator\n", t, 2000 + int(rand() * 4000), t + 1, t + 10 }
      else if (kind == "kill") { printf "%d kill %s\n%d restart %s\n", t, node, t + 4, node }
      else if (kind == "stop") { printf "%d stop %s\n%d cont %s\n", t, node, t + 3 + int(rand() * 4), node }
      else if (kind == "partition") { printf "%d partition %s\n%d heal %s\n", t, node, t + 8, node }
      else if (kind == "fill") { printf "%d fill %s\n%d layer\n%d free %s\n", t, node, t + 1, t + 8, node }
      else { printf "%d kill coordinator\n%d restart coordinator\n", t, t + 3 }
      t += 15 + int(rand() * 5)
    }
    printf "%d end\n", minutes * 60
  }' > "$plan"
fi
echo "perf/chaos.sh: plan:"; sed 's/^/  /' "$plan"

# The base: busybox, and every applet the load runs.
mkdir -p "$work/src/bin"
cp "$(command -v busybox)" "$work/src/bin/busybox"
# A 64m state disk holds a dozen of the base's versions; below 8m free a node
# admits nothing (dsecd --min-free-disk), so that `fill` moves creates elsewhere.
"$script" up "$nodes" --netns --state-size 64m --dir "$dir/c" --port "$port" --slots 32 \
  --coordinator-slots 0 -- --min-free-disk 8m > "$work/up.log" 2>&1 \
  || { cat "$work/up.log" >&2; echo "perf/chaos.sh: tools/cluster up failed" >&2; exit 1; }
"$dsec" --state "$dir/c/coordinator/state" layer build --kind base chaosbase@1 "$work/src" > /dev/null
nsid=$(printf '%s' "$dir/c" | sha256sum | cut -c1-6)

status=0
args=(--cluster "$dir/c" --plan "$plan" --base chaosbase@1 --layer-src "$work/src"
      --script "$script" --dsec "$dsec" --seed "$seed")
[ -z "$json" ] || args+=(--json "$json")
nsenter --net="/run/netns/dsec-$nsid-fabric" -- "$chaos" "${args[@]}" "${extra[@]}" || status=$?

# The daemons' complaints, for whoever reads a failed run.
if [ "$status" -ne 0 ]; then
  for d in "$dir/c"/coordinator "$dir/c"/node-*; do
    echo "---- $(basename "$d") log (last 15 lines)"; tail -n 15 "$d/log" 2>/dev/null || true
  done
fi
cleanup
[ -z "$logs" ] || cp "$work/down.log" "$logs/" 2>/dev/null || true
trap 'rm -rf "$work"; rmdir "$dir" 2>/dev/null || true' EXIT
# Nothing of the run is left: what the machine had before, and no more.
left=""
for i in $(seq 1 20); do
  snapshot > "$work/after"
  left=$(diff "$before" "$work/after" | grep '^>' || true)
  [ -n "$left" ] || break
  sleep 0.5
done
[ ! -e "$dir/c" ] || left+=$'\n'"> $dir/c (the cluster's dir)"
if [ -n "$left" ]; then
  echo "perf/chaos.sh: left on the machine after down:"
  echo "$left" | sed 's/^> /  /'
  status=1
else
  echo "perf/chaos.sh: nothing left on the machine after down"
fi
exit "$status"
