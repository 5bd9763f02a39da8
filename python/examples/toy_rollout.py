#!/usr/bin/env python3
"""A toy RL rollout against a dsecd: many sandboxes, one "episode" each, graded
through Chronus with a reward from the trainer.

    PYTHONPATH=build/python /usr/bin/python3 python/examples/toy_rollout.py \\
        --connect 127.0.0.1:7070 --base py@1 --episodes 64

Each episode: the "agent" (an untrusted command) writes an answer to a guessing
task; a trusted grader reports stages and a score over Chronus, then asks the
trainer for feedback. The trainer, watching the session's events, answers with
a reward (1.0 for a right answer, else 0.0), which the grader prints. Everything
runs from one thread with asyncio; no thread waits for a sandbox.

The base layer needs a POSIX shell (busybox is enough) and tar.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time

import dsec

AGENT = 'echo "$GUESS" > /tmp/answer'
GRADER = ('set -e; chronus stage grading; g=$(cat /tmp/answer);'
          ' if [ "$g" = "$TARGET" ]; then s=1; else s=0; fi;'
          ' chronus report correct=$s guess=$g; chronus log "guess $g for $TARGET";'
          ' chronus feedback "$s"; chronus stage done')


async def episode(sb: dsec.Sandbox, rng: random.Random) -> tuple[bool, str]:
    target, guess = rng.randint(0, 3), rng.randint(0, 3)
    r = await sb.exec_async(AGENT, env={"GUESS": str(guess)}, timeout=30)
    if r.exit_code != 0:
        raise RuntimeError(f"{sb.id}: the agent failed: {r.stderr!r}")
    # The grader blocks in `chronus feedback` until the trainer answers.
    r = await sb.exec_async(GRADER, env={"TARGET": str(target)}, trusted=True, timeout=60)
    if r.exit_code != 0:
        raise RuntimeError(f"{sb.id}: the grader failed ({r.exit_code}): {r.stderr!r}")
    return guess == target, r.stdout.decode().strip()


async def trainer(session: dsec.Session, expected: int, stats: dict[str, float]) -> None:
    """Answers each feedback request with a reward: the grader's own verdict."""
    async for ev in session.events_async(timeout=60):
        stats[ev.kind] = stats.get(ev.kind, 0) + 1
        if ev.kind == "feedback":
            reward = 1.0 if ev.payload == b"1" else 0.0
            await ev.answer_async(reward=reward, text="well done" if reward else "try again",
                                  done=True)
            stats["reward"] = stats.get("reward", 0.0) + reward
            stats["answered"] = stats.get("answered", 0) + 1
            if stats["answered"] == expected:
                return


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    with dsec.connect(args.connect) as c:
        async with await c.session_async(quota=args.episodes, ttl=600, name="toy-rollout",
                                         trajectory=False) as s:
            sbs = await s.create_async(args.base, count=args.episodes, chronus=True,
                                       memory="128m", pids=64)
            for f in sbs.failures:
                print(f"create failed: {f.code_name}: {f}", file=sys.stderr)
            t_ready = time.monotonic()
            stats: dict[str, float] = {}
            watcher = asyncio.ensure_future(trainer(s, len(sbs), stats))
            results = await asyncio.gather(*(episode(sb, rng) for sb in sbs))
            await asyncio.wait_for(watcher, 60)
            left = len(await s.list_async())
        t_end = time.monotonic()
        live_after = len([i for i in c.list() if i.session == s.id])
    correct = sum(ok for ok, _ in results)
    print(f"episodes        {len(results)} (created in {t_ready - t0:.2f}s, "
          f"rollout {t_end - t_ready:.2f}s)")
    print(f"correct         {correct}  mean reward {stats.get('reward', 0) / len(results):.3f}")
    print("events seen     " + ", ".join(f"{k} {v}" for k, v in sorted(stats.items())
                                         if k in ("stage", "report", "log", "feedback")))
    print(f"sample answer   {results[0][1]}")  # what the grader printed
    print(f"sandboxes left  {live_after} (the session had {left} before closing)")
    if stats.get("answered") != len(results) or correct != stats.get("reward"):
        print("toy_rollout: the rewards do not match the episodes", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--connect", required=True, metavar="HOST:PORT", help="the dsecd")
    p.add_argument("--base", default="py@1", help="base layer NAME@VERSION (default py@1)")
    p.add_argument("--episodes", type=int, default=64, help="sandboxes, one episode each")
    p.add_argument("--seed", type=int, default=17)
    try:
        sys.exit(asyncio.run(main(p.parse_args())))
    except dsec.Error as e:
        print(f"toy_rollout: {e.code_name}: {e}", file=sys.stderr)
        sys.exit(1)
