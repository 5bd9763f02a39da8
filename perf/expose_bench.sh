#!/usr/bin/env bash
# perf/expose_bench.sh: what an exposed port costs (docs/network.md, "Exposed
# ports"), in one run, on a dsecd of its own (a temporary state dir with a
# busybox base layer). A loopback sandbox (--net) runs busybox httpd on its
# 127.0.0.1:8080, exposed with --expose 8080; then, alternating ROUNDS times:
#   - through: `ab -n N -c C` on the node against the exposed 127.0.0.1:PORT
#     (each request a new TCP connection: busybox httpd has no keep-alive, so
#     this is the forwarder's connection setup, setns included);
#   - direct: the same `ab` run inside the sandbox's network namespace
#     (nsenter --net) against 127.0.0.1:8080, without the forwarder;
#   - and a 64 MiB file fetched once each way with curl (MB/s).
# Everything is on loopback; no packet leaves the machine.
#
#   perf/expose_bench.sh [-n REQUESTS] [-c CONCURRENCY] [-r ROUNDS] [BUILD_DIR]
#
# Needs root, busybox, ab (apache2-utils), curl and nsenter (util-linux).
set -euo pipefail

n=2000
conc=8
rounds=3
while getopts "n:c:r:h" opt; do
  case $opt in
    n) n=$OPTARG ;;
    c) conc=$OPTARG ;;
    r) rounds=$OPTARG ;;
    h) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-n REQUESTS] [-c CONCURRENCY] [-r ROUNDS] [BUILD_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-$(dirname "$0")/../build}
dsec=$build/tools/dsec
dsecd=$build/tools/dsecd
export DSEC_SPAWNER=$build/tools/dsec-spawner
for b in "$dsec" "$dsecd" "$DSEC_SPAWNER"; do
  [ -x "$b" ] || { echo "expose_bench: no $b (build first)" >&2; exit 2; }
done
for t in ab curl nsenter; do
  command -v $t >/dev/null || { echo "expose_bench: needs $t" >&2; exit 2; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-expose-bench.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/base/bin"
cp /bin/busybox "$tmp/base/bin/busybox"
for a in sh head mkdir httpd echo; do ln -s busybox "$tmp/base/bin/$a"; done
"$dsec" --state "$tmp/state" layer build --kind base bb@1 "$tmp/base" >/dev/null
"$dsecd" --listen 127.0.0.1:0 --state "$tmp/state" --slots 8 >"$tmp/dsecd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$tmp/dsecd.log" && break; sleep 0.1; done
addr=$(grep -o "listening on [0-9.:]*" "$tmp/dsecd.log" | awk '{print $3}')
d() { "$dsec" --connect "$addr" "$@"; }

mark="srv-expose-bench-$$"
id=$(d run --detach --base bb@1 --net --expose 8080 --memory 512m --disk 256m -- \
       sh -c "mkdir /$mark && echo hello > /$mark/index.html &&
              head -c 67108864 /dev/zero > /$mark/big && exec httpd -f -p 127.0.0.1:8080 -h /$mark" \
       2>"$tmp/run.err")
hp=$(grep -o "port 8080 at [0-9.:]*" "$tmp/run.err" | awk '{print $4}')
[ -n "$hp" ] || { echo "expose_bench: no exposed address: $(cat "$tmp/run.err")" >&2; exit 1; }
# The httpd's pid on the host (its -h names this run), for nsenter --net.
for _ in $(seq 100); do
  spid=$(pgrep -f "httpd -f -p 127.0.0.1:8080 -h /$mark" | head -1 || true)
  [ -n "$spid" ] && break
  sleep 0.1
done
[ -n "$spid" ] || { echo "expose_bench: the sandbox's httpd did not start" >&2; exit 1; }
for _ in $(seq 100); do curl -sf "http://$hp/" >/dev/null && break; sleep 0.1; done

rps() { ab -q -n "$n" -c "$conc" "$1" 2>&1 | awk '/Requests per second/ {print $4}'; }
mbs() { curl -s -o /dev/null -w '%{speed_download}' "$1" | awk '{printf "%.0f", $1 / 1e6}'; }
echo "exposed at $hp (sandbox $id); ab -n $n -c $conc, $rounds rounds, alternating"
printf "%-8s %14s %14s %12s %12s\n" round "through req/s" "direct req/s" "through MB/s" "direct MB/s"
for ((r = 1; r <= rounds; r++)); do
  t=$(rps "http://$hp/")
  dd=$(nsenter --net=/proc/"$spid"/ns/net ab -q -n "$n" -c "$conc" http://127.0.0.1:8080/ 2>&1 \
         | awk '/Requests per second/ {print $4}')
  tb=$(mbs "http://$hp/big")
  db=$(nsenter --net=/proc/"$spid"/ns/net curl -s -o /dev/null -w '%{speed_download}' \
         http://127.0.0.1:8080/big | awk '{printf "%.0f", $1 / 1e6}')
  printf "%-8s %14s %14s %12s %12s\n" "$r" "$t" "$dd" "$tb" "$db"
done
d node stats | grep "exposed ports"
d rm "$id" >/dev/null
