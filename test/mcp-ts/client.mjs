// The official MCP TypeScript client against sandkeep: list the tools, call each one, and make a refused call whose
// error text must reach the caller (a result with isError, not a thrown error).
//
//   node client.mjs stdio <command> [args...]      spawn `sandkeep mcp` (environment inherited)
//   node client.mjs http <url> [Header=Value...]   connect to /mcp
//
// It prints one line per check and exits 1 when any fails.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [mode, target, ...rest] = process.argv.slice(2);
let transport;
if (mode === "stdio") {
  transport = new StdioClientTransport({ command: target, args: rest, env: process.env, stderr: "inherit" });
} else if (mode === "http") {
  const headers = {};
  for (const h of rest) {
    const i = h.indexOf("=");
    headers[h.slice(0, i)] = h.slice(i + 1);
  }
  transport = new StreamableHTTPClientTransport(new URL(target), { requestInit: { headers } });
} else {
  console.error("usage: client.mjs stdio <command> [args...] | http <url> [Header=Value...]");
  process.exit(2);
}

let failed = false;
const check = (ok, what) => {
  console.log(`${ok ? "ok" : "FAIL"} ${what}`);
  if (!ok) failed = true;
};
const text = (res) => (res.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");

const client = new Client({ name: "sandkeep-mcp-ts", version: "0.0.0" });
await client.connect(transport);
try {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name).sort();
  check(["exec", "list_files", "read_file", "sandbox_status", "write_file"].every((n) => names.includes(n)), `tools/list: ${names.join(", ")}`);

  // Each tool, called the way a model calls it; callTool validates structured content against the output schema.
  const calls = [
    ["sandbox_status", {}],
    ["exec", { command: "echo hello from ts" }],
    ["write_file", { path: "ts/hello.txt", content: "written by the TypeScript client\n" }],
    ["read_file", { path: "ts/hello.txt" }],
    ["list_files", { path: "ts" }],
  ];
  for (const [name, args] of calls) {
    try {
      const res = await client.callTool({ name, arguments: args });
      check(!res.isError && res.structuredContent !== undefined, `${name}: ${res.isError ? "error " + text(res) : "ok"}`);
      if (name === "exec") check(res.structuredContent.stdout === "hello from ts\n", `exec stdout ${JSON.stringify(res.structuredContent.stdout)}`);
      if (name === "read_file") check(res.structuredContent.content === "written by the TypeScript client\n", "read_file content");
    } catch (e) {
      check(false, `${name} threw: ${e.message}`);
    }
  }

  // Refused calls: the error reaches the caller as a result, with its code in the text.
  for (const [name, args, code] of [
    ["read_file", { path: "ts/missing.txt" }, "FILE_NOT_FOUND"],
    ["read_file", { path: "../../etc/passwd" }, "INVALID_PATH"],
    ["exec", { command: "true", timeout_seconds: 999999 }, "INVALID"],
  ]) {
    try {
      const res = await client.callTool({ name, arguments: args });
      check(res.isError === true && text(res).startsWith(code), `refused ${name} reached the caller: ${text(res)}`);
    } catch (e) {
      check(false, `refused ${name} threw instead of returning the error: ${e.message}`);
    }
  }
} finally {
  await client.close();
}
process.exit(failed ? 1 : 0);
