// Driven by `sandkeep bench --scenario e2b` (internal/bench/e2b.go): the e2b JavaScript SDK, unmodified and
// configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, timed from its caller's side. One command per
// line on stdin, one JSON answer per line on stdout:
//   setup          create the warm sandbox and warm the client up  -> {"sandbox": ID}
//   warm N         N x commands.run('true') in it, each timed     -> {"ns": [...]}
//   create N       N x Sandbox.create() to its first command's result (the kill after it is not timed)
//   quit           kill the warm sandbox and exit
// A failure answers {"error": "..."}.
import { Sandbox } from 'e2b'
import readline from 'node:readline'

const say = (o) => process.stdout.write(JSON.stringify(o) + '\n')
const now = () => process.hrtime.bigint()
let sbx

async function runTrue(s) {
  const r = await s.commands.run('true')
  if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}: ${r.stderr}`)
}

const lines = readline.createInterface({ input: process.stdin })
for await (const line of lines) {
  const [cmd, arg] = line.trim().split(/\s+/)
  const n = Number(arg || 0)
  try {
    if (cmd === 'setup') {
      sbx = await Sandbox.create({ timeoutMs: 3_600_000 })
      for (let i = 0; i < 10; i++) await runTrue(sbx)
      say({ sandbox: sbx.sandboxId })
    } else if (cmd === 'warm') {
      const ns = []
      for (let i = 0; i < n; i++) {
        const t0 = now()
        await runTrue(sbx)
        ns.push(Number(now() - t0))
      }
      say({ ns })
    } else if (cmd === 'create') {
      const ns = []
      for (let i = 0; i < n; i++) {
        const t0 = now()
        const s = await Sandbox.create()
        await runTrue(s)
        ns.push(Number(now() - t0))
        await s.kill()
      }
      say({ ns })
    } else if (cmd === 'quit') {
      if (sbx) await sbx.kill()
      say({})
      break
    } else {
      say({ error: `unknown command ${JSON.stringify(line)}` })
    }
  } catch (err) {
    say({ error: String((err && err.stack) || err) })
  }
}
