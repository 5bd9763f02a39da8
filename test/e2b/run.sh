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
  rm -rf "$tmp"
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
echo "root:x:0:0:root:/root:/bin/bash" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
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

"$DSECD_BIN" --listen 127.0.0.1:0 --state "$state" >"$tmp/dsecd.out" 2>"$tmp/dsecd.out.err" &
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
  "loopback": {"base": "e2bbase@1", "network": "loopback"}
}}
TEMPLATES
${E2B_GW_PREFIX:-} "$DSEC_E2B_BIN" --connect "127.0.0.1:$dsecd_port" --listen 127.0.0.1:0 \
  --templates "$tmp/templates.json" --keys "$tmp/keys" >"$tmp/gw.out" 2>"$tmp/gw.out.err" &
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
exit $status
