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
