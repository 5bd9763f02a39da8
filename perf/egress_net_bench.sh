#!/usr/bin/env bash
# perf/egress_net_bench.sh: what the egress policy costs a connection
# (docs/network.md), in one run: TCP connection setup and HTTP throughput from
# an egress sandbox (its veth, routed /31, the node's nftables table with a
# 10-rule policy, masquerade out of --uplink) against a plain veth without
# any of it (a network namespace of the script's own, a routed /31 through
# the same host, no table, no NAT).
#
# The "internet" is a network namespace the script makes: busybox httpd on
# 198.18.0.2:8000 behind a veth from the host (198.18.0.1), which is dsecd's
# --uplink. The plain namespace has 198.18.1.1 (the host's end 198.18.1.0).
# Both measure with the host's curl and ab entered into the namespace
# (nsenter --net into the sandbox's), so only the network path differs.
# No packet leaves the machine. Alternating ROUNDS times:
#   - connect: the median of N curl time_connect (the TCP handshake alone);
#   - requests: `ab -n N -c 1` requests/s (busybox httpd has no keep-alive:
#     each request a new connection);
#   - MB/s: a 64 MiB file fetched once with curl.
#
#   perf/egress_net_bench.sh [-n REQUESTS] [-r ROUNDS] [BUILD_DIR]
#
# Needs root, busybox, ip (iproute2), ab (apache2-utils), curl and nsenter.
set -euo pipefail

n=300
rounds=3
while getopts "n:r:h" opt; do
  case $opt in
    n) n=$OPTARG ;;
    r) rounds=$OPTARG ;;
    h) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: $0 [-n REQUESTS] [-r ROUNDS] [BUILD_DIR]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
build=${1:-$(dirname "$0")/../build}
dsec=$build/tools/dsec
dsecd=$build/tools/dsecd
export DSEC_SPAWNER=$build/tools/dsec-spawner
for b in "$dsec" "$dsecd" "$DSEC_SPAWNER"; do
  [ -x "$b" ] || { echo "egress_net_bench: no $b (build first)" >&2; exit 2; }
done
for t in ab curl nsenter ip; do
  command -v $t >/dev/null || { echo "egress_net_bench: needs $t" >&2; exit 2; }
done

if ip -br addr | grep -qE ' 198\.18\.(0\.1|1\.0)/'; then
  echo "egress_net_bench: 198.18.0.1 or 198.18.1.0 is on a link here already (a test running?)" >&2
  exit 2
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsec-egress-bench.XXXXXX")
inet=dsec-ebi-$$
plain=dsec-ebp-$$
up=deb$$u
pl=deb$$p
pid=
srv=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  [ -n "$srv" ] && kill "$srv" 2>/dev/null && wait "$srv" 2>/dev/null || true
  ip link del "$up" 2>/dev/null || true
  ip link del "$pl" 2>/dev/null || true
  ip netns del "$inet" 2>/dev/null || true
  ip netns del "$plain" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# The internet: 198.18.0.2 with busybox httpd, behind $up (198.18.0.1).
ip netns add "$inet"
ip link add "$up" type veth peer name eth0 netns "$inet"
ip addr add 198.18.0.1/24 dev "$up"
ip link set "$up" up
ip -n "$inet" addr add 198.18.0.2/24 dev eth0
ip -n "$inet" link set eth0 up
ip -n "$inet" link set lo up
ip -n "$inet" route add 198.18.1.0/24 via 198.18.0.1
mkdir -p "$tmp/www"
echo hello > "$tmp/www/index.html"
head -c 67108864 /dev/zero > "$tmp/www/big"
ip netns exec "$inet" busybox httpd -f -p 198.18.0.2:8000 -h "$tmp/www" &
srv=$!
# The plain veth: 198.18.1.1 routed through the host, nothing else.
ip netns add "$plain"
ip link add "$pl" type veth peer name eth0 netns "$plain"
ip addr add 198.18.1.0/31 dev "$pl"
ip link set "$pl" up
ip -n "$plain" addr add 198.18.1.1/31 dev eth0
ip -n "$plain" link set eth0 up
ip -n "$plain" link set lo up
ip -n "$plain" route add default via 198.18.1.0
for i in "$up" "$pl"; do echo 1 > /proc/sys/net/ipv4/conf/$i/forwarding; done

mkdir -p "$tmp/base/bin"
cp /bin/busybox "$tmp/base/bin/busybox"
for a in sh sleep; do ln -s busybox "$tmp/base/bin/$a"; done
"$dsec" --state "$tmp/state" layer build --kind base bb@1 "$tmp/base" >/dev/null
"$dsecd" --listen 127.0.0.1:0 --state "$tmp/state" --slots 8 --uplink "$up" \
  --sandbox-net 198.19.0.0/24 >"$tmp/dsecd.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$tmp/dsecd.log" && break; sleep 0.1; done
addr=$(grep -o "listening on [0-9.:]*" "$tmp/dsecd.log" | awk '{print $3}')
d() { "$dsec" --connect "$addr" "$@"; }

# A 10-rule policy, as runtime_bench's: the server's address and port among
# nine rules for addresses no packet goes to.
policy=()
for r in 198.18.0.2:8000 1.1.1.0/24:53 8.8.8.8:53 93.184.216.0/24:80 151.101.0.0/16:443 \
         140.82.112.0/20:443 185.199.108.0/22:443 104.16.0.0/13:443 13.32.0.0/15:443 \
         203.0.113.0/24:8080; do
  policy+=(--allow "$r")
done
mark=$((100000 + $$))
id=$(d run --detach --base bb@1 --network egress "${policy[@]}" -- sleep "$mark")
for _ in $(seq 100); do
  spid=$(pgrep -f "^sleep $mark\$" | head -1 || true)
  [ -n "$spid" ] && break
  sleep 0.1
done
[ -n "$spid" ] || { echo "egress_net_bench: the sandbox's sleep did not start" >&2; exit 1; }
in_sandbox() { nsenter --net=/proc/"$spid"/ns/net "$@"; }
in_plain() { ip netns exec "$plain" "$@"; }
url=http://198.18.0.2:8000
for _ in $(seq 50); do in_sandbox curl -sf --max-time 2 "$url/" >/dev/null && break; sleep 0.1; done
in_sandbox curl -sf --max-time 2 "$url/" >/dev/null || { echo "egress_net_bench: the sandbox cannot reach $url" >&2; exit 1; }
in_plain curl -sf --max-time 2 "$url/" >/dev/null || { echo "egress_net_bench: the plain namespace cannot reach $url" >&2; exit 1; }

connect_us() { # the median TCP handshake of $n curls, in us
  for _ in $(seq "$n"); do "$@" curl -s --max-time 30 -o /dev/null -w '%{time_connect}\n' "$url/"; done \
    | sort -n | awk '{a[NR] = $1} END {printf "%.0f", a[int((NR + 1) / 2)] * 1e6}'
}
rps() { "$@" ab -q -n "$n" -c 1 "$url/" 2>&1 | awk '/Requests per second/ {printf "%.0f", $4}'; }
mbs() { "$@" curl -s --max-time 30 -o /dev/null -w '%{speed_download}' "$url/big" | awk '{printf "%.0f", $1 / 1e6}'; }

echo "egress sandbox $id (10-rule policy) vs a plain veth; $n requests, $rounds rounds, alternating"
printf "%-6s %16s %16s %12s %12s %10s %10s\n" round "egress connect" "plain connect" \
  "egress req/s" "plain req/s" "egress MB/s" "plain MB/s"
for ((r = 1; r <= rounds; r++)); do
  ec=$(connect_us in_sandbox)
  pc=$(connect_us in_plain)
  er=$(rps in_sandbox)
  pr=$(rps in_plain)
  eb=$(mbs in_sandbox)
  pb=$(mbs in_plain)
  printf "%-6s %13s us %13s us %12s %12s %10s %10s\n" "$r" "$ec" "$pc" "$er" "$pr" "$eb" "$pb"
done
d node stats | grep -A1 "^egress" | head -2
d rm "$id" >/dev/null
