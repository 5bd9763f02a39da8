// An agent-style workload through the real SDK: 50 sandboxes at once, each
// gets a script written, runs it, and its result is read back.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import net from 'node:net'
import { Sandbox } from 'e2b'

test('50 sandboxes in parallel: write a file, run it, read the result', async () => {
  const n = 50
  const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
    const sbx = await Sandbox.create('base', { metadata: { agent: String(i) } })
    try {
      await sbx.files.write('/root/task.sh', `#!/bin/bash\nsum=0\nfor k in $(seq 1 ${i + 1}); do sum=$((sum + k)); done\necho "$sum" > /root/answer\necho "agent ${i} done"\n`)
      const r = await sbx.commands.run('bash /root/task.sh')
      assert.equal(r.stdout, `agent ${i} done\n`)
      return Number((await sbx.files.read('/root/answer')).trim())
    } finally {
      await sbx.kill()
    }
  }))
  assert.deepEqual(results, Array.from({ length: n }, (_, i) => ((i + 1) * (i + 2)) / 2))
})

// Raw HTTP the gateway must survive: garbage, a client gone mid-stream.
function rawRequest(text) {
  const url = new URL(process.env.E2B_API_URL)
  return new Promise((resolve, reject) => {
    const s = net.connect(Number(url.port), url.hostname, () => s.write(text))
    let got = ''
    s.on('data', (d) => { got += d })
    s.on('end', () => resolve(got))
    s.on('error', reject)
  })
}

test('garbage requests get a clear 4xx and the gateway goes on', async () => {
  const g = await rawRequest('HELLO THERE\r\n\r\n')
  assert.match(g, /^HTTP\/1\.1 400/)
  const h = await rawRequest('GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n')
  assert.match(h, /^HTTP\/1\.1 400/)
  const big = await rawRequest('POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-API-KEY: ' + process.env.E2B_API_KEY +
    '\r\nContent-Length: 999999999999\r\n\r\n')
  assert.match(big, /^HTTP\/1\.1 413/)
  const noKey = await fetch(process.env.E2B_API_URL + '/v2/sandboxes')
  assert.equal(noKey.status, 401)
  const unknown = await fetch(process.env.E2B_API_URL + '/nothing/here', { headers: { 'X-API-KEY': process.env.E2B_API_KEY } })
  assert.equal(unknown.status, 404)
  assert.equal((await unknown.json()).code, 404)
  // Connect calls with the wrong codec or a broken envelope
  const sbx = await Sandbox.create('base')
  try {
    const hdr = { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken }
    const proto = await fetch(process.env.E2B_SANDBOX_URL + '/process.Process/Start', { method: 'POST', headers: { ...hdr, 'Content-Type': 'application/connect+proto' }, body: 'x' })
    assert.equal(proto.status, 415)
    const env = await fetch(process.env.E2B_SANDBOX_URL + '/process.Process/Start', { method: 'POST', headers: { ...hdr, 'Content-Type': 'application/connect+json' }, body: '\x00\x00\x00\x00\xffjunk' })
    const body = Buffer.from(await env.arrayBuffer())
    assert.equal(body[0], 2) // the end-of-stream frame
    assert.match(body.subarray(5).toString(), /invalid_argument/)
    const unary = await fetch(process.env.E2B_SANDBOX_URL + '/filesystem.Filesystem/Stat', { method: 'POST', headers: { ...hdr, 'Content-Type': 'application/json' }, body: '[1,2' })
    assert.equal(unary.status, 400)
    assert.equal((await unary.json()).code, 'invalid_argument')
    assert.equal((await sbx.commands.run('echo still')).stdout, 'still\n')
  } finally {
    await sbx.kill()
  }
})

test('a client that disconnects mid-stream: the command goes on, the gateway too', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const ac = new AbortController()
    const started = sbx.commands.run('echo begin; sleep 1; echo finished > /tmp/done', { background: true, signal: ac.signal })
    const h = await started
    ac.abort()
    await h.disconnect()
    // The command still runs to its end in the sandbox.
    const r = await sbx.commands.run('while [ ! -s /tmp/done ]; do sleep 0.1; done; cat /tmp/done', { timeoutMs: 30_000 })
    assert.equal(r.stdout, 'finished\n')
  } finally {
    await sbx.kill()
  }
})
