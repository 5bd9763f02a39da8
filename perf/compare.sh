#!/usr/bin/env bash
# perf/compare.sh: one-shot sandboxes side by side, on the same layers, in one run.
#
# Each run is one command line started from this shell (fork + exec + wait), as
# a user would type it, timed with bash's $EPOCHREALTIME (no extra process):
#   bare            ROOTFS/bin/exit0 with no isolation at all (the ceiling)
#   dsec            dsec run --base perf-busybox@1 -- /bin/exit0
#   dsec-net        the same with --net (a fresh network namespace)
#   dsec-nolimits   dsec run with --memory none --pids none: no cgroup (what
#                   every sandbox has by default costs this much)
#   bwrap           bwrap --unshare-all (fresh network namespace too)
#   bwrap-sharenet  bwrap --unshare-all --share-net (no network namespace)
# The variants are interleaved (run i starts with variant i mod 5), so that the
# noise of a shared machine falls on all of them alike. Everything lives in a
# throwaway directory that is removed however the script ends.
set -euo pipefail
export LC_ALL=C # $EPOCHREALTIME with a '.' separator

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

usage() {
  cat <<EOF
usage: perf/compare.sh [-n RUNS] [--variants LIST] [--sequential]

Times one-shot sandboxes started from the shell: dsec run, bwrap --unshare-all
and bwrap --unshare-all --share-net (plus dsec run --net and a bare exec of the
same binary), all running the same static exit(0) binary from the same root
directory (dsec from a base layer built from it). Prints per variant the mean,
p50, p99 and max in ms, the rate (runs/s, one at a time), and the ratios.

Options:
  -n RUNS            runs per variant (default 200), after 5 warm-up runs each
  --variants LIST    comma-separated subset of: bare,dsec,dsec-net,dsec-nolimits,bwrap,
                     bwrap-sharenet
                     (default: all)
  --sequential       run each variant's runs back to back instead of interleaved
  -h, --help         this text

Environment:
  DSEC_BIN           the dsec binary (default: $repo/build/tools/dsec)
  DSEC_PERF_EXIT0    the static exit(0) binary (default: $repo/build/perf/exit0;
                     'ninja -C build' builds it)
  TMPDIR             where the throwaway state and root dirs go (default /tmp)

Needs root (dsec mounts layers). Build first: cd $repo && ninja -C build
EOF
}

runs=200
variants="bare,dsec,dsec-net,bwrap,bwrap-sharenet"
order=interleaved
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0;;
    -n) [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "compare.sh: -n needs a positive number" >&2; exit 2; }
        runs=$2; shift 2;;
    --variants) [[ $# -ge 2 ]] || { echo "compare.sh: --variants needs a list" >&2; exit 2; }
        variants=$2; shift 2;;
    --sequential) order=sequential; shift;;
    *) echo "compare.sh: unknown argument '$1' (try --help)" >&2; exit 2;;
  esac
done

dsec=${DSEC_BIN:-$repo/build/tools/dsec}
exit0=${DSEC_PERF_EXIT0:-$repo/build/perf/exit0}
bwrap=$(command -v bwrap || true)
[[ $(id -u) -eq 0 ]] || { echo "compare.sh: needs root" >&2; exit 1; }
[[ -x "$dsec" ]] || { echo "compare.sh: no dsec binary at $dsec (ninja -C build, or set DSEC_BIN)" >&2; exit 1; }
[[ -x "$exit0" ]] || { echo "compare.sh: no exit0 binary at $exit0 (ninja -C build, or set DSEC_PERF_EXIT0)" >&2; exit 1; }
[[ -x /bin/busybox ]] || { echo "compare.sh: /bin/busybox is missing (apt-get install busybox-static)" >&2; exit 1; }

IFS=, read -r -a names <<<"$variants"
for v in "${names[@]}"; do
  case "$v" in
    bare|dsec|dsec-net|dsec-nolimits) ;;
    bwrap|bwrap-sharenet) [[ -n "$bwrap" ]] || { echo "compare.sh: bwrap is not installed (apt-get install bubblewrap)" >&2; exit 1; };;
    *) echo "compare.sh: unknown variant '$v' (bare,dsec,dsec-net,dsec-nolimits,bwrap,bwrap-sharenet)" >&2; exit 2;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/dsec-compare.XXXXXX")
cleanup() { rm -rf -- "$work"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

root=$work/rootfs
state=$work/state
mkdir -p "$root"/{bin,dev,proc,tmp,etc}
cp /bin/busybox "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
cp "$exit0" "$root/bin/exit0"
chmod 0755 "$root/bin/exit0"
"$dsec" --state "$state" layer build --kind base perf-busybox@1 "$root" >/dev/null

# Each variant, run (quoted: paths may hold spaces) and shown.
run_variant() {
  case "$1" in
    bare) "$root/bin/exit0";;
    dsec) "$dsec" --state "$state" run --base perf-busybox@1 -- /bin/exit0;;
    dsec-net) "$dsec" --state "$state" run --net --base perf-busybox@1 -- /bin/exit0;;
    dsec-nolimits) "$dsec" --state "$state" run --memory none --pids none --base perf-busybox@1 -- /bin/exit0;;
    bwrap) "$bwrap" --unshare-all --ro-bind "$root" / --dev /dev --proc /proc /bin/exit0;;
    bwrap-sharenet) "$bwrap" --unshare-all --share-net --ro-bind "$root" / --dev /dev --proc /proc /bin/exit0;;
  esac
}
cmdline() {
  case "$1" in
    bare) echo "$root/bin/exit0";;
    dsec) echo "$dsec --state $state run --base perf-busybox@1 -- /bin/exit0";;
    dsec-net) echo "$dsec --state $state run --net --base perf-busybox@1 -- /bin/exit0";;
    dsec-nolimits) echo "$dsec --state $state run --memory none --pids none --base perf-busybox@1 -- /bin/exit0";;
    bwrap) echo "$bwrap --unshare-all --ro-bind $root / --dev /dev --proc /proc /bin/exit0";;
    bwrap-sharenet) echo "$bwrap --unshare-all --share-net --ro-bind $root / --dev /dev --proc /proc /bin/exit0";;
  esac
}

declare -A argv
for v in "${names[@]}"; do
  argv[$v]=$(cmdline "$v")
  : >"$work/times.$v"
done

# One timed run; appends microseconds to times.VARIANT. The command's output
# is discarded (exit0 prints nothing); a failure stops the script with it.
run_one() {
  local v=$1 t0 t1 rc=0
  t0=${EPOCHREALTIME/./}
  run_variant "$v" >/dev/null 2>"$work/err" || rc=$?
  t1=${EPOCHREALTIME/./}
  if [[ $rc -ne 0 ]]; then
    echo "compare.sh: '${argv[$v]}' failed with status $rc:" >&2
    cat "$work/err" >&2
    exit 1
  fi
  echo $((t1 - t0)) >>"$work/times.$v"
}

# Warm up (page cache, the system layer image, dsec's first-use work).
for v in "${names[@]}"; do
  for _ in 1 2 3 4 5; do run_one "$v"; done
  : >"$work/times.$v"
done

nv=${#names[@]}
start=${EPOCHREALTIME/./}
if [[ $order == interleaved ]]; then
  for ((i = 0; i < runs; i++)); do
    for ((j = 0; j < nv; j++)); do
      run_one "${names[$(((i + j) % nv))]}"
    done
  done
else
  for v in "${names[@]}"; do
    for ((i = 0; i < runs; i++)); do run_one "$v"; done
  done
fi
total_s=$(awk -v a="$start" -v b="${EPOCHREALTIME/./}" 'BEGIN { printf "%.1f", (b - a) / 1e6 }')

echo "perf/compare.sh: $runs runs per variant, $order, $(nproc) CPUs, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg), ${total_s} s in all"
printf '%-15s %9s %9s %9s %9s %9s  %s\n' variant mean_ms p50_ms p99_ms max_ms runs/s "command"
declare -A mean p50
for v in "${names[@]}"; do
  read -r m p5 p9 mx < <(sort -n "$work/times.$v" | awk '
    { t[NR] = $1; s += $1 }
    END {
      i50 = int(0.50 * (NR - 1) + 0.5) + 1; i99 = int(0.99 * (NR - 1) + 0.5) + 1
      printf "%.3f %.3f %.3f %.3f\n", s / NR / 1000, t[i50] / 1000, t[i99] / 1000, t[NR] / 1000
    }')
  mean[$v]=$m
  p50[$v]=$p5
  rate=$(awk -v m="$m" 'BEGIN { printf "%.0f", 1000 / m }')
  printf '%-15s %9s %9s %9s %9s %9s  %s\n' "$v" "$m" "$p5" "$p9" "$mx" "$rate" "${argv[$v]//$work/\$TMP}"
done

# Ratios of mean times (and of p50s): below 1 means the first is faster.
ratio() {
  local a=$1 b=$2
  [[ -n "${mean[$a]:-}" && -n "${mean[$b]:-}" ]] || return 0
  awk -v a="$a" -v b="$b" -v ma="${mean[$a]}" -v mb="${mean[$b]}" -v pa="${p50[$a]}" -v pb="${p50[$b]}" 'BEGIN {
    r = ma / mb
    printf "  %-15s / %-15s  mean %5.2fx  p50 %5.2fx  (%s is %.2fx %s)\n", a, b, r, pa / pb, a,
      r < 1 ? 1 / r : r, r < 1 ? "faster" : "slower"
  }'
}
echo "ratios (time per run):"
ratio dsec bwrap
ratio dsec bwrap-sharenet
ratio dsec-net bwrap
ratio dsec-net bwrap-sharenet
ratio dsec dsec-nolimits
ratio dsec bare
ratio bwrap bare
