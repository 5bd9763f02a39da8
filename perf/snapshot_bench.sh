#!/usr/bin/env bash
# perf/snapshot_bench.sh: what snapshots cost (issue 16), in one run, on a
# dsecd of its own (a temporary state dir with a busybox base layer):
#   - pack_diff (`dsec snapshot`) of a sandbox whose writable layer holds
#     FILES files of SIZE_KB KiB (default 1,000 x 100 KiB = ~100 MiB), against
#     mkfs.erofs on a host copy of the same tree and tar of it (the peers);
#   - fork -n N (until all are ready) against N cold creates in one batch
#     (both through `dsec`, each one CLI call: `fork -n N` vs `run --detach`
#     of N in a loop is not a batch, so the cold side is `dsec-load`-free:
#     N `run --detach` calls, and their CLI start-up counts);
#   - pause and resume round trips (`dsec pause`/`resume`) against `dsec ps`
#     (the CLI's own round trip) of the same sandbox.
#
#   perf/snapshot_bench.sh [-f FILES] [-k SIZE_KB] [-n FORKS] [BUILD_DIR]
#
# Needs root, busybox and erofs-utils.
set -euo pipefail

files=1000
size_kb=100
forks=100
while getopts "f:k:n:h" opt; do
  case $opt in
    f) files=$OPTARG ;;
    k) size_kb=$OPTARG ;;
    n) forks=$OPTARG ;;
    h) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-f FILES] [-k SIZE_KB] [-n FORKS] [BUILD_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-$(dirname "$0")/../build}
dsec=$build/tools/dsec
dsecd=$build/tools/dsecd
export DSEC_SPAWNER=$build/tools/dsec-spawner
for b in "$dsec" "$dsecd" "$DSEC_SPAWNER"; do
  [ -x "$b" ] || { echo "snapshot_bench: no $b (build first)" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-snapshot-bench.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/base/bin"
cp /bin/busybox "$tmp/base/bin/busybox"
for a in sh cat head mkdir ls seq dd tar true; do ln -s busybox "$tmp/base/bin/$a"; done
"$dsec" --state "$tmp/state" layer build --kind base bb@1 "$tmp/base" >/dev/null
"$dsecd" --listen 127.0.0.1:0 --state "$tmp/state" --slots $((forks * 2 + 8)) \
  --default-memory 64m >"$tmp/dsecd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$tmp/dsecd.log" && break; sleep 0.1; done
addr=$(grep -o "listening on [0-9.:]*" "$tmp/dsecd.log" | awk '{print $3}')
d() { "$dsec" --connect "$addr" "$@"; }
ms() { date +%s%N | cut -c1-13; }

# ---- pack_diff vs mkfs.erofs on a copy vs tar ----
id=$(d run --detach --base bb@1 --memory 1g --disk $((files * size_kb * 2 + 65536))k -- sh -c 'exec sleep 100000')
d exec "$id" -- sh -c "mkdir /data; for i in \$(seq $files); do head -c $((size_kb * 1024)) /dev/urandom > /data/f\$i; done"
t0=$(ms); d snapshot "$id" --as bench@1 >/dev/null; t1=$(ms)
mkdir -p "$tmp/copy/data"
for ((i = 1; i <= files; i++)); do head -c $((size_kb * 1024)) /dev/urandom > "$tmp/copy/data/f$i"; done
t2=$(ms); mkfs.erofs --quiet "$tmp/copy.erofs" "$tmp/copy" >/dev/null; t3=$(ms)
t4=$(ms); tar -C "$tmp/copy" -cf "$tmp/copy.tar" .; t5=$(ms)
t6=$(ms); cp -a "$tmp/copy" "$tmp/copy2"; t7=$(ms)
echo "upper: $files files x $size_kb KiB"
echo "pack_diff (dsec snapshot, CLI round trip included): $((t1 - t0)) ms"
echo "mkfs.erofs on a host copy of the tree:              $((t3 - t2)) ms (+ the copy itself: $((t7 - t6)) ms)"
echo "tar of the host copy:                               $((t5 - t4)) ms"

# ---- pause / resume round trips vs ps ----
n=20
t0=$(ms); for ((i = 0; i < n; i++)); do d ps >/dev/null; done; t1=$(ms)
t2=$(ms); for ((i = 0; i < n; i++)); do d pause "$id" >/dev/null; d resume "$id" >/dev/null; done; t3=$(ms)
echo "dsec ps round trip (CLI baseline):   $(( (t1 - t0) / n )) ms"
echo "dsec pause / resume round trip each: $(( (t3 - t2) / (2 * n) )) ms"

# ---- fork -n N vs N cold creates ----
small=$(d run --detach --base bb@1 -- sh -c 'exec sleep 100000')
d exec "$small" -- sh -c 'mkdir /w; for i in $(seq 1000); do echo $i > /w/f$i; done'
t0=$(ms); d fork "$small" -n "$forks" > "$tmp/forks"; t1=$(ms)
t2=$(ms); for ((i = 0; i < forks; i++)); do d run --detach --base bb@1 -- sh -c 'exec sleep 100000' >> "$tmp/cold"; done; t3=$(ms)
echo "fork -n $forks (one call, until all ready): $((t1 - t0)) ms ($(wc -l < "$tmp/forks") made)"
echo "$forks cold creates (one CLI call each):   $((t3 - t2)) ms"
d rm $(cat "$tmp/forks" "$tmp/cold") "$id" "$small" >/dev/null
