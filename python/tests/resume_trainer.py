"""The trainer of the resume tests (test_resume.py): a rollout over a session
with a trajectory log, run as its own process so that a test can kill it.

    python resume_trainer.py HOST:PORT [--sandboxes 4] [--stop-after K]

It prints one JSON object a line (flushed): {"session": ID}, then
{"sandboxes": [IDS]}, then {"n": N, "step": S, "box": I, "result": {...}} for
each step done, in order. With --stop-after K it stops after K steps: it starts
a command that would run for a minute in the sandbox of the next step (one
that, like the counted steps, appends to /work/runs: cut off, it must leave no
trace), waits until the node shows it running, prints {"stalled": K} and waits
to be killed.

The steps (STEPS) go step by step over all the sandboxes, so a rollout cut
after K steps leaves the sandboxes at different points of their episodes.
test_resume.py imports this module for them.
"""

import argparse
import json
import sys
import threading
import time

import dsec

ENV = dict(base="py@1", workdir="task@1", memory="128m", pids=64)
QUOTA = 16
KEY = "rollout"  # the create's key: a resumed create with it gets the same sandboxes
TTL = 300


def _count(tag):
    # Not idempotent: appends a line and prints how many there are.
    return f"echo {tag} >> /work/runs && wc -l < /work/runs"


def _result(r):
    return {"exit": r.exit_code, "signal": r.signal, "out": r.stdout.decode(),
            "err": r.stderr.decode(), "duration": r.duration}


def _input(box):
    return f"input of box {box}\n"


# Each step: (what it does to sandbox `sb`, the box's index) -> a JSON-able result.
STEPS = [
    lambda sb, i: _result(sb.exec(_count("a"), timeout=30)),
    lambda sb, i: _result(sb.exec("mkdir -p /cache && echo warm > /cache/w && wc -l < /work/runs",
                                  timeout=30, idempotent=True)),
    lambda sb, i: (sb.put("/work/input.txt", _input(i)), {"put": "/work/input.txt"})[1],
    lambda sb, i: _result(sb.exec(_count("b"), timeout=30)),
    lambda sb, i: _result(sb.exec("cat /work/input.txt /cache/w", timeout=30, idempotent=True)),
    lambda sb, i: _result(sb.exec(_count("c"), timeout=30)),
]

# What each step's stdout must be, had every step run exactly once.
EXPECTED_OUT = [
    lambda i: "1\n",
    lambda i: "1\n",
    None,
    lambda i: "2\n",
    lambda i: _input(i) + "warm\n",
    lambda i: "3\n",
]
FINAL_RUNS = "a\nb\nc\n"

# A command cut off by the kill: it has appended its line when it is killed.
STALL = "echo partial >> /work/runs; sleep 60"


def order(boxes):
    """(step, box) in the order the trainer goes."""
    return [(s, i) for s in range(len(STEPS)) for i in range(boxes)]


def emit(obj):
    print(json.dumps(obj), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--sandboxes", type=int, default=4)
    ap.add_argument("--stop-after", type=int, default=None)
    args = ap.parse_args()
    c = dsec.connect(args.address)
    s = c.session(quota=QUOTA, ttl=TTL, name="resume-trainer", trajectory=True)
    emit({"session": s.id})
    sbs = s.create(count=args.sandboxes, key=KEY, **ENV)
    emit({"sandboxes": [b.id for b in sbs]})
    for n, (step, i) in enumerate(order(len(sbs)), 1):
        if args.stop_after is not None and n > args.stop_after:
            sb = sbs[i]
            threading.Thread(target=lambda: sb.exec(STALL, timeout=120), daemon=True).start()
            deadline = time.time() + 30
            while time.time() < deadline:
                if any(x.id == sb.id and x.running > 0 for x in c.list()):
                    break
                time.sleep(0.02)
            emit({"stalled": args.stop_after, "box": i})
            time.sleep(600)
            return 1
        emit({"n": n, "step": step, "box": i, "result": STEPS[step](sbs[i], i)})
    s.close()
    c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
