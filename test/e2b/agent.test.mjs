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
    // a chunked request body, by hand
    const url = new URL(process.env.E2B_SANDBOX_URL)
    const chunked = await rawRequest(`POST /files?path=/tmp/chunked HTTP/1.1\r\nHost: x\r\nConnection: close\r\n` +
      `E2b-Sandbox-Id: ${sbx.sandboxId}\r\nX-Access-Token: ${sbx.envdAccessToken}\r\n` +
      `Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n` +
      `6\r\nhello \r\n7\r\nchunked\r\n0\r\n\r\n`)
    assert.match(chunked, /^HTTP\/1\.1 200/)
    assert.equal(await sbx.files.read('/tmp/chunked'), 'hello chunked')
    assert.equal(url.hostname, '127.0.0.1')
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

// Connect envelopes of a streamed response body, as they come.
async function* frames(res) {
  let buf = Buffer.alloc(0)
  for await (const chunk of res.body) {
    buf = Buffer.concat([buf, Buffer.from(chunk)])
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const n = buf.readUInt32BE(1)
      yield { flags: buf[0], msg: JSON.parse(buf.subarray(5, 5 + n).toString()) }
      buf = buf.subarray(5 + n)
    }
  }
}

function startBody(cmd) {
  const body = JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', cmd] } })
  const env = Buffer.alloc(5 + Buffer.byteLength(body))
  env.writeUInt32BE(Buffer.byteLength(body), 1)
  env.write(body, 5)
  return env
}

test('Process/Start on the wire: start, keepalives (Keepalive-Ping-Interval), data, end, end of stream', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const res = await fetch(process.env.E2B_SANDBOX_URL + '/process.Process/Start', {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken,
                 'Content-Type': 'application/connect+json', 'Keepalive-Ping-Interval': '1' },
      body: startBody('while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done'),
    })
    assert.equal(res.status, 200)
    assert.equal(res.headers.get('content-type'), 'application/connect+json')
    const kinds = []
    let out = ''
    for await (const f of frames(res)) {
      if (f.flags === 2) { kinds.push(f.msg.error ? 'error' : 'eos'); break }
      const ev = Object.keys(f.msg.event)[0]
      kinds.push(ev)
      // The command waits for /tmp/go, written once a keepalive came: no clock.
      if (ev === 'keepalive' && kinds.filter((k) => k === 'keepalive').length === 1) await sbx.files.write('/tmp/go', '')
      if (ev === 'data') out += Buffer.from(f.msg.event.data.stdout, 'base64').toString()
      if (ev === 'end') assert.equal(f.msg.event.end.exitCode, 0)
    }
    assert.equal(kinds[0], 'start')
    assert.ok(kinds.includes('keepalive'), kinds.join(','))
    assert.deepEqual(kinds.slice(-2), ['end', 'eos'])
    assert.equal(out, 'done\n')
  } finally {
    await sbx.kill()
  }
})

test('a raw client cut off mid-stream: the command runs to its end, the gateway goes on', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const url = new URL(process.env.E2B_SANDBOX_URL)
    const body = startBody('echo begin; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished > /tmp/done')
    await new Promise((resolve, reject) => {
      const s = net.connect(Number(url.port), url.hostname, () => {
        s.write(`POST /process.Process/Start HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: ${sbx.sandboxId}\r\n` +
          `X-Access-Token: ${sbx.envdAccessToken}\r\nContent-Type: application/connect+json\r\n` +
          `Content-Length: ${body.length}\r\n\r\n`)
        s.write(body)
      })
      let got = ''
      s.on('data', (d) => {
        got += d
        if (got.includes('begin') || got.includes('YmVnaW4K')) { s.destroy(); resolve() }
      })
      s.on('error', reject)
    })
    await sbx.files.write('/tmp/go', '')
    const r = await sbx.commands.run('while [ ! -s /tmp/done ]; do sleep 0.05; done; cat /tmp/done')
    assert.equal(r.stdout, 'finished\n')
  } finally {
    await sbx.kill()
  }
})
