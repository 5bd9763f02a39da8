// E2B's egress options through the SDK (run by test/e2b/run.sh): template
// "online" allows 198.18.0.2:8000, 198.18.0.3:8000, allowed.test and
// *.sub.test, the run's test internet (a network namespace: httpd on both,
// dnsmasq saying allowed.test and the names below sub.test are 198.18.0.3). allowInternetAccess, allowOut and denyOut narrow that policy,
// at create and by updateNetwork; what would widen it is refused.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, ALL_TRAFFIC } from 'e2b'

// Whether `sbx` gets the test internet's page at `url` (a dropped packet: no
// answer within 2 s; busybox 1.35's wget -T crashes, so timeout(1) bounds it).
async function reaches(sbx, url) {
  try {
    const r = await sbx.commands.run(`timeout 2 wget -q -O - ${url}`)
    assert.equal(r.stdout, 'hello from the test internet\n')
    return true
  } catch (e) {
    if (e.exitCode === undefined) throw e
    return false
  }
}

const two = 'http://198.18.0.2:8000/'
const three = 'http://198.18.0.3:8000/'
const named = 'http://allowed.test:8000/'

test('the template\'s policy as it is, then narrowed and restored by updateNetwork', async () => {
  const sbx = await Sandbox.create('online')
  try {
    assert.equal(await reaches(sbx, two), true)
    assert.equal(await reaches(sbx, three), true)
    assert.equal(await reaches(sbx, named), true)
    await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC] })
    assert.equal(await reaches(sbx, two), false)
    assert.equal(await reaches(sbx, three), false)
    await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: ['198.18.0.3'] })
    assert.equal(await reaches(sbx, three), true)
    assert.equal(await reaches(sbx, two), false)
    // Omitted fields are cleared: the template's policy again.
    await sbx.updateNetwork({})
    assert.equal(await reaches(sbx, two), true)
    await assert.rejects(sbx.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: ['198.18.0.9'] }),
                         /not within template 'online'/)
    assert.equal(await reaches(sbx, two), true, 'a refused update changes nothing')
  } finally {
    await sbx.kill()
  }
})

test('allowInternetAccess false: nothing goes out, names are refused', async () => {
  const sbx = await Sandbox.create('online', { allowInternetAccess: false })
  try {
    assert.equal(await reaches(sbx, two), false)
    assert.equal(await reaches(sbx, three), false)
    assert.equal(await reaches(sbx, named), false)
  } finally {
    await sbx.kill()
  }
})

test('denyOut ALL_TRAFFIC with allowOut: only what allowOut names, an address or a name', async () => {
  const a = await Sandbox.create('online', { network: { denyOut: [ALL_TRAFFIC], allowOut: ['198.18.0.2'] } })
  const b = await Sandbox.create('online', { network: { denyOut: [ALL_TRAFFIC], allowOut: ['allowed.test'] } })
  const c = await Sandbox.create('online', { network: { denyOut: [ALL_TRAFFIC], allowOut: ['www.sub.test'] } })
  try {
    assert.equal(await reaches(a, two), true)
    assert.equal(await reaches(a, three), false)
    assert.equal(await reaches(a, named), false)
    assert.equal(await reaches(b, two), false)
    assert.equal(await reaches(b, named), true)
    // A name below the template's *.sub.test, and only it.
    assert.equal(await reaches(c, 'http://www.sub.test:8000/'), true)
    assert.equal(await reaches(c, 'http://ftp.sub.test:8000/'), false)
    assert.equal(await reaches(c, named), false)
  } finally {
    await a.kill()
    await b.kill()
    await c.kill()
  }
})

test('denyOut of one address: the rest of the template\'s policy stays', async () => {
  const sbx = await Sandbox.create('online', { network: { denyOut: ['198.18.0.3'] } })
  try {
    assert.equal(await reaches(sbx, two), true)
    assert.equal(await reaches(sbx, three), false)
  } finally {
    await sbx.kill()
  }
})

test('what would widen a template, or cannot be said in dsec, is refused naming it', async () => {
  await assert.rejects(Sandbox.create('online', { network: { denyOut: [ALL_TRAFFIC], allowOut: ['198.18.0.9'] } }),
                       /network.allowOut '198.18.0.9' is not within template 'online'/)
  await assert.rejects(Sandbox.create('online', { network: { denyOut: [ALL_TRAFFIC], allowOut: ['example.org'] } }),
                       /network.allowOut 'example.org' is not within/)
  await assert.rejects(Sandbox.create('online', { network: { denyOut: ['allowed.test'] } }),
                       /only IP addresses and CIDR ranges are denied/)
  await assert.rejects(Sandbox.create('online', { network: { denyOut: ['198.18.0.0/24'], allowOut: ['198.18.0.2'] } }),
                       /overlaps network.denyOut '198.18.0.0\/24'/)
  await assert.rejects(Sandbox.create('base', { network: { allowOut: ['198.18.0.2'] } }),
                       /template 'base' has no egress \(network none\)/)
  // Narrowing what has no egress is allowed (and changes nothing).
  const sbx = await Sandbox.create('base', { allowInternetAccess: false, network: { denyOut: [ALL_TRAFFIC] } })
  try {
    assert.equal((await sbx.commands.run('echo fine')).stdout, 'fine\n')
    await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC] })
    await assert.rejects(sbx.updateNetwork({ allowOut: ['198.18.0.2'] }), /has no egress/)
  } finally {
    await sbx.kill()
  }
  const res = await fetch(process.env.E2B_API_URL + '/v2/sandboxes', {
    method: 'POST', headers: { 'X-API-KEY': process.env.E2B_API_KEY },
    body: JSON.stringify({ templateID: 'online', network: { maskRequestHost: 'x' } }) })
  assert.equal(res.status, 400)
  assert.match((await res.json()).message, /network.maskRequestHost is not supported/)
})
