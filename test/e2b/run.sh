#!/usr/bin/env bash
# The e2b suite (test/meson.build): the real `e2b` npm SDK (pinned by
# package-lock.json, installed by tools/setup with `npm ci`) against dsec-e2b
# and a dsecd, both started here on loopback over a state dir of our own, with
# a base layer of busybox and the host's bash. Runs `node --test` over
# test/e2b/*.test.mjs (or $E2B_RUN, for perf/e2b_bench.sh); exits 77 (skipped)
# when node or the SDK is missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
: "${DSEC_BIN:?}" "${DSECD_BIN:?}" "${DSEC_E2B_BIN:?}"
node="${NODE:-/usr/bin/node}"
if [ ! -x "$node" ]; then echo "e2b suite: no node at $node (tools/setup installs nodejs)"; exit 77; fi
if [ ! -f "$here/node_modules/e2b/package.json" ]; then
  echo "e2b suite: the SDK is not installed in $here/node_modules (run tools/setup: npm ci)"; exit 77
fi

tmp="$(mktemp -d /tmp/dsec-e2b-test.XXXXXX)"
dsecd_pid=""; gw_pid=""
cleanup() {
  # Only the processes this script started, by pid.
  if [ -n "$gw_pid" ]; then kill -TERM "$gw_pid" 2>/dev/null || true; wait "$gw_pid" 2>/dev/null || true; fi
  if [ -n "$dsecd_pid" ]; then kill -TERM "$dsecd_pid" 2>/dev/null || true; wait "$dsecd_pid" 2>/dev/null || true; fi
  inet_down
  rm -rf "$tmp"
}

# A test "internet" for egress sandboxes: a network namespace of this run
# holding busybox httpd on 198.18.0.2:8000 and 198.18.0.3:8000 and dnsmasq on
# 198.18.0.2:53 (allowed.test and every name below sub.test are 198.18.0.3), joined to
# the host (198.18.0.1) by a veth that is the dsecd's --uplink. No packet
# leaves the machine. Its servers are this script's children, ended by pid.
inet_ns="dsec-e2binet-$$"; uplink="dte$$"; inet_pids=()
inet_down() {
  for p in "${inet_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  inet_pids=()
  ip netns del "$inet_ns" 2>/dev/null || true
  ip link del "$uplink" 2>/dev/null || true
}
inet_up() {
  # What killed runs left (their pid is in the names; a live run's is kept).
  for ns in $(ip netns list | awk '{print $1}' | grep '^dsec-e2binet-' || true); do
    old="${ns#dsec-e2binet-}"
    [ "$old" != "$$" ] && kill -0 "$old" 2>/dev/null && continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
    ip link del "dte$old" 2>/dev/null || true
  done
  mkdir -p "$tmp/www"
  echo "hello from the test internet" > "$tmp/www/index.html"
  ip netns add "$inet_ns"
  ip link add "$uplink" type veth peer name inet0 netns "$inet_ns"
  ip addr add 198.18.0.1/24 dev "$uplink"
  ip link set "$uplink" up
  ip -n "$inet_ns" addr add 198.18.0.2/24 dev inet0
  ip -n "$inet_ns" addr add 198.18.0.3/24 dev inet0
  ip -n "$inet_ns" link set inet0 up
  ip -n "$inet_ns" link set lo up
  for at in 198.18.0.2:8000 198.18.0.3:8000; do
    ip netns exec "$inet_ns" /bin/busybox httpd -f -p "$at" -h "$tmp/www" & inet_pids+=($!)
  done
  ip netns exec "$inet_ns" /usr/sbin/dnsmasq --keep-in-foreground --no-resolv --no-hosts \
    --bind-interfaces --listen-address=198.18.0.2 --port=53 --local-ttl=60 --pid-file= --user=root \
    --address=/allowed.test/198.18.0.3 --address=/sub.test/198.18.0.3 >/dev/null 2>&1 & inet_pids+=($!)
  for _ in $(seq 200); do
    # (nslookup fails on the AAAA query dnsmasq refuses: read its output)
    ns="$(/bin/busybox nslookup allowed.test 198.18.0.2 2>/dev/null || true)"
    /bin/busybox timeout 3 /bin/busybox wget -q -O /dev/null http://198.18.0.3:8000/ 2>/dev/null &&
      grep -q 198.18.0.3 <<<"$ns" && return 0
    sleep 0.1
  done
  echo "e2b suite: the test internet did not come up"; return 1
}
trap cleanup EXIT

# The base layer: busybox (every applet), bash with the libraries it links.
root="$tmp/rootfs"
mkdir -p "$root/bin" "$root/tmp" "$root/root" "$root/home/user" "$root/etc"
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for a in $(/bin/busybox --list); do
  [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"
done
cp /bin/bash "$root/bin/bash"
for lib in $(ldd /bin/bash | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# root, and a user as E2B's images have one (in a second group too).
printf 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n' > "$root/etc/passwd"
printf 'root:x:0:\nuser:x:1000:\ndev:x:2000:user\n' > "$root/etc/group"
state="$tmp/state"
"$DSEC_BIN" --state "$state" layer build --kind base e2bbase@1 "$root" >/dev/null

# wait_for FILE TEXT: until FILE has TEXT (the process is alive), at most ~60 s.
wait_for() {
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || { echo "e2b suite: $4 exited:"; cat "$1" "$1.err" 2>/dev/null; return 1; }
    sleep 0.1
  done
  echo "e2b suite: $4 did not start:"; cat "$1" "$1.err"; return 1
}

# Bad configuration is refused at start, naming what is wrong (no daemon needed:
# the files are read before connecting).
expect_refused() { # WHAT TEXT ARGS...
  local what="$1" text="$2"; shift 2
  local out rc=0
  out="$("$DSEC_E2B_BIN" "$@" 2>&1)" || rc=$?
  if [ $rc -eq 0 ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "e2b suite: $what: expected a refusal naming '$text', got (exit $rc): $out"; exit 1
  fi
  echo "ok: $what: $out"
}
printf 'e2b_00\nnot-a-key\n' > "$tmp/badkeys"
echo '{"templates": {"t": {"base": "b@1", "colour": "red"}}}' > "$tmp/bad1.json"
echo '{"templates": {"t": {"base": "b@1", "memory": "lots"}}}' > "$tmp/bad2.json"
echo '{"templates": {"t": {"workdir": "w@1"}}}' > "$tmp/bad3.json"
echo '{"templates": ' > "$tmp/bad4.json"
echo '{"templates": {"t": {"base": "b@1"}}}' > "$tmp/good.json"
echo 'e2b_00' > "$tmp/goodkeys"
common=(--connect 127.0.0.1:1 --listen 127.0.0.1:0)
expect_refused "a bad key line" "badkeys:2: not an API key" "${common[@]}" --templates "$tmp/good.json" --keys "$tmp/badkeys"
expect_refused "an unknown template field" "template 't': unknown field 'colour'" "${common[@]}" --templates "$tmp/bad1.json" --keys "$tmp/goodkeys"
expect_refused "a bad size" "template 't': memory" "${common[@]}" --templates "$tmp/bad2.json" --keys "$tmp/goodkeys"
expect_refused "no base" "template 't': base is required" "${common[@]}" --templates "$tmp/bad3.json" --keys "$tmp/goodkeys"
echo '{"templates": {"t": {"base": "b@1", "network": {"allow": ["*.test"]}}}}' > "$tmp/bad5.json"
expect_refused "a bad network rule" "template 't': network.allow: rule '*.test'" "${common[@]}" --templates "$tmp/bad5.json" --keys "$tmp/goodkeys"
expect_refused "not JSON" "not JSON" "${common[@]}" --templates "$tmp/bad4.json" --keys "$tmp/goodkeys"
expect_refused "a missing file" "cannot read" "${common[@]}" --templates "$tmp/none.json" --keys "$tmp/goodkeys"
expect_refused "no --keys" "are required" --connect 127.0.0.1:1 --listen 127.0.0.1:0 --templates "$tmp/good.json"
expect_refused "a bad --listen" "--listen" --connect 127.0.0.1:1 --listen nowhere --templates "$tmp/good.json" --keys "$tmp/goodkeys"
expect_refused "no daemon" "--connect 127.0.0.1:1" "${common[@]}" --templates "$tmp/good.json" --keys "$tmp/goodkeys"

inet_up
"$DSECD_BIN" --listen 127.0.0.1:0 --state "$state" --uplink "$uplink" --sandbox-net 198.19.3.0/24 \
  --dns-upstream 198.18.0.2:53 >"$tmp/dsecd.out" 2>"$tmp/dsecd.out.err" &
dsecd_pid=$!
wait_for "$tmp/dsecd.out" " (state " "$dsecd_pid" dsecd
dsecd_port="$(grep -o 'listening on 127.0.0.1:[0-9]*' "$tmp/dsecd.out" | head -1 | sed 's/.*://')"

cat > "$tmp/keys" <<KEYS
# two tenants
e2b_0123456789abcdef0123456789abcdef
e2b_fedcba9876543210fedcba9876543210
KEYS
cat > "$tmp/templates.json" <<TEMPLATES
{"templates": {
  "base": {"base": "e2bbase@1", "memory": "256m", "cwd": "/root"},
  "loopback": {"base": "e2bbase@1", "network": "loopback"},
  "online": {"base": "e2bbase@1", "network": {"allow": ["198.18.0.2:8000", "198.18.0.3:8000", "allowed.test", "*.sub.test"]}}
}}
TEMPLATES
${E2B_GW_PREFIX:-} "$DSEC_E2B_BIN" --connect "127.0.0.1:$dsecd_port" --listen 127.0.0.1:0 \
  --templates "$tmp/templates.json" --keys "$tmp/keys" --domain dsec.test >"$tmp/gw.out" 2>"$tmp/gw.out.err" &
gw_pid=$!
wait_for "$tmp/gw.out" "listening on" "$gw_pid" dsec-e2b
gw_port="$(grep -o 'listening on 127.0.0.1:[0-9]*' "$tmp/gw.out" | head -1 | sed 's/.*://')"

export E2B_API_URL="http://127.0.0.1:$gw_port"
export E2B_SANDBOX_URL="http://127.0.0.1:$gw_port"
export E2B_API_KEY="e2b_0123456789abcdef0123456789abcdef"
export E2B_OTHER_API_KEY="e2b_fedcba9876543210fedcba9876543210"
export DSEC_CONNECT="127.0.0.1:$dsecd_port"
export DSEC_GATEWAY_PID="$gw_pid"
export E2B_SDK_DIR="$here"
status=0
if [ -n "${E2B_RUN:-}" ]; then
  # perf/e2b_bench.sh: its command instead of the tests, with the same setup.
  (cd "$here" && eval "$E2B_RUN") || status=$?
else
  (cd "$here" && "$node" --test --test-concurrency=1 ${E2B_TEST_FILES:-*.test.mjs}) || status=$?
fi
if ! kill -0 "$gw_pid" 2>/dev/null; then
  echo "e2b suite: dsec-e2b died during the tests:"; cat "$tmp/gw.out" "$tmp/gw.out.err"; status=1
elif [ -z "${E2B_RUN:-}" ]; then
  # Nothing outlives the gateway: a sandbox left live is destroyed when it stops.
  left="$("$node" -e 'fetch(process.env.E2B_API_URL + "/v2/sandboxes", { method: "POST",
    headers: { "X-API-KEY": process.env.E2B_API_KEY }, body: "{}" })
    .then(r => r.json()).then(j => console.log(j.sandboxID))')"
  "$DSEC_BIN" --connect "127.0.0.1:$dsecd_port" ps | grep -q "$left" || { echo "e2b suite: sandbox $left is not in dsec ps"; status=1; }
  kill -TERM "$gw_pid"; wait "$gw_pid" || { echo "e2b suite: dsec-e2b exited with $? on SIGTERM"; status=1; }
  gw_pid=""
  # (the daemon destroys an owned session's sandboxes once it sees the client go)
  for _ in $(seq 300); do
    "$DSEC_BIN" --connect "127.0.0.1:$dsecd_port" ps | grep -q "$left" || break
    sleep 0.1
  done
  if "$DSEC_BIN" --connect "127.0.0.1:$dsecd_port" ps | grep -q "$left"; then
    echo "e2b suite: sandbox $left outlived dsec-e2b"; status=1
  else
    echo "ok: sandbox $left was destroyed with dsec-e2b"
  fi
fi
[ $status -eq 0 ] || { echo "--- dsec-e2b stderr"; tail -50 "$tmp/gw.out.err"; }

# A node lost under the gateway: a coordinator that runs no sandboxes (--slots 0),
# one node, a second dsec-e2b on the coordinator; test/e2b/lost_node.mjs hangs the
# node (SIGSTOP) until the coordinator declares it lost, then wakes it (it then
# destroys what it had and rejoins).
coord_pid=""; node_pid=""; gw2_pid=""
stop_cluster() {
  for p in "$gw2_pid" "$node_pid" "$coord_pid"; do
    [ -n "$p" ] || continue
    kill -CONT "$p" 2>/dev/null || true
    kill -TERM "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  gw2_pid=""; node_pid=""; coord_pid=""
}
trap 'stop_cluster; cleanup' EXIT
if [ -z "${E2B_RUN:-}" ] && [ -z "${E2B_TEST_FILES:-}" ]; then
  cstate="$tmp/cstate"; nstate="$tmp/nstate"; mkdir -p "$nstate"
  "$DSEC_BIN" --state "$cstate" layer build --kind base e2bbase@1 "$root" >/dev/null
  "$DSECD_BIN" --coordinator --slots 0 --listen 127.0.0.1:0 --state "$cstate" >"$tmp/coord.out" 2>"$tmp/coord.out.err" &
  coord_pid=$!
  wait_for "$tmp/coord.out" " (state " "$coord_pid" "the coordinator"
  cport="$(grep -o 'listening on 127.0.0.1:[0-9]*' "$tmp/coord.out" | head -1 | sed 's/.*://')"
  "$DSECD_BIN" --join "127.0.0.1:$cport" --listen 127.0.0.1:0 --state "$nstate" \
    --cluster-key "$cstate/cluster.key" --trajectories "$cstate/trajectories" >"$tmp/node.out" 2>"$tmp/node.out.err" &
  node_pid=$!
  for _ in $(seq 600); do
    [ "$("$DSEC_BIN" --connect "127.0.0.1:$cport" cluster status 2>/dev/null | grep -c ' up')" -ge 2 ] && break
    kill -0 "$node_pid" || break
    sleep 0.1
  done
  "$DSEC_E2B_BIN" --connect "127.0.0.1:$cport" --listen 127.0.0.1:0 \
    --templates "$tmp/templates.json" --keys "$tmp/keys" >"$tmp/gw2.out" 2>"$tmp/gw2.out.err" &
  gw2_pid=$!
  wait_for "$tmp/gw2.out" "listening on" "$gw2_pid" "the second dsec-e2b"
  gw2_port="$(grep -o 'listening on 127.0.0.1:[0-9]*' "$tmp/gw2.out" | head -1 | sed 's/.*://')"
  (cd "$here" && E2B_API_URL="http://127.0.0.1:$gw2_port" E2B_SANDBOX_URL="http://127.0.0.1:$gw2_port" \
     DSEC_NODE_PID="$node_pid" "$node" --test lost_node.mjs) || {
    status=1; echo "--- coordinator"; tail -20 "$tmp/coord.out" "$tmp/coord.out.err"
    echo "--- node"; tail -20 "$tmp/node.out" "$tmp/node.out.err"; echo "--- dsec-e2b"; tail -20 "$tmp/gw2.out.err"; }
  kill -0 "$gw2_pid" 2>/dev/null || { echo "e2b suite: the second dsec-e2b died"; status=1; }
  # The node killed by lost_node.mjs starts again on its state dir: it sweeps
  # what the kill left (cgroups, its nft table) and joins; sandboxes work again.
  if ! kill -0 "$node_pid" 2>/dev/null; then
    wait "$node_pid" 2>/dev/null || true
    "$DSECD_BIN" --join "127.0.0.1:$cport" --listen 127.0.0.1:0 --state "$nstate" \
      --cluster-key "$cstate/cluster.key" --trajectories "$cstate/trajectories" >"$tmp/node2.out" 2>"$tmp/node2.out.err" &
    node_pid=$!
    # (until it has joined: a create before that is refused, naming no free slot)
    for _ in $(seq 600); do
      back="$("$DSEC_BIN" --connect "127.0.0.1:$cport" run --base e2bbase@1 -- echo back 2>&1)" || true
      [ "$back" = back ] && break
      kill -0 "$node_pid" || break
      sleep 0.1
    done
    if [ "$back" = back ]; then
      echo "ok: the killed node restarted, rejoined and runs sandboxes"
    else
      echo "e2b suite: after its restart the node ran no sandbox: $back"; tail -20 "$tmp/node2.out.err"; status=1
    fi
  fi
  stop_cluster
fi
exit $status
