#!/usr/bin/env bash
# perf/oci_bench.sh: what OCI images cost (issue 15's benchmark).
#  1. Pull + convert an image of one base layer of SIZE_MB random bytes (plus a
#     busybox layer) from a docker-registry on loopback, against `skopeo copy`
#     to an OCI dir + `umoci unpack` of the same image, same run; then a second
#     image sharing that base: time and bytes the store gains.
#  2. Create rate of sandboxes whose base has 1, 5 and 20 lowers (dsec-load
#     --embedded, create + exec `true` + destroy), each against 1 lower.
#
#   perf/oci_bench.sh [-s SIZE_MB] [-n COUNT] [-r REPORT_DIR] [BUILD_DIR]
#   (-r: each create-rate run's dsec-load report, REPORT_DIR/lowers-N.html)
#
# Needs docker-registry, skopeo, umoci, python3 (tools/setup installs them).
# Uses temporary dirs and a registry on a free loopback port, removed at the end.
set -euo pipefail

size_mb=200
count=400
report=""
while getopts "s:n:r:h" opt; do
  case $opt in
    r) mkdir -p "$OPTARG" && report=$(cd "$OPTARG" && pwd) || exit 2 ;;
    s) size_mb=$OPTARG ;;
    n) count=$OPTARG ;;
    h) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-s SIZE_MB] [-n COUNT] [-r REPORT_DIR] [BUILD_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
dsec=$build/tools/dsec
load=$build/tools/dsec-load
for t in docker-registry skopeo umoci python3; do
  command -v $t >/dev/null || { echo "oci_bench: needs $t (tools/setup)" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-oci-bench.XXXXXX")
reg_pid=
cleanup() { [ -n "$reg_pid" ] && kill "$reg_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
state=$tmp/state
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$tmp/config.yml" <<EOF
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $tmp/registry}}
http: {addr: "127.0.0.1:$port", secret: bench}
EOF
docker-registry serve "$tmp/config.yml" >/dev/null 2>&1 &
reg_pid=$!
echo '{"default":[{"type":"insecureAcceptAnything"}]}' > "$tmp/policy.json"

# The images: a busybox layer, a big random layer (the shared base), and a small top.
head -c $((size_mb << 20)) /dev/urandom > "$tmp/big.bin"
bb='{"compress":"none","entries":[{"name":"bin","type":"dir"},{"name":"bin/busybox","type":"file","source":"/bin/busybox","mode":493},{"name":"bin/sh","type":"symlink","target":"busybox"},{"name":"bin/true","type":"symlink","target":"busybox"}]}'
big='{"compress":"none","entries":[{"name":"data","type":"dir"},{"name":"data/big.bin","type":"file","source":"'$tmp/big.bin'"}]}'
top() { echo '{"compress":"none","entries":[{"name":"top-'$1'","type":"file","content":"'$1'"}]}'; }
cat > "$tmp/spec.json" <<EOF
{"dir": "$tmp/layout", "images": [
 {"tag": "one", "layers": [$bb, $big, $(top one)]},
 {"tag": "two", "layers": [$bb, $big, $(top two)]}]}
EOF
python3 "$here/../test/oci/make_layout.py" "$tmp/spec.json" >/dev/null
for _ in $(seq 50); do curl -s "http://127.0.0.1:$port/v2/" >/dev/null && break; sleep 0.1; done
for t in one two; do
  skopeo --policy "$tmp/policy.json" copy --quiet --dest-tls-verify=false \
    "oci:$tmp/layout:$t" "docker://127.0.0.1:$port/bench/img:$t"
done

now() { date +%s.%N; }
du_b() { du -sb "$1" 2>/dev/null | cut -f1; }
echo "== pull + convert, ${size_mb} MiB image =="
t0=$(now); "$dsec" --state "$state" layer pull --as one@1 "http://127.0.0.1:$port/bench/img:one" >/dev/null; t1=$(now)
b1=$(du_b "$state/blobs")
t2=$(now)
skopeo --policy "$tmp/policy.json" copy --quiet --src-tls-verify=false \
  "docker://127.0.0.1:$port/bench/img:one" "oci:$tmp/skopeo:one"
umoci unpack --image "$tmp/skopeo:one" "$tmp/bundle" >/dev/null
t3=$(now)
b2=$(( $(du_b "$tmp/skopeo") + $(du_b "$tmp/bundle") ))
t4=$(now); "$dsec" --state "$state" layer pull --as two@1 "http://127.0.0.1:$port/bench/img:two" >/dev/null; t5=$(now)
b3=$(du_b "$state/blobs")
python3 - "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" "$b1" "$b2" "$b3" <<'EOF'
import sys
t0,t1,t2,t3,t4,t5 = map(float, sys.argv[1:7]); b1,b2,b3 = map(int, sys.argv[7:10])
print(f"dsec layer pull (fetch, verify, unpack, mkfs.erofs): {t1-t0:.2f} s, {b1/2**20:.1f} MiB stored")
print(f"skopeo copy + umoci unpack:                          {t3-t2:.2f} s, {b2/2**20:.1f} MiB on disk")
print(f"ratio: {(t1-t0)/(t3-t2):.2f}x the time")
print(f"second image sharing the base: {t5-t4:.2f} s, +{(b3-b1)/2**10:.0f} KiB stored")
EOF

echo "== create rate by lowers (dsec-load --embedded, $count episodes: create, exec true, destroy) =="
for n in 1 5 20; do
  layers="$bb"
  for i in $(seq 2 $n); do layers="$layers,$(top l$i)"; done
  echo "{\"dir\": \"$tmp/low$n\", \"images\": [{\"tag\": \"x\", \"layers\": [$layers]}]}" > "$tmp/low$n.json"
  python3 "$here/../test/oci/make_layout.py" "$tmp/low$n.json" >/dev/null
  "$dsec" --state "$state" layer import low$n@1 "oci:$tmp/low$n:x" >/dev/null
  echo "-- $n lowers"
  rep=()
  [ -n "$report" ] && rep=(--report "$report/lowers-$n.html")
  "$load" --embedded --state "$state" --count "$count" --concurrency 16 --base low$n@1 --quiet "${rep[@]}" -- /bin/true \
    | grep -E "rate|create|^episodes" | head -4
done
