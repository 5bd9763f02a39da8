#!/usr/bin/env python3
"""perf/summarize.py: the tables of perf/README.md from runtime_bench's JSON output.

usage: build/perf/runtime_bench --benchmark_out=run.json --benchmark_out_format=json [...]
       perf/summarize.py run.json

With --benchmark_repetitions=N it uses the median of the repetitions (and shows
the min..max of the rates); without, the single run. Prints the rates and
latencies, the ratios against bwrap and the bare vfork+exec loop measured in the
same run, and the per-step breakdown (mean microseconds per sandbox).
"""
import json
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        doc = json.load(f)
    runs = defaultdict(list)   # run_name -> iteration rows
    medians = {}               # run_name -> median aggregate row
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred"):
            print(f"note: {b['name']} failed: {b.get('error_message', '')}", file=sys.stderr)
            continue
        name = b.get("run_name", b["name"])
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = b
        else:
            runs[name].append(b)
    out = {}
    for name in set(runs) | set(medians):
        rows = runs.get(name, [])
        row = medians.get(name) or {
            k: statistics.median(r[k] for r in rows)
            for k in rows[0] if isinstance(rows[0][k], (int, float))
        }
        rates = [r["items_per_second"] for r in rows] or [row["items_per_second"]]
        out[name] = (row, min(rates), max(rates), len(rates))
    return doc.get("context", {}), out


def find(res, kind, arg, threads):
    """The result of one benchmark, e.g. ("sandbox", 1, 2): net:1, 2 threads."""
    base, argpart = {"sandbox": ("BM_sandbox", f"net:{arg}"),
                     "vfork": ("BM_vfork_exec", None),
                     "bwrap": ("BM_bwrap", f"share_net:{arg}")}[kind]
    for name, v in res.items():
        parts = name.split("/")
        if parts[0] == base and parts[-1] == f"threads:{threads}" \
                and (argpart is None or argpart in parts):
            return v
    return None


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) == 2 else 2
    ctx, res = load(sys.argv[1])
    print(f"# {ctx.get('date', '')}  {ctx.get('num_cpus', '?')} CPUs  "
          f"load {ctx.get('load_avg', '')}")
    print()
    print("| what | threads | sandboxes/s (min..max) | p50 / p99 ms | CPU ms each | vs bwrap | vs vfork+exec |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    # The peer of a sandbox without a network namespace is bwrap --share-net
    # (neither makes one), of one with --net plain bwrap --unshare-all.
    rows = [
        ("dsec runtime, no netns", "sandbox", 0, ("bwrap", 1)),
        ("dsec runtime, fresh netns", "sandbox", 1, ("bwrap", 0)),
        ("bwrap --unshare-all --share-net", "bwrap", 1, None),
        ("bwrap --unshare-all", "bwrap", 0, None),
        ("bare vfork+exec", "vfork", 0, None),
    ]
    for threads in (1, 2):
        for label, kind, arg, peer in rows:
            v = find(res, kind, arg, threads)
            if not v:
                continue
            row, lo, hi, n = v
            rate = row["items_per_second"]
            spread = f" ({lo:.0f}..{hi:.0f})" if n > 1 else ""
            if kind == "sandbox":
                lat = f"{row['cycle_p50_us'] / 1e3:.2f} / {row['cycle_p99_us'] / 1e3:.2f}"
            else:
                lat = f"{row['run_p50_us'] / 1e3:.2f} / {row['run_p99_us'] / 1e3:.2f}"
            vs_bwrap = vs_vfork = ""
            if peer:
                p = find(res, peer[0], peer[1], threads)
                if p:
                    vs_bwrap = f"{rate / p[0]['items_per_second']:.1f}x"
            vf = find(res, "vfork", 0, threads)
            if vf and kind != "vfork":
                vs_vfork = f"{rate / vf[0]['items_per_second']:.2f}x"
            cpu = f"{row['cpu_us'] / 1e3:.2f}" if "cpu_us" in row else ""
            print(f"| {label} | {threads} | {rate:.0f}{spread} | {lat} | {cpu} | {vs_bwrap} | {vs_vfork} |")
    print()
    cols = [(n, t) for n in (0, 1) for t in (1, 2) if find(res, "sandbox", n, t)]
    if not cols:
        return 0
    print("Per-step mean, us per sandbox (create p50/p99 are percentiles of create alone):")
    print()
    print("| step | " + " | ".join(f"net:{n} threads:{t}" for n, t in cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    first = find(res, "sandbox", *cols[0])[0]
    host = ["make_upper", "make_overlay", "make_cgroup", "spawn", "wait_ready"]
    # runtime/proto.hpp's child_step order; steps this script does not know go last.
    known = ["join_cgroup", "enter_cgroup_ns", "attach_root", "mount_proc", "mount_devpts",
             "enter_root", "set_hostname", "setup_network", "landlock", "drop_capabilities",
             "seccomp"]
    rank = {f"in.{s}_us": i for i, s in enumerate(known)}
    inside = sorted((k for k in first if k.startswith("in.")), key=lambda k: (rank.get(k, 99), k))
    order = (["create_us", "create_p50_us", "create_p99_us"] + [h + "_us" for h in host]
             + inside + ["exec_us", "wait_us", "destroy_us", "cycle_p50_us", "cycle_p99_us"])
    for k in order:
        if k not in first:
            continue
        vals = [find(res, "sandbox", n, t)[0].get(k, 0) for n, t in cols]
        label = k[:-3]
        if k.startswith("in."):
            label = "  in sandbox: " + label[3:]
        elif k[:-3] in host:
            label = "  host: " + label
        print(f"| {label} | " + " | ".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in vals) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
