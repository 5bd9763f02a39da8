#!/usr/bin/env python3
"""A toy rollout that survives its own death: run it, kill it, resume it.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/resumable_rollout.py \\
        --connect 127.0.0.1:7070 --episodes 8 --kill-after 20
    # ... it prints its session id, then dies (SIGKILL) after 20 steps ...
    PYTHONPATH=build/python /usr/bin/python3 python/examples/resumable_rollout.py \\
        --connect 127.0.0.1:7070 --episodes 8 --resume SESSION_ID

The session keeps a trajectory log (trajectory=True, the SDK's default). A
resumed run does exactly what a fresh one does, from the start: the same
create (by its key), the same steps in each sandbox. The daemon answers the steps of the
log from it, without running them, and runs the rest on the state the sandbox
had. The summary says, per episode, how many steps came from the log and how
many ran now: a step's command sleeps STEP_SLEEP seconds, so a call that came
back faster than the command's own duration did not run it (the result is the
logged one, duration included).

Each act appends to /work/steps and prints how many lines it has: the step
number as the sandbox counted it. After a resume it still equals the trainer's
own count, so no act ran twice (or half: an act cut off by the kill left
nothing behind). --kill-after also works with --resume, to be killed again.

The base layer needs a POSIX shell with sleep, wc and cat (busybox is enough).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Awaitable, TypeVar

import dsec

T = TypeVar("T")

STEP_SLEEP = 0.2
# Not idempotent: it appends. Its stdout is the step number the sandbox counted.
ACT = (f'sleep {STEP_SLEEP}; echo "episode $EPISODE step $STEP: $ACTION" >> /work/steps;'
       ' wc -l < /work/steps')
# Idempotent: running it again changes nothing, so a resume may re-run it
# rather than keep a pack of the sandbox after it.
OBSERVE = "cat /work/task.txt; cat /work/steps 2>/dev/null | wc -l"


class Progress:
    def __init__(self, kill_after: int | None) -> None:
        self.kill_after = kill_after
        self.done = 0

    def step_done(self) -> None:
        self.done += 1
        if self.kill_after is not None and self.done >= self.kill_after:
            print(f"--kill-after {self.kill_after}: killing myself (SIGKILL) mid-rollout",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


async def timed(coro: Awaitable[T]) -> tuple[T, float]:
    t0 = time.monotonic()
    r = await coro
    return r, time.monotonic() - t0


async def episode(sb: dsec.Sandbox, n: int, steps: int,
                  progress: Progress) -> list[tuple[str, int, int]]:
    """One episode: a task file, then `steps` x (observe, act). Returns
    per-call (what, came from the log?) and whether the acts counted right."""
    seen: list[tuple[str, int, int]] = []
    await sb.put_async("/work/task.txt", f"episode {n}: reach {steps}\n")
    for s in range(1, steps + 1):
        obs, _ = await timed(sb.exec_async(OBSERVE, idempotent=True, timeout=30))
        # The policy: a deterministic function of what it observed (a resumed
        # run must make the same choices to be answered from the log).
        action = f"move-{(len(obs.stdout) + s) % 4}"
        r, wall = await timed(sb.exec_async(ACT, env={"EPISODE": str(n), "STEP": str(s),
                                                                 "ACTION": action},
                                            timeout=30))
        if r.exit_code != 0:
            raise RuntimeError(f"{sb.id}: step {s} failed ({r.exit_code}): {r.stderr!r}")
        counted = int(r.stdout.decode().strip())
        seen.append(("log" if wall < r.duration / 2 else "ran", s, counted))
        progress.step_done()
    return seen


def resume(c: dsec.Client, sid: str) -> dsec.Session:
    # Right after a trainer's death the daemon may still be closing the
    # session: it is in use until then.
    deadline = time.time() + 30
    while True:
        try:
            return c.resume(sid)
        except dsec.InUse:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


async def main(args: argparse.Namespace) -> int:
    progress = Progress(args.kill_after)
    with dsec.connect(args.connect) as c:
        if args.resume:
            s = resume(c, args.resume)
            print(f"resumed session {s.id}", flush=True)
        else:
            s = await c.session_async(quota=args.episodes, ttl=3600, name="resumable-rollout")
            print(f"session {s.id} (resume it with --resume {s.id})", flush=True)
        t0 = time.monotonic()
        # The same create, by its key, as the first run: the same sandboxes.
        sbs = await s.create_async(args.base, workdir=args.workdir, count=args.episodes,
                                   memory="128m", pids=64, key="rollout")
        if sbs.failures:
            raise SystemExit(f"{len(sbs.failures)} sandboxes failed: {sbs.failures[0]}")
        results = await asyncio.gather(*(episode(sb, n, args.steps, progress)
                                         for n, sb in enumerate(sbs)))
        elapsed = time.monotonic() - t0
        print(f"\n{'sandbox':14} {'from log':>8} {'ran now':>8}  steps (L: from the log, "
              f"R: ran; the number: the step as the sandbox counted it)")
        exact = True
        for sb, seen in zip(sbs, results):
            logged = sum(1 for how, _, _ in seen if how == "log")
            marks = " ".join(f"{'L' if how == 'log' else 'R'}{counted}"
                             for how, _, counted in seen)
            exact &= all(counted == s for _, s, counted in seen)
            print(f"{sb.id:14} {logged:8} {len(seen) - logged:8}  {marks}")
        total = sum(len(x) for x in results)
        from_log = sum(1 for x in results for how, _, _ in x if how == "log")
        print(f"\n{total} steps in {elapsed:.2f}s: {from_log} answered from the log, "
              f"{total - from_log} ran")
        print("every act ran exactly once" if exact
              else "MISMATCH: an act's count differs from its step")
        n = s.close()
        print(f"session {s.id} closed ({n} sandboxes destroyed); its log is deleted")
        return 0 if exact else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--connect", required=True, metavar="HOST:PORT")
    ap.add_argument("--resume", metavar="SESSION_ID",
                    help="resume this session (same --episodes, --steps, --base) from its log")
    ap.add_argument("--episodes", type=int, default=8, help="sandboxes, one episode each")
    ap.add_argument("--steps", type=int, default=5, help="acts per episode")
    ap.add_argument("--base", default="py@1")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--kill-after", type=int, default=None, metavar="K",
                    help="demo: SIGKILL this process once K acts are done")
    sys.exit(asyncio.run(main(ap.parse_args())))
