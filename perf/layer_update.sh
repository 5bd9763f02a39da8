#!/usr/bin/env bash
# perf/layer_update.sh: what a tool update costs. Builds a tool layer of
# FILES files (SIZE_KB KiB each, random bytes) as tool@1, changes one file,
# builds tool@2, and reports each build's wall time and what the store holds:
# an update rebuilds that one layer, and the store holds the sum of the
# layers, never one image per environment.
#
#   perf/layer_update.sh [-f FILES] [-k SIZE_KB] [DSEC_BIN]
#
# Needs erofs-utils. Uses a temporary state dir, removed at the end.
set -euo pipefail

files=2000
size_kb=50
while getopts "f:k:h" opt; do
  case $opt in
    f) files=$OPTARG ;;
    k) size_kb=$OPTARG ;;
    h) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-f FILES] [-k SIZE_KB] [DSEC_BIN]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
dsec=${1:-$(dirname "$0")/../build/tools/dsec}
[ -x "$dsec" ] || { echo "layer_update: no dsec at $dsec (build first, or give its path)" >&2; exit 2; }
case $files$size_kb in *[!0-9]*) echo "layer_update: -f and -k take whole numbers" >&2; exit 2 ;; esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-layer-update.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
src=$tmp/tool
mkdir -p "$src/lib"
for ((i = 0; i < files; i++)); do
  head -c $((size_kb * 1024)) /dev/urandom > "$src/lib/f$i"
done
total_mb=$(( files * size_kb / 1024 ))

ms() { date +%s%3N; }
t0=$(ms); "$dsec" --state "$tmp/state" layer build --kind tool tool@1 "$src" >/dev/null; t1=$(ms)
echo "changed" >> "$src/lib/f0"
t2=$(ms); "$dsec" --state "$tmp/state" layer build --kind tool tool@2 "$src" >/dev/null; t3=$(ms)
store_mb=$(du -sm "$tmp/state" | cut -f1)
echo "tool layer: $files files, $total_mb MiB"
echo "build tool@1: $((t1 - t0)) ms"
echo "update one file, build tool@2: $((t3 - t2)) ms (only this layer; bases and workdirs untouched)"
echo "store after both: $store_mb MiB (two images of ~$total_mb MiB each: the sum of the layers)"
