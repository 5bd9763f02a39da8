// A sandbox's ports through getHost (run by test/e2b/run.sh, whose first
// dsec-e2b has --domain dsec.test): a request for PORT-ID.dsec.test to the
// gateway reaches PORT inside the sandbox (busybox httpd there).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import net from 'node:net'
import { Sandbox } from 'e2b'

const gw = new URL(process.env.E2B_API_URL)

// One HTTP request to the gateway for `host`; resolves {status, headers, body}.
function request(host, { method = 'GET', path = '/', headers = {}, body, agent } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: gw.hostname, port: gw.port, method, path, agent,
                               headers: { Host: host, ...headers } }, (res) => {
      const parts = []
      res.on('data', (d) => parts.push(d))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers,
                                    body: Buffer.concat(parts).toString() }))
      res.on('error', reject)
    })
    req.on('error', reject)
    req.end(body)
  })
}

// A web server in `sbx` on `port`: /index.html, and /cgi-bin/echo, which
// answers with the length of what was posted and the traffic token it saw.
async function serve(sbx, port) {
  await sbx.commands.run(`mkdir -p /srv/cgi-bin && echo "hello from $(hostname)" > /srv/index.html
cat > /srv/cgi-bin/echo <<'EOF'
#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
echo "got $(wc -c | tr -d ' ') token=[$HTTP_E2B_TRAFFIC_ACCESS_TOKEN] host=[$HTTP_HOST]"
EOF
chmod +x /srv/cgi-bin/echo`)
  await sbx.commands.run(`httpd -f -p 127.0.0.1:${port} -h /srv`, { background: true })
  await sbx.commands.run(`while ! wget -q -O /dev/null http://127.0.0.1:${port}/index.html; do sleep 0.05; done`)
}

test('getHost: a port inside the sandbox answers through the gateway', async () => {
  const sbx = await Sandbox.create('loopback')
  try {
    assert.equal(sbx.sandboxDomain, 'dsec.test')
    const host = sbx.getHost(8080)
    assert.equal(host, `8080-${sbx.sandboxId}.dsec.test`)
    await serve(sbx, 8080)
    const hostname = (await sbx.commands.run('hostname')).stdout.trim()

    const r = await request(host, { path: '/index.html' })
    assert.equal(r.status, 200, r.body)
    assert.equal(r.body, `hello from ${hostname}\n`)

    // Requests one after another (busybox httpd closes each connection), a
    // 1 MiB body through a CGI that counts it.
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 })
    const big = Buffer.alloc(1 << 20, 'x')
    for (let i = 0; i < 3; ++i) {
      const e = await request(host, { method: 'POST', path: '/cgi-bin/echo', body: big, agent,
                                      headers: { 'Content-Length': big.length } })
      assert.equal(e.status, 200, e.body)
      assert.equal(e.body, `got ${big.length} token=[] host=[${host}]\n`)
    }
    agent.destroy()

    // The same port by E2B's headers (E2b-Sandbox-Id, E2b-Sandbox-Port), any Host.
    const h = await request(gw.host, { path: '/index.html',
                                       headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8080' } })
    assert.equal(h.status, 200, h.body)
    assert.equal(h.body, `hello from ${hostname}\n`)

    // envd's own port by its host name is the gateway's envd (its token checked).
    const envd = await request(sbx.getHost(49983), { path: '/health', headers: { 'X-Access-Token': sbx.envdAccessToken } })
    assert.equal(envd.status, 204)
    const noToken = await request(sbx.getHost(49983), { path: '/health' })
    assert.equal(noToken.status, 401)

    // A port where nothing listens: a 502 naming it.
    const closed = await request(sbx.getHost(8081))
    assert.equal(closed.status, 502)
    assert.match(JSON.parse(closed.body).message, /nothing answered on port 8081/)

    // Out of range.
    const bad = await request(`70000-${sbx.sandboxId}.dsec.test`)
    assert.equal(bad.status, 400)
    assert.match(JSON.parse(bad.body).message, /ports go from 1 to 65535/)

    // A second server on another port, exposed on its first request.
    await serve(sbx, 9000)
    assert.equal((await request(sbx.getHost(9000), { path: '/index.html' })).status, 200)

    // A connection open through the tunnel is closed when the sandbox ends.
    const sock = net.connect({ host: gw.hostname, port: Number(gw.port) })
    await new Promise((resolve) => sock.once('connect', resolve))
    sock.write(`GET /index.html HTTP/1.1\r\nHost: ${host}\r\n\r\n`)
    let got = ''
    await new Promise((resolve) => sock.on('data', (d) => { got += d; if (got.includes('hello from')) resolve() }))
    const closedWithSandbox = new Promise((resolve) => sock.once('close', resolve))
    sock.on('error', () => {})
    await sbx.kill()
    await closedWithSandbox

    const gone = await request(host, { path: '/index.html' })
    assert.equal(gone.status, 502)
    assert.equal(JSON.parse(gone.body).message, 'The sandbox was not found')
  } finally {
    await sbx.kill()
  }
})

test('allowPublicTraffic false: a port takes only requests with the traffic token, which it does not see', async () => {
  const sbx = await Sandbox.create('loopback', { network: { allowPublicTraffic: false } })
  try {
    assert.match(sbx.trafficAccessToken, /^[0-9a-f]{32}$/)
    await serve(sbx, 8080)
    const host = sbx.getHost(8080)
    const no = await request(host, { path: '/index.html' })
    assert.equal(no.status, 403)
    assert.match(JSON.parse(no.body).message, /e2b-traffic-access-token/)
    const wrong = await request(host, { path: '/index.html', headers: { 'e2b-traffic-access-token': 'f'.repeat(32) } })
    assert.equal(wrong.status, 403)
    const yes = await request(host, { method: 'POST', path: '/cgi-bin/echo', body: 'abc',
                                      headers: { 'e2b-traffic-access-token': sbx.trafficAccessToken } })
    assert.equal(yes.status, 200, yes.body)
    assert.equal(yes.body, `got 3 token=[] host=[${host}]\n`)
    // The token comes back with the sandbox's info and with connect.
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(again.trafficAccessToken, sbx.trafficAccessToken)
  } finally {
    await sbx.kill()
  }
})

test('getHost errors: no network of its own, an unknown sandbox; allowOut on a loopback template', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const r = await request(sbx.getHost(8080))
    assert.equal(r.status, 502)
    assert.match(JSON.parse(r.body).message, /cannot expose its port 8080: .*network none/)
    // Other sandboxes of the gateway still answer envd calls meanwhile.
    assert.equal((await sbx.commands.run('echo fine')).stdout, 'fine\n')
  } finally {
    await sbx.kill()
  }
  const unknown = await request('8080-0123456789ab.dsec.test')
  assert.equal(unknown.status, 502)
  assert.equal(JSON.parse(unknown.body).sandboxId, '0123456789ab')
  await assert.rejects(Sandbox.create('loopback', { network: { allowOut: ['198.18.0.1'] } }),
                       /template 'loopback' has no egress \(network loopback\)/)
})
