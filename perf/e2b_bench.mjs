// perf/e2b_bench.sh's measurement (see there): the e2b SDK through dsec-e2b,
// then dsec-load (the native client) with the same N, C, K and command.
import { execFileSync } from 'node:child_process'
import { readFileSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

const { Sandbox } = await import(join(process.env.E2B_SDK_DIR, 'node_modules/e2b/dist/index.mjs'))
const N = Number(process.env.E2B_BENCH_N), C = Number(process.env.E2B_BENCH_C), K = Number(process.env.E2B_BENCH_K)

function pct(xs, p) {
  const s = [...xs].sort((a, b) => a - b)
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : NaN
}

async function e2b() {
  const creates = [], cmds = []
  let next = 0
  const t0 = performance.now()
  async function worker() {
    while (next < N) {
      next++
      const a = performance.now()
      const sbx = await Sandbox.create('base')
      creates.push(performance.now() - a)
      for (let k = 0; k < K; k++) {
        const b = performance.now()
        await sbx.commands.run('true')
        cmds.push(performance.now() - b)
      }
      await sbx.kill()
    }
  }
  await Promise.all(Array.from({ length: C }, worker))
  const wall = (performance.now() - t0) / 1000
  return { rate: N / wall, c50: pct(creates, 50), c99: pct(creates, 99), x50: pct(cmds, 50), x99: pct(cmds, 99) }
}

// The same episodes over plain HTTP (fetch): what dsec-e2b costs without the SDK.
async function raw() {
  const api = process.env.E2B_API_URL
  const H = { 'X-API-KEY': process.env.E2B_API_KEY, 'Content-Type': 'application/json' }
  const body = JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', 'true'] } })
  const env = Buffer.alloc(5 + Buffer.byteLength(body))
  env.writeUInt32BE(Buffer.byteLength(body), 1)
  env.write(body, 5)
  const creates = [], cmds = []
  let next = 0
  const t0 = performance.now()
  async function worker() {
    while (next < N) {
      next++
      const a = performance.now()
      const c = await (await fetch(api + '/v2/sandboxes', { method: 'POST', headers: H, body: '{"templateID":"base"}' })).json()
      creates.push(performance.now() - a)
      const sh = { 'E2b-Sandbox-Id': c.sandboxID, 'X-Access-Token': c.envdAccessToken, 'Content-Type': 'application/connect+json' }
      for (let k = 0; k < K; k++) {
        const b = performance.now()
        const out = Buffer.from(await (await fetch(process.env.E2B_SANDBOX_URL + '/process.Process/Start', { method: 'POST', headers: sh, body: env })).arrayBuffer())
        if (!out.includes('"exitCode":0')) throw new Error('raw command failed: ' + out.toString())
        cmds.push(performance.now() - b)
      }
      await fetch(api + '/sandboxes/' + c.sandboxID, { method: 'DELETE', headers: H })
    }
  }
  await Promise.all(Array.from({ length: C }, worker))
  const wall = (performance.now() - t0) / 1000
  return { rate: N / wall, c50: pct(creates, 50), c99: pct(creates, 99), x50: pct(cmds, 50), x99: pct(cmds, 99) }
}

function native() {
  const dir = mkdtempSync(join(tmpdir(), 'e2b-bench-'))
  try {
    const out = join(dir, 'load.json')
    execFileSync(process.env.DSEC_LOAD_BIN, ['--connect', process.env.DSEC_CONNECT, '--count', String(N),
      '--concurrency', String(C), '--commands', String(K), '--base', 'e2bbase@1', '--json', out, '--quiet',
      '--', '/bin/bash', '-l', '-c', 'true'], { stdio: ['ignore', 'ignore', 'inherit'] })
    const j = JSON.parse(readFileSync(out, 'utf8'))
    return { rate: j.rate_per_s, c50: j.create_ms.p50, c99: j.create_ms.p99, x50: j.exec_ms.p50, x99: j.exec_ms.p99 }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

// CPU seconds of dsec-e2b (from /proc) and of this node process, per phase.
function gwCpu() {
  const f = readFileSync(`/proc/${process.env.DSEC_GATEWAY_PID}/stat`, 'utf8').split(') ')[1].split(' ')
  return (Number(f[11]) + Number(f[12])) / 100
}
function phase(fn) {
  return async () => {
    const g0 = gwCpu(), n0 = process.cpuUsage()
    const res = await fn()
    const n1 = process.cpuUsage(n0)
    res.gw = gwCpu() - g0
    res.node = (n1.user + n1.system) / 1e6
    return res
  }
}
const a = await phase(e2b)()
const r = await phase(raw)()
const b = native()
const f = (x) => x.toFixed(1).padStart(9)
console.log(`N=${N} episodes, C=${C} at a time, K=${K} commands each (/bin/bash -l -c true)`)
console.log('                         episodes/s  create p50  create p99  command p50  command p99  (ms)')
console.log(`e2b SDK via dsec-e2b    ${f(a.rate)}   ${f(a.c50)}   ${f(a.c99)}    ${f(a.x50)}    ${f(a.x99)}`)
console.log(`plain HTTP via dsec-e2b ${f(r.rate)}   ${f(r.c50)}   ${f(r.c99)}    ${f(r.x50)}    ${f(r.x99)}`)
console.log(`dsec native (dsec-load) ${f(b.rate)}   ${f(b.c50)}   ${f(b.c99)}    ${f(b.x50)}    ${f(b.x99)}`)
console.log(`CPU seconds, SDK run: node ${a.node.toFixed(1)}, dsec-e2b ${a.gw.toFixed(1)}; plain HTTP run: node ${r.node.toFixed(1)}, dsec-e2b ${r.gw.toFixed(1)}`)
