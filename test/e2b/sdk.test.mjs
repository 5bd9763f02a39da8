// The e2b SDK, unchanged, against dsec-e2b (run by test/e2b/run.sh).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { Sandbox, CommandExitError, NotFoundError, SandboxNotFoundError, AuthenticationError } from 'e2b'

const api = process.env.E2B_API_URL
const key = process.env.E2B_API_KEY
const otherKey = process.env.E2B_OTHER_API_KEY

async function rest(method, path, body, apiKey = key) {
  const res = await fetch(api + path, {
    method,
    headers: { 'X-API-KEY': apiKey, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  return { status: res.status, headers: res.headers, json: text ? JSON.parse(text) : undefined }
}

test('create (POST /v2/sandboxes through the SDK), run a command, kill', async () => {
  const sbx = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { run: 'one' }, envs: { GREETING: 'hello' } })
  try {
    assert.match(sbx.sandboxId, /\S+/)
    const r = await sbx.commands.run('echo "$GREETING from $(pwd)"; echo oops >&2')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello from /root\n')
    assert.equal(r.stderr, 'oops\n')
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.deepEqual(info.metadata, { run: 'one' })
    assert.equal(info.state, 'running')
    assert.equal(await sbx.isRunning(), true)
  } finally {
    assert.equal(await sbx.kill(), true)
  }
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  assert.equal(await sbx.isRunning(), false)
})

test('create through POST /sandboxes (v1), then Sandbox.connect', async () => {
  const r = await rest('POST', '/sandboxes', { templateID: 'base', timeout: 60 })
  assert.equal(r.status, 201)
  for (const f of ['sandboxID', 'templateID', 'clientID', 'envdVersion', 'envdAccessToken'])
    assert.ok(r.json[f], `the answer has ${f}`)
  assert.equal(r.json.templateID, 'base')
  const sbx = await Sandbox.connect(r.json.sandboxID)
  try {
    const out = await sbx.commands.run('echo connected')
    assert.equal(out.stdout, 'connected\n')
  } finally {
    await sbx.kill()
  }
})

test('exit codes: a failing command throws CommandExitError with its code', async () => {
  const sbx = await Sandbox.create('base')
  try {
    await assert.rejects(sbx.commands.run('echo partial; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stdout, 'partial\n')
      return true
    })
    const r = await sbx.commands.run('true')
    assert.equal(r.exitCode, 0)
    // bash -l -c: a login shell, bash syntax
    const b = await sbx.commands.run('arr=(a b c); echo ${#arr[@]} $BASH_VERSION | cut -c1-3')
    assert.equal(b.stdout, '3 5\n')
  } finally {
    await sbx.kill()
  }
})

test('stdout and stderr stream as they come, in order', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const events = []
    const r = await sbx.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done', {
      onStdout: (d) => events.push(['out', d]),
      onStderr: (d) => events.push(['err', d]),
    })
    assert.equal(r.stdout, 'out1\nout2\nout3\n')
    assert.equal(r.stderr, 'err1\nerr2\nerr3\n')
    const outs = events.filter((e) => e[0] === 'out').map((e) => e[1]).join('')
    assert.equal(outs, r.stdout)
    // More than one piece arrived: they were streamed, not collected at the end.
    assert.ok(events.filter((e) => e[0] === 'out').length >= 2, JSON.stringify(events))
  } finally {
    await sbx.kill()
  }
})

test('background commands: list, connect, kill', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const got = []
    const h = await sbx.commands.run('echo started; sleep 600', { background: true, onStdout: (d) => got.push(d) })
    assert.ok(h.pid > 0)
    const list = await sbx.commands.list()
    const mine = list.find((p) => p.pid === h.pid)
    assert.ok(mine, JSON.stringify(list))
    assert.equal(mine.cmd, '/bin/bash')
    assert.deepEqual(mine.args, ['-l', '-c', 'echo started; sleep 600'])
    const again = await sbx.commands.connect(h.pid)
    assert.equal(again.pid, h.pid)
    assert.equal(await h.kill(), true)
    await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0)
    await assert.rejects(again.wait(), (e) => e instanceof CommandExitError)
    assert.deepEqual(got, ['started\n'])
    assert.equal((await sbx.commands.list()).find((p) => p.pid === h.pid), undefined)
    assert.equal(await sbx.commands.kill(h.pid), false)
    // kill takes the command's process group: its children too.
    const g = await sbx.commands.run('sleep 501 & sleep 502 & wait', { background: true })
    await sbx.commands.run('while ! ps | grep -q "[s]leep 502"; do sleep 0.05; done')
    assert.equal(await g.kill(), true)
    await assert.rejects(g.wait())
    const ps = await sbx.commands.run('ps')
    assert.doesNotMatch(ps.stdout, /sleep 50[12]/)
    // A finished background command's result.
    const q = await sbx.commands.run('echo bg-done', { background: true })
    const qr = await q.wait()
    assert.equal(qr.stdout, 'bg-done\n')
  } finally {
    await sbx.kill()
  }
})

test('a command timeout (connect-timeout-ms) ends the command', async () => {
  const sbx = await Sandbox.create('base')
  try {
    await assert.rejects(sbx.commands.run('sleep 600', { timeoutMs: 1000 }))
    // The sandbox goes on serving.
    assert.equal((await sbx.commands.run('echo after')).stdout, 'after\n')
  } finally {
    await sbx.kill()
  }
})

test('files: write, read, list, exists, makeDir, rename, remove', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const info = await sbx.files.write('/tmp/a.txt', 'hello file')
    assert.equal(info.path, '/tmp/a.txt')
    assert.equal(await sbx.files.read('/tmp/a.txt'), 'hello file')
    // Relative paths resolve against the template's cwd (/root).
    await sbx.files.write('rel.txt', 'relative')
    assert.equal((await sbx.commands.run('cat /root/rel.txt')).stdout, 'relative')
    // Missing parents are made.
    await sbx.files.write('/tmp/x/y/z.bin', new Uint8Array([0, 1, 2, 255]))
    assert.deepEqual([...(await sbx.files.read('/tmp/x/y/z.bin', { format: 'bytes' }))], [0, 1, 2, 255])
    // octet-stream upload (envd >= 0.5.7)
    await sbx.files.write('/tmp/octet.txt', 'by octet-stream', { useOctetStream: true })
    assert.equal(await sbx.files.read('/tmp/octet.txt'), 'by octet-stream')
    // a stream body: an octet-stream upload sent chunked (Transfer-Encoding: chunked)
    const parts = ['streamed ', 'in ', 'pieces']
    const stream = new ReadableStream({ pull(c) { parts.length ? c.enqueue(new TextEncoder().encode(parts.shift())) : c.close() } })
    await sbx.files.write('/tmp/streamed.txt', stream)
    assert.equal(await sbx.files.read('/tmp/streamed.txt'), 'streamed in pieces')
    // several files in one multipart upload
    await sbx.files.write([{ path: '/tmp/m1', data: 'one' }, { path: '/tmp/m2', data: 'two' }])
    assert.equal((await sbx.commands.run('cat /tmp/m1 /tmp/m2')).stdout, 'onetwo')
    // a large file
    const big = 'x'.repeat(3 << 20)
    await sbx.files.write('/tmp/big', big)
    assert.equal((await sbx.files.read('/tmp/big')).length, big.length)
    // a file written by a command
    await sbx.commands.run('printf "from cmd" > /tmp/c.txt')
    assert.equal(await sbx.files.read('/tmp/c.txt'), 'from cmd')

    const entries = await sbx.files.list('/tmp')
    const names = entries.map((e) => e.name)
    for (const n of ['a.txt', 'x', 'octet.txt', 'c.txt']) assert.ok(names.includes(n), names.join(','))
    const a = entries.find((e) => e.name === 'a.txt')
    assert.equal(a.type, 'file')
    assert.equal(a.path, '/tmp/a.txt')
    assert.equal(a.size, 10)
    assert.equal(entries.find((e) => e.name === 'x').type, 'dir')

    assert.equal(await sbx.files.exists('/tmp/a.txt'), true)
    assert.equal(await sbx.files.exists('/tmp/nope'), false)
    assert.equal(await sbx.files.makeDir('/tmp/newdir/sub'), true)
    assert.equal(await sbx.files.makeDir('/tmp/newdir/sub'), false)
    const st = await sbx.files.getInfo('/tmp/newdir/sub')
    assert.equal(st.type, 'dir')
    const moved = await sbx.files.rename('/tmp/a.txt', '/tmp/newdir/b.txt')
    assert.equal(moved.path, '/tmp/newdir/b.txt')
    assert.equal(await sbx.files.read('/tmp/newdir/b.txt'), 'hello file')
    await sbx.files.remove('/tmp/newdir')
    assert.equal(await sbx.files.exists('/tmp/newdir'), false)

    await assert.rejects(sbx.files.read('/tmp/does-not-exist'), (e) => e instanceof NotFoundError)
    await assert.rejects(sbx.files.list('/tmp/does-not-exist'), (e) => e instanceof NotFoundError)
  } finally {
    await sbx.kill()
  }
})

test('setTimeout moves endAt; Sandbox.list pages; connect sees the same sandbox', async () => {
  const sbxs = await Promise.all([1, 2, 3].map((i) => Sandbox.create('base', { timeoutMs: 60_000, metadata: { batch: 'list', i: String(i) } })))
  try {
    const before = (await sbxs[0].getInfo()).endAt
    await sbxs[0].setTimeout(600_000)
    const after = (await sbxs[0].getInfo()).endAt
    assert.ok(after.getTime() > before.getTime() + 500_000, `${before} -> ${after}`)

    // paging: limit 2 gives a next token
    const pager = Sandbox.list({ limit: 2, query: { metadata: { batch: 'list' } } })
    const seen = []
    while (pager.hasNext) seen.push(...(await pager.nextItems()))
    assert.deepEqual(seen.map((s) => s.sandboxId).sort(), sbxs.map((s) => s.sandboxId).sort())
    assert.equal(seen[0].state, 'running')
    assert.equal(seen[0].templateId, 'base')

    // connect: the same sandbox, its files
    await sbxs[1].files.write('/tmp/mark', 'same')
    const c = await Sandbox.connect(sbxs[1].sandboxId)
    assert.equal(await c.files.read('/tmp/mark'), 'same')
  } finally {
    await Promise.all(sbxs.map((s) => s.kill()))
  }
})

test('pause and resume (the cgroup freezer)', async () => {
  const sbx = await Sandbox.create('base')
  try {
    await sbx.files.write('/tmp/kept', 'kept')
    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.pause(), false)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await back.getInfo()).state, 'running')
    assert.equal(await back.files.read('/tmp/kept'), 'kept')
  } finally {
    await sbx.kill()
  }
})

test('errors: unknown sandbox, bad key, another key\'s sandbox, unknown template', async () => {
  await assert.rejects(Sandbox.connect('no-such-sandbox'), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  await assert.rejects(Sandbox.getInfo('no-such-sandbox'), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  await assert.rejects(Sandbox.create('base', { apiKey: 'e2b_00' }), (e) => e instanceof AuthenticationError)
  await assert.rejects(Sandbox.create('no-such-template'), (e) => /no-such-template/.test(e.message))

  const sbx = await Sandbox.create('base')
  try {
    // The other key cannot see it, connect to it, extend or kill it.
    const theirs = []
    const pager = Sandbox.list({ apiKey: otherKey })
    while (pager.hasNext) theirs.push(...(await pager.nextItems()))
    assert.equal(theirs.find((s) => s.sandboxId === sbx.sandboxId), undefined)
    await assert.rejects(Sandbox.connect(sbx.sandboxId, { apiKey: otherKey }), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
    await assert.rejects(Sandbox.setTimeout(sbx.sandboxId, 10_000, { apiKey: otherKey }))
    assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: otherKey }), false)
    assert.equal(await sbx.isRunning(), true)

    // The envd endpoint wants the sandbox's access token.
    const wrong = await fetch(api + '/files?path=/etc/passwd', { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': 'wrong' } })
    assert.equal(wrong.status, 401)
    const none = await fetch(api + '/files?path=/etc/passwd', { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
    assert.equal(none.status, 401)
    // The SDK itself, with a forged token: AuthenticationError everywhere.
    const forged = new Sandbox({ ...sbx.connectionConfig, sandboxId: sbx.sandboxId, envdAccessToken: 'forged', envdVersion: '0.5.7' })
    await assert.rejects(forged.commands.run('echo no'), (e) => e instanceof AuthenticationError)
    await assert.rejects(forged.files.read('/etc/passwd'), (e) => e instanceof AuthenticationError)
    await assert.rejects(forged.files.list('/etc'), (e) => e instanceof AuthenticationError)
    await assert.rejects(forged.files.write('/tmp/x', 'x'), (e) => e instanceof AuthenticationError)

    // bad bodies
    const bad = await fetch(api + '/v2/sandboxes', { method: 'POST', headers: { 'X-API-KEY': key, 'Content-Type': 'application/json' }, body: '{not json' })
    assert.equal(bad.status, 400)
    assert.equal((await bad.json()).code, 400)
    const badTimeout = await rest('POST', '/v2/sandboxes', { templateID: 'base', timeout: -5 })
    assert.equal(badTimeout.status, 400)
    assert.match(badTimeout.json.message, /timeout/)
    // Options dsec-e2b cannot honour are refused, naming them (not ignored).
    for (const [field, value] of [['autoPause', true], ['autoResume', { enabled: true }],
                                  ['volumeMounts', [{ name: 'v', path: '/data' }]],
                                  ['mcp', { github: {} }]]) {
      const refused = await rest('POST', '/v2/sandboxes', { templateID: 'base', [field]: value })
      assert.equal(refused.status, 400, field)
      assert.match(refused.json.message, new RegExp(`${field} is not supported by dsec-e2b`))
    }
    await assert.rejects(Sandbox.create('base', { lifecycle: { onTimeout: 'pause' } }),
                         /autoPause is not supported by dsec-e2b/)
    // Their "off" values are what the SDK may send by default: accepted.
    const off = await rest('POST', '/v2/sandboxes', { templateID: 'base', autoPause: false,
                                                      autoResume: { enabled: false }, volumeMounts: [] })
    assert.equal(off.status, 201, JSON.stringify(off.json))
    await Sandbox.kill(off.json.sandboxID)
  } finally {
    await sbx.kill()
  }
})

test('a sandbox destroyed behind the gateway: the SDK shows an error', async () => {
  const sbx = await Sandbox.create('base')
  execFileSync(process.env.DSEC_BIN, ['--connect', process.env.DSEC_CONNECT, 'rm', sbx.sandboxId])
  await assert.rejects(sbx.commands.run('echo gone'))
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})

test('envdVersion 0.5.7 and the SDK paths it selects', async () => {
  const r = await rest('POST', '/v2/sandboxes', { templateID: 'base' })
  assert.equal(r.status, 201)
  assert.equal(r.json.envdVersion, '0.5.7')
  const sbx = await Sandbox.connect(r.json.sandboxID)
  try {
    // >= 0.4.0: no default user; root is the sandbox's root, another user is
    // looked up in the image: uid, groups, HOME and USER
    assert.equal((await sbx.commands.run('id -u', { user: 'root' })).stdout, '0\n')
    assert.equal((await sbx.commands.run('id -u; id -G; echo $HOME $USER', { user: 'user' })).stdout,
      '1000\n1000 2000\n/home/user user\n')
    await assert.rejects(sbx.commands.run('true', { user: 'nobody-here' }), /nobody-here/)
    // >= 0.3.0: the stdin flag may be sent
    assert.equal((await sbx.commands.run('echo x', { stdin: false })).stdout, 'x\n')
    // >= 0.5.2: closeStdin is a CloseStdin call
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await h.sendStdin('data')
    await h.closeStdin()
    assert.equal((await h.wait()).stdout, 'data')
    // >= 0.5.7: octet-stream uploads (tested in 'files'); gzip uploads are refused clearly
    await assert.rejects(sbx.files.write('/tmp/gz', 'data', { gzip: true }), /Content-Encoding/)
  } finally {
    await sbx.kill()
  }
})

test('files as a user: relative paths from its home, what is made is its own', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const owner = async (p) => (await sbx.commands.run(`stat -c '%u:%g' ${p}`, { user: 'root' })).stdout.trim()
    const info = await sbx.files.write('notes.txt', 'mine', { user: 'user' })
    assert.equal(info.path, '/home/user/notes.txt')
    assert.equal(await owner('/home/user/notes.txt'), '1000:1000')
    assert.equal(await sbx.files.read('notes.txt', { user: 'user' }), 'mine')
    // Missing parents are made for it, and are its own too.
    await sbx.files.write('/tmp/u1/u2/f.txt', 'deep', { user: 'user' })
    assert.equal(await owner('/tmp/u1'), '1000:1000')
    assert.equal(await owner('/tmp/u1/u2'), '1000:1000')
    assert.equal(await owner('/tmp/u1/u2/f.txt'), '1000:1000')
    // So is a directory it makes (and its parent), which it can write into.
    assert.equal(await sbx.files.makeDir('proj/src', { user: 'user' }), true)
    assert.equal(await owner('/home/user/proj'), '1000:1000')
    assert.equal(await owner('/home/user/proj/src'), '1000:1000')
    await sbx.commands.run('echo ok > /home/user/proj/src/w', { user: 'user' })
    const names = (await sbx.files.list('.', { user: 'user' })).map((e) => e.name)
    assert.ok(names.includes('notes.txt') && names.includes('proj'), names.join(' '))
    assert.equal(await sbx.files.exists('proj/src/w', { user: 'user' }), true)
    assert.equal(await sbx.files.exists('proj/src/w'), false) // root's relative paths: /root
    // A watch's relative path starts at its home too.
    const seen = []
    const hw = await sbx.files.watchDir('proj', (e) => { seen.push(`${e.type} ${e.name}`) },
      { user: 'user', recursive: true })
    await sbx.commands.run('touch /home/user/proj/src/new', { user: 'user' })
    // Polled with a generous cap (a safety net, never a measure).
    for (let i = 0; i < 2400 && !seen.includes('create src/new'); i++) await new Promise((r) => setTimeout(r, 50))
    assert.ok(seen.includes('create src/new'), JSON.stringify(seen))
    await hw.stop()
    await assert.rejects(sbx.files.watchDir('proj', () => {}, { user: 'nobody-here' }), /nobody-here/)
    // Without a user (root): root's, relative to the template's cwd.
    await sbx.files.write('/tmp/r.txt', 'root')
    assert.equal(await owner('/tmp/r.txt'), '0:0')
    await assert.rejects(sbx.files.write('x', 'y', { user: 'nobody-here' }), /nobody-here/)
    await assert.rejects(sbx.files.list('.', { user: 'nobody-here' }), /nobody-here/)
    // A user's command starts in its home (the template's cwd, /root, may be closed to it).
    await sbx.commands.run('chmod 700 /root', { user: 'root' })
    assert.equal((await sbx.commands.run('pwd', { user: 'user' })).stdout, '/home/user\n')
    assert.equal((await sbx.commands.run('pwd', { user: 'user', cwd: '/tmp' })).stdout, '/tmp\n')
    assert.equal((await sbx.commands.run('pwd')).stdout, '/root\n')
  } finally {
    await sbx.kill()
  }
})

test('stdin: sendStdin feeds a running command, closeStdin ends it; without stdin: true it is refused', async () => {
  const sbx = await Sandbox.create('base')
  try {
    // A command that answers each line as it reads it: stdin goes while it runs.
    const out = []
    const h = await sbx.commands.run('while read l; do echo "got $l"; done; echo eof', {
      background: true, stdin: true, onStdout: (d) => out.push(d),
    })
    await h.sendStdin('one\n')
    await h.sendStdin(new TextEncoder().encode('two\n'))
    // 1 MiB in one call: the gateway sends it in pieces, each once dsec took the one before.
    const big = 'x'.repeat(1024 * 1024 - 1) + '\n'
    await h.sendStdin(big)
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    const lines = r.stdout.split('\n')
    assert.equal(lines[0], 'got one')
    assert.equal(lines[1], 'got two')
    assert.equal(lines[2], 'got ' + 'x'.repeat(1024 * 1024 - 1))
    assert.equal(lines[3], 'eof')
    assert.ok(out.join('').startsWith('got one\n'))
    // Its stdin is closed now, and the command ended: both are refused.
    await assert.rejects(h.sendStdin('late\n'))
    // Started without stdin: true, its stdin is closed (empty) from the start.
    const n = await sbx.commands.run('sleep 30', { background: true })
    await assert.rejects(n.sendStdin('x'), /stdin is closed/)
    assert.equal(await sbx.commands.kill(n.pid), true) // the refusal left it and the sandbox as they were
    // Killed through its handle (SIGKILL to its process group); then it is gone.
    const k = await sbx.commands.run('sleep 30', { background: true })
    assert.equal(await sbx.commands.kill(k.pid), true)
    await assert.rejects(k.wait())
    assert.equal(await sbx.commands.kill(k.pid), false)
  } finally {
    await sbx.kill()
  }
})

test('pty: create with a size, sendInput, resize, ^C to the foreground job, kill', async () => {
  const sbx = await Sandbox.create('base')
  try {
    const enc = (t) => new TextEncoder().encode(t)
    const dec = new TextDecoder()
    let out = ''
    // Polled with a generous cap (a safety net, never a measure).
    const waitFor = async (text) => {
      for (let i = 0; i < 2400 && !out.includes(text); i++) await new Promise((r) => setTimeout(r, 50))
      assert.ok(out.includes(text), `no ${JSON.stringify(text)} in ${JSON.stringify(out)}`)
    }
    const h = await sbx.pty.create({ cols: 91, rows: 27, onData: (d) => { out += dec.decode(d, { stream: true }) } })
    assert.ok(h.pid > 0)
    // bash -i -l on a terminal of the sandbox: what it prints (not what we typed) is checked.
    await sbx.pty.sendInput(h.pid, enc('stty size; tty; echo TERM=$TERM\n'))
    await waitFor('27 91')
    await waitFor('/dev/pts/')
    await waitFor('TERM=xterm-256color')
    await sbx.pty.resize(h.pid, { cols: 120, rows: 40 })
    await sbx.pty.sendInput(h.pid, enc('stty size\n'))
    await waitFor('40 120')
    // ^C reaches the foreground job (once it runs), and bash goes on.
    await sbx.pty.sendInput(h.pid, enc('sleep 100\n'))
    for (let i = 0; i < 2400; i++) {
      const ps = await sbx.commands.run('ps | grep -v grep | grep -c "sleep 100" || true')
      if (ps.stdout.trim() !== '0') break
      await new Promise((r) => setTimeout(r, 50))
    }
    await sbx.pty.sendInput(h.pid, enc('\x03'))
    await sbx.pty.sendInput(h.pid, enc('echo after=$?\n'))
    await waitFor('after=130')
    // A command started without a pty has none to resize.
    const plain = await sbx.commands.run('sleep 30', { background: true })
    await assert.rejects(sbx.pty.resize(plain.pid, { cols: 10, rows: 10 }), /no pty/)
    assert.equal(await sbx.commands.kill(plain.pid), true)
    // kill: SIGKILL to its process group; then it is gone.
    assert.equal(await sbx.pty.kill(h.pid), true)
    await assert.rejects(h.wait())
    assert.equal(await sbx.pty.kill(h.pid), false)
  } finally {
    await sbx.kill()
  }
})

test('watchDir: events in order, recursive or not, stop ends the watcher, errors', async () => {
  const sbx = await Sandbox.create('base')
  try {
    // Polled with a generous cap (a safety net, never a measure).
    const until = async (what, ok) => {
      for (let i = 0; i < 2400 && !(await ok()); i++) await new Promise((r) => setTimeout(r, 50))
      assert.ok(await ok(), what)
    }
    const watchers = async () => (await sbx.commands.run(
      "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")).stdout
      .split('\n').filter((l) => l.includes('/.dsec/libexec/watch'))
    await sbx.files.makeDir('/work/w/keep')
    const events = []
    const h = await sbx.files.watchDir('/work/w', (e) => { events.push(`${e.type} ${e.name}`) },
      { recursive: true })
    assert.equal((await watchers()).length, 1)
    await sbx.files.write('/work/w/a.txt', 'hi')
    await sbx.commands.run('mkdir -p /work/w/sub/deep && echo x > /work/w/sub/deep/f && ' +
      'mv /work/w/a.txt /work/w/keep/b.txt && rm -r /work/w/sub && touch /work/w/done')
    await until(`no "create done" in ${JSON.stringify(events)}`, () => events.includes('create done'))
    // No 'write sub/deep/f': the watcher may scan the new directory after the
    // write, and then reports the file as created only (docs/e2b.md, watches).
    let at = -1
    for (const want of ['create a.txt', 'create sub', 'create sub/deep', 'create sub/deep/f',
      'rename a.txt', 'create keep/b.txt', 'remove sub/deep/f',
      'remove sub/deep', 'remove sub', 'create done']) {
      const i = events.indexOf(want, at + 1)
      assert.ok(i > at, `${want} missing or out of order in ${JSON.stringify(events)}`)
      at = i
    }
    // stop(): the gateway sees the stream closed and kills the watcher.
    await h.stop()
    await until('the watcher still runs after stop()', async () => (await watchers()).length === 0)

    // Not recursive: what happens in a subdirectory is not reported.
    const top = []
    let ended = null
    const h2 = await sbx.files.watchDir('/work/w', (e) => { top.push(`${e.type} ${e.name}`) },
      { onExit: (err) => { ended = err === undefined ? 'ok' : String(err) } })
    await sbx.commands.run('touch /work/w/keep/inner /work/w/outer')
    await until(`no "create outer" in ${JSON.stringify(top)}`, () => top.includes('create outer'))
    assert.ok(!top.some((e) => e.includes('inner')), JSON.stringify(top))
    // The directory going away ends the stream (onExit without an error).
    await sbx.commands.run('rm -r /work/w')
    await until('the stream did not end with its directory', () => ended !== null)
    assert.equal(ended, 'ok')
    assert.equal(top[top.length - 1], 'remove ')
    await h2.stop()
    await until('a watcher is left', async () => (await watchers()).length === 0)

    await assert.rejects(sbx.files.watchDir('/no/such', () => {}), (e) => /not found/.test(e.message))
    await sbx.files.write('/work/file', '1')
    await assert.rejects(sbx.files.watchDir('/work/file', () => {}), (e) => /not a directory/.test(e.message))
  } finally {
    await sbx.kill()
  }
})

test('CreateWatcher, GetWatcherEvents, RemoveWatcher: the watch E2B\'s Python SDK polls (raw Connect JSON)', async () => {
  // The JS SDK only streams (WatchDir); the Python SDK polls with these three.
  const r = await rest('POST', '/v2/sandboxes', { templateID: 'base' })
  assert.equal(r.status, 201)
  const id = r.json.sandboxID
  const sbx = await Sandbox.connect(id)
  const call = async (method, body) => {
    const res = await fetch(`${api}/filesystem.Filesystem/${method}`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': id, 'X-Access-Token': r.json.envdAccessToken, 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    })
    return { status: res.status, json: await res.json() }
  }
  const pause = () => new Promise((r) => setTimeout(r, 50))
  const watchers = async () => (await sbx.commands.run(
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")).stdout
    .split('\n').filter((l) => l.includes('/.dsec/libexec/watch'))
  try {
    await sbx.files.makeDir('/work/p')
    const c = await call('CreateWatcher', { path: '/work/p', recursive: true })
    assert.equal(c.status, 200, JSON.stringify(c.json))
    const wid = c.json.watcherId
    assert.equal(typeof wid, 'string')
    await sbx.commands.run('mkdir /work/p/d && echo x > /work/p/d/f && rm /work/p/d/f')
    const seen = []
    // Polled with a generous cap (a safety net, never a measure).
    for (let i = 0; i < 2400 && !seen.includes('EVENT_TYPE_REMOVE d/f'); i++) {
      const e = await call('GetWatcherEvents', { watcherId: wid })
      assert.equal(e.status, 200, JSON.stringify(e.json))
      seen.push(...e.json.events.map((x) => `${x.type} ${x.name}`))
      await pause()
    }
    let at = -1
    for (const want of ['EVENT_TYPE_CREATE d', 'EVENT_TYPE_CREATE d/f', 'EVENT_TYPE_WRITE d/f', 'EVENT_TYPE_REMOVE d/f']) {
      const i = seen.indexOf(want, at + 1)
      assert.ok(i > at, `${want} missing or out of order in ${JSON.stringify(seen)}`)
      at = i
    }
    // What was taken is not given again (the proto name of the field works too).
    const again = await call('GetWatcherEvents', { watcher_id: wid })
    assert.deepEqual(again.json.events, [])
    // RemoveWatcher ends the watcher in the sandbox; its id is unknown after.
    assert.equal((await call('RemoveWatcher', { watcherId: wid })).status, 200)
    for (let i = 0; i < 2400 && (await watchers()).length > 0; i++) await pause()
    assert.equal((await watchers()).length, 0)
    const gone = await call('GetWatcherEvents', { watcherId: wid })
    assert.equal(gone.json.code, 'not_found')
    assert.equal((await call('RemoveWatcher', { watcherId: wid })).json.code, 'not_found')
    // A relative path starts at the user's home (Basic auth names the user).
    await sbx.commands.run('mkdir -p /home/user/rel')
    const asUser = await fetch(`${api}/filesystem.Filesystem/CreateWatcher`, {
      method: 'POST',
      headers: { 'E2b-Sandbox-Id': id, 'X-Access-Token': r.json.envdAccessToken, 'Content-Type': 'application/json',
        Authorization: 'Basic ' + Buffer.from('user:').toString('base64') },
      body: JSON.stringify({ path: 'rel' }),
    })
    const rel = await asUser.json()
    assert.equal(asUser.status, 200, JSON.stringify(rel))
    await sbx.commands.run('touch /home/user/rel/x')
    const relSeen = []
    for (let i = 0; i < 2400 && !relSeen.includes('EVENT_TYPE_CREATE x'); i++) {
      const e = await call('GetWatcherEvents', { watcherId: rel.watcherId })
      relSeen.push(...e.json.events.map((x) => `${x.type} ${x.name}`))
      await pause()
    }
    assert.ok(relSeen.includes('EVENT_TYPE_CREATE x'), JSON.stringify(relSeen))
    assert.equal((await call('RemoveWatcher', { watcherId: rel.watcherId })).status, 200)
    // Errors come from CreateWatcher itself.
    const missing = await call('CreateWatcher', { path: '/no/such' })
    assert.equal(missing.json.code, 'not_found')
    assert.match(missing.json.message, /not found/)
    await sbx.files.write('/work/file', '1')
    assert.equal((await call('CreateWatcher', { path: '/work/file' })).json.code, 'invalid_argument')
    // The directory going away: its last events, then the watcher's end.
    const c2 = await call('CreateWatcher', { path: '/work/p' })
    assert.equal(c2.status, 200)
    await sbx.commands.run('rm -r /work/p')
    let end = null
    for (let i = 0; i < 2400 && end === null; i++) {
      const e = await call('GetWatcherEvents', { watcherId: c2.json.watcherId })
      if (e.status !== 200) end = e.json
      else await pause()
    }
    assert.equal(end.code, 'not_found')
    assert.match(end.message, /went away/)
  } finally {
    await sbx.kill()
  }
})

// A Connect envelope of JSON message `m` (flags 0).
function envelope(m, flags = 0) {
  const b = Buffer.from(JSON.stringify(m))
  const e = Buffer.alloc(5 + b.length)
  e[0] = flags
  e.writeUInt32BE(b.length, 1)
  b.copy(e, 5)
  return e
}
// The envelopes of a Connect stream's bytes: [{flags, message}].
function envelopes(buf) {
  const out = []
  for (let at = 0; at + 5 <= buf.length;) {
    const n = buf.readUInt32BE(at + 1)
    out.push({ flags: buf[at], message: JSON.parse(buf.subarray(at + 5, at + 5 + n).toString()) })
    at += 5 + n
  }
  return out
}

// process.Process/StreamInput with a body the test writes as it goes.
function streamInput(sbx) {
  let ctl
  const body = new ReadableStream({ start(c) { ctl = c } })
  const answer = fetch(process.env.E2B_SANDBOX_URL + '/process.Process/StreamInput', {
    method: 'POST', duplex: 'half', body,
    headers: { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1',
               'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken },
  }).then(async (r) => ({ status: r.status, frames: envelopes(Buffer.from(await r.arrayBuffer())) }))
  return { send: (m) => ctl.enqueue(envelope(m)), end: () => ctl.close(), answer }
}

test('StreamInput (client-streamed, raw Connect): stdin reaches the command while the request is open', { timeout: 180_000 }, async () => {
  const sbx = await Sandbox.create('base')
  try {
    let out = ''
    const h = await sbx.commands.run('cat; echo eof', { background: true, stdin: true, onStdout: (d) => { out += d } })
    const si = streamInput(sbx)
    si.send({ start: { process: { pid: h.pid } } })
    si.send({ data: { input: { stdin: Buffer.from('hello\n').toString('base64') } } })
    // The command has it before the stream ends (no deadline: the test's timeout is the net).
    while (!out.includes('hello\n')) await new Promise((r) => setTimeout(r, 20))
    si.send({ keepalive: {} })
    // 2 MiB more in one message and several small ones: in order, whole.
    const big = 'y'.repeat(2 * 1024 * 1024 - 1) + '\n'
    si.send({ data: { input: { stdin: Buffer.from(big).toString('base64') } } })
    for (const w of ['a\n', 'b\n', 'c\n'])
      si.send({ data: { input: { stdin: Buffer.from(w).toString('base64') } } })
    si.end()
    const r = await si.answer
    assert.equal(r.status, 200)
    assert.deepEqual(r.frames, [{ flags: 0, message: {} }, { flags: 2, message: {} }])
    await h.closeStdin()
    const done = await h.wait()
    assert.equal(done.stdout, 'hello\n' + big + 'a\nb\nc\neof\n')

    // Errors end the stream with a Connect error (HTTP 200, in the end frame).
    const unknown = streamInput(sbx)
    unknown.send({ start: { process: { pid: 999999 } } })
    unknown.end()
    let e = await unknown.answer
    assert.equal(e.status, 200)
    assert.equal(e.frames.at(-1).flags, 2)
    assert.equal(e.frames.at(-1).message.error.code, 'not_found')
    assert.match(e.frames.at(-1).message.error.message, /process with pid 999999 not found/)
    const early = streamInput(sbx)
    early.send({ data: { input: { stdin: 'eA==' } } })
    early.end()
    e = await early.answer
    assert.equal(e.frames.at(-1).message.error.code, 'invalid_argument')
    assert.match(e.frames.at(-1).message.error.message, /data before start/)
    // A command started without stdin: its stdin is closed.
    const n = await sbx.commands.run('sleep 30', { background: true })
    const closed = streamInput(sbx)
    closed.send({ start: { process: { pid: n.pid } } })
    closed.send({ data: { input: { stdin: 'eA==' } } })
    closed.end()
    e = await closed.answer
    assert.equal(e.frames.at(-1).message.error.code, 'failed_precondition')
    assert.match(e.frames.at(-1).message.error.message, /stdin is closed/)
    assert.equal(await sbx.commands.kill(n.pid), true)
    // The gateway answers on after all of them.
    assert.equal((await sbx.commands.run('echo still')).stdout, 'still\n')
  } finally {
    await sbx.kill()
  }
})
