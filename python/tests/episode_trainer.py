"""An asyncio trainer with one sandbox per episode (test_resume.py's
preemption cases), run as its own process so that a test can kill it.

    python episode_trainer.py HOST:PORT --episodes N --concurrency K
                              [--stop-after M] [--resume SESSION_ID]

Episodes run concurrently under a semaphore of K, each on its own sandbox
created with key "ep-I" (so the creates finish in no fixed order). An
episode: put its prompt, run the agent (not idempotent: it appends to
/work/runs and prints the file), run the grader (trusted: Chronus stage,
report and a feedback request answered by the event handler with reward I),
close the sandbox.

It prints one JSON object a line (flushed): {"session": ID}; for each episode
done {"episode": I, "sandbox": ID, "key": K, "agent": OUT, "agent_exit": N,
"agent_duration": US, "grade": OUT, "grade_exit": N, "grade_err": ERR}; for each feedback
event {"event": KIND, "sandbox": ID, "seq": N, "replayed": B}; for each feedback
request its handler saw {"feedback": I, "sandbox": ID, "replayed": B,
"logged_reward": R or null}; at the end, once it closed the session,
{"finished": N}. With --stop-after M
it prints {"stopping": M} once M episodes are done and waits to be killed
(the others stay in flight). If the daemon goes away it prints
{"disconnected": why} and exits 3.
"""

import argparse
import asyncio
import json
import sys

import dsec

ENV = dict(base="py@1", chronus=True, memory="64m", pids=32)


# Not idempotent; prints what it did, so a second run (or another episode's
# sandbox) shows.
AGENT = "cat /work/prompt >> /work/runs && wc -l < /work/runs >> /work/runs && cat /work/runs"


def expected_agent(i):
    return f"prompt of episode {i}\n1\n"


GRADER = ("set -e; chronus stage grading; chronus report lines=$(wc -l < /work/runs);"
          " chronus feedback \"$(head -n1 /work/prompt)\"")


def emit(obj):
    print(json.dumps(obj), flush=True)


async def episode(s, sem, i, done):
    async with sem:
        sbs = await s.create_async(key=f"ep-{i}", tags={"episode": str(i)}, **ENV)
        sb = sbs[0]
        emit({"created": i, "sandbox": sb.id})
        await sb.put_async("/work/prompt", f"prompt of episode {i}\n")
        a = await sb.exec_async(AGENT, timeout=60)
        g = await sb.exec_async(GRADER, trusted=True, timeout=60)
        await sb.close_async()
        emit({"episode": i, "sandbox": sb.id, "key": sb.key, "agent": a.stdout.decode(),
              "agent_exit": a.exit_code, "agent_duration": a.duration_us,
              "grade": g.stdout.decode(), "grade_exit": g.exit_code,
              "grade_err": g.stderr.decode()})
        done.append(i)


async def watch(s):
    async for ev in s.events_async():
        emit({"event": ev.kind, "sandbox": ev.sandbox, "seq": ev.seq, "replayed": ev.replayed})
        if ev.kind != "feedback":
            continue
        i = int(ev.payload.decode().split()[-1])
        emit({"feedback": i, "sandbox": ev.sandbox, "replayed": ev.replayed,
              "logged_reward": ev.logged_answer.reward if ev.logged_answer else None})
        await ev.answer_async(reward=float(i), text=f"episode {i}", done=True)


async def main(args):
    c = dsec.connect(args.address)
    try:
        if args.resume:
            for _ in range(600):  # in use while the daemon still closes it
                try:
                    s = await c.resume_async(args.resume)
                    break
                except dsec.InUse:
                    await asyncio.sleep(0.05)
            else:
                s = await c.resume_async(args.resume)
        else:
            s = await c.session_async(quota=args.concurrency, ttl=300, name="episodes")
        emit({"session": s.id})
        watcher = asyncio.ensure_future(watch(s))
        sem = asyncio.Semaphore(args.concurrency)
        done = []
        tasks = [asyncio.ensure_future(episode(s, sem, i, done)) for i in range(args.episodes)]
        if args.stop_after is not None:
            while len(done) < args.stop_after:
                await asyncio.sleep(0.01)
                for t in tasks:
                    if t.done() and t.exception() is not None:
                        raise t.exception()
            emit({"stopping": len(done)})
            await asyncio.sleep(600)
            return 1
        await asyncio.gather(*tasks)
        watcher.cancel()
        await s.close_async()
        emit({"finished": len(done)})  # and closed: its log is gone
        return 0
    except dsec.Disconnected as e:
        emit({"disconnected": str(e)})
        return 3
    finally:
        c.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("address")
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--stop-after", type=int, default=None)
    ap.add_argument("--resume", default=None)
    sys.exit(asyncio.run(main(ap.parse_args())))
