#!/usr/bin/env bash
# perf/transfer_bench.sh: what a file transfer costs (issue 20), for each
# build dir given (e.g. main's and this branch's), on a dsecd of its own (a
# temporary state dir with a busybox base layer), for files of each SIZE:
#   - `dsec cp FILE ID:/tmp` (put) and `dsec cp ID:/tmp/FILE DIR` (get):
#     wall time and MB/s, dsecd's peak RSS during the copy (VmHWM, reset
#     through /proc/PID/clear_refs before it) and the CLI's (/usr/bin/time %M);
#   - the docker-less baseline in the same run: `tar -c FILE | tar -x` on the
#     host, its MB/s, and the ratio dsec / baseline (below 1: dsec is slower).
# A copy that fails says so (main's get refuses more than 256 MiB).
#
#   perf/transfer_bench.sh [-s "100 1024"] BUILD_DIR...   (sizes in MiB)
#
# The files and the copies go to $DSEC_BENCH_DATA (default: the temporary
# dir; /dev/shm keeps a full disk out of it), the state dir to $TMPDIR or
# /tmp (its images are mounted: not on a tmpfs). Needs root and busybox.
# Leaves nothing behind.
set -euo pipefail

sizes="100 1024"
while getopts "s:h" opt; do
  case $opt in
    s) sizes=$OPTARG ;;
    h) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-s SIZES_MIB] BUILD_DIR..." >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || set -- "$(dirname "$0")/../build"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-transfer-bench.XXXXXX")
data=$(mktemp -d "${DSEC_BENCH_DATA:-$tmp}/dsec-transfer-data.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp" "$data"
}
trap cleanup EXIT
mkdir -p "$tmp/base/bin"
cp /bin/busybox "$tmp/base/bin/busybox"
for a in sh cat rm sleep tar true; do ln -s busybox "$tmp/base/bin/$a"; done
for s in $sizes; do head -c $((s * 1048576)) /dev/urandom > "$data/f$s"; done
ms() { date +%s%N | cut -c1-13; }
hwm() { awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$1/status"; }
mbs() { awk -v b="$1" -v t="$2" 'BEGIN { if (t < 1) t = 1; printf "%.0f", b / 1048576 / (t / 1000) }'; }

echo "| build | size | op | time | MB/s | vs tar\|tar | dsecd peak RSS | CLI peak RSS |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for build in "$@"; do
  dsec=$build/tools/dsec
  dsecd=$build/tools/dsecd
  export DSEC_SPAWNER=$build/tools/dsec-spawner
  for b in "$dsec" "$dsecd" "$DSEC_SPAWNER"; do
    [ -x "$b" ] || { echo "transfer_bench: no $b (build first)" >&2; exit 2; }
  done
  rm -rf "$tmp/state"
  "$dsec" --state "$tmp/state" layer build --kind base bb@1 "$tmp/base" >/dev/null
  "$dsecd" --listen 127.0.0.1:0 --state "$tmp/state" >"$tmp/dsecd.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$tmp/dsecd.log" && break; sleep 0.1; done
  addr=$(grep -o "listening on [0-9.:]*" "$tmp/dsecd.log" | awk '{print $3}')
  d() { "$dsec" --connect "$addr" "$@"; }
  id=$(d run --detach --base bb@1 --memory 3g --disk 2500m -- sh -c 'exec sleep 100000')
  for s in $sizes; do
    f=$data/f$s
    bytes=$((s * 1048576))
    # the baseline: the host's tar into the host's tar
    rm -rf "$data/base-out"; mkdir "$data/base-out"
    t0=$(ms); tar -c -C "$data" "f$s" | tar -x -C "$data/base-out"; t1=$(ms)
    base=$(mbs $bytes $((t1 - t0)))
    rm -rf "$data/base-out"
    # put
    echo 5 > "/proc/$pid/clear_refs"
    t0=$(ms)
    if /usr/bin/time -f %M -o "$tmp/cli" "$dsec" --connect "$addr" cp "$f" "$id:/tmp" 2>"$tmp/err"; then
      t1=$(ms); r=$(mbs $bytes $((t1 - t0)))
      echo "| $build | ${s} MiB | put | $((t1 - t0)) ms | $r | $(awk -v a=$r -v b=$base 'BEGIN{printf "%.2f", a/b}') (tar\|tar $base MB/s) | $(hwm $pid) MiB | $(( $(tail -1 "$tmp/cli") / 1024 )) MiB |"
    else
      echo "| $build | ${s} MiB | put | fails: $(head -c 120 "$tmp/err" | tr '\n|' '  ') | | | $(hwm $pid) MiB | |"
    fi
    # get
    rm -rf "$data/out"; mkdir "$data/out"
    echo 5 > "/proc/$pid/clear_refs"
    t0=$(ms)
    if /usr/bin/time -f %M -o "$tmp/cli" "$dsec" --connect "$addr" cp "$id:/tmp/f$s" "$data/out" 2>"$tmp/err"; then
      t1=$(ms); r=$(mbs $bytes $((t1 - t0)))
      cmp -s "$f" "$data/out/f$s" || echo "transfer_bench: the get of f$s differs" >&2
      echo "| $build | ${s} MiB | get | $((t1 - t0)) ms | $r | $(awk -v a=$r -v b=$base 'BEGIN{printf "%.2f", a/b}') (tar\|tar $base MB/s) | $(hwm $pid) MiB | $(( $(tail -1 "$tmp/cli") / 1024 )) MiB |"
    else
      echo "| $build | ${s} MiB | get | fails: $(head -c 120 "$tmp/err" | tr '\n|' '  ') | | | $(hwm $pid) MiB | |"
    fi
    rm -rf "$data/out"
    d exec "$id" -- rm -f "/tmp/f$s" >/dev/null
  done
  d rm "$id" >/dev/null
  kill "$pid"; wait "$pid" 2>/dev/null || true
  pid=
done
