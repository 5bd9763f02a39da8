#!/usr/bin/env bash
# perf/e2b_bench.sh: dsec through its E2B-compatible API (the real e2b SDK
# against dsec-e2b) against dsec's native client (dsec-load), in the same run,
# on the same dsecd and base layer (test/e2b/run.sh sets them up on loopback).
#
#   perf/e2b_bench.sh [BUILD_DIR] [N] [C] [K]
#
# N episodes (default 200), C at a time (default 16), each: create a sandbox,
# run `/bin/bash -l -c true` K times (default 5; what the SDK's commands.run
# runs), destroy it. Prints creates/s, create p50/p99 and the command round
# trip p50/p99 for both.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="$(cd "${1:-$src/build}" && pwd)"
export E2B_BENCH_N="${2:-200}" E2B_BENCH_C="${3:-16}" E2B_BENCH_K="${4:-5}"
export DSEC_SPAWNER="$build/tools/dsec-spawner" DSEC_BIN="$build/tools/dsec"
export DSECD_BIN="$build/tools/dsecd" DSEC_E2B_BIN="$build/tools/dsec-e2b"
export DSEC_LOAD_BIN="$build/tools/dsec-load"
export E2B_BENCH_SCRIPT="$src/perf/e2b_bench.mjs"
E2B_RUN='/usr/bin/node "$E2B_BENCH_SCRIPT"' exec "$src/test/e2b/run.sh"
