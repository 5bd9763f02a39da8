// Run by test/e2b/run.sh against a dsec-e2b on a coordinator with one node
// (DSEC_NODE_PID): the node hangs until the coordinator declares it lost.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

test('a sandbox lost with its node: the SDK shows an error, the gateway goes on', async () => {
  const sbx = await Sandbox.create('base')
  assert.equal((await sbx.commands.run('echo on the node')).stdout, 'on the node\n')
  const node = Number(process.env.DSEC_NODE_PID)
  process.kill(node, 'SIGSTOP')
  try {
    // Answered once the coordinator counts the node lost (its heartbeats stopped).
    await assert.rejects(sbx.commands.run('echo lost?', { timeoutMs: 120_000 }), (e) => {
      assert.match(e.message, /lost|not running/i)
      return true
    })
  } finally {
    process.kill(node, 'SIGCONT')
  }
  assert.equal(await sbx.isRunning(), false)
  const mine = []
  const pager = Sandbox.list()
  while (pager.hasNext) mine.push(...(await pager.nextItems()))
  assert.equal(mine.find((s) => s.sandboxId === sbx.sandboxId), undefined)
  // Awake, the node rejoins: new sandboxes work again.
  let again
  for (let i = 0; i < 600 && !again; i++) {
    again = await Sandbox.create('base').catch(() => undefined)
    if (!again) await new Promise((r) => setTimeout(r, 100))
  }
  assert.ok(again, 'a sandbox after the node rejoined')
  assert.equal((await again.commands.run('echo back')).stdout, 'back\n')
  await again.kill()
})

test('a node killed outright (kill -9): its sandbox fails its calls and streams, the gateway goes on', async () => {
  const sbx = await Sandbox.create('base')
  const streamed = []
  const bg = await sbx.commands.run('echo streaming; sleep 600', { background: true, onStdout: (d) => streamed.push(d) })
  while (!streamed.length) await new Promise((r) => setTimeout(r, 20))
  process.kill(Number(process.env.DSEC_NODE_PID), 'SIGKILL')
  // The streaming command ends with an error, not silently and not never.
  await assert.rejects(bg.wait(), (e) => {
    assert.match(e.message, /lost|unavailable|not running|terminated/i)
    return true
  })
  await assert.rejects(sbx.commands.run('echo gone?', { timeoutMs: 120_000 }), (e) => {
    assert.match(e.message, /lost|not running/i)
    return true
  })
  assert.equal(await sbx.isRunning(), false)
  // The gateway answers on: the coordinator runs nothing itself (--slots 0), so a
  // create is refused with a reason while no node is up, never left hanging.
  await assert.rejects(Sandbox.create('base'), (e) => {
    assert.match(e.message, /creating the sandbox: /)
    return true
  })
  const res = await fetch(process.env.E2B_API_URL + '/health')
  assert.equal(res.status, 200)
})
