// The official TypeScript client (@modelcontextprotocol/client 2.x) with the official
// tasks extension package (@modelcontextprotocol/ext-tasks) against a webctx MCP
// endpoint over streamable HTTP at protocol 2026-07-28; prints one JSON line of what it saw.
//   node ts_tasks.mjs <url> <key>      (NODE_PATH: the node_modules holding the packages)
// ext-tasks needs the host to send task traffic itself (`rawDispatch`): the SDK's codecs
// reject a `resultType: "task"` answer. This host posts each such request as the spec
// says (routing headers included) and hands back the JSON-RPC response.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// ES modules ignore NODE_PATH: load both packages from there by their entry points.
const modules = process.env.NODE_PATH;
const load = (path) => import(pathToFileURL(join(modules, "@modelcontextprotocol", path)).href);
const { Client, StreamableHTTPClientTransport } = await load("client/dist/index.mjs");
const { createTaskSessionFromClient } = await load("ext-tasks/dist/client/index.js");

const [url, key] = process.argv.slice(2);
const VERSION = "2026-07-28";
const TASKS = "io.modelcontextprotocol/tasks";
const auth = { Authorization: `Bearer ${key}` };
const clientInfo = { name: "ts-tasks-probe", version: "1" };
const capabilities = { extensions: { [TASKS]: {} } };
const ARGS = { question: "how do lithium-ion batteries degrade?", max_sources: 4, token_budget: 800 };

let nextId = 0;
async function rawDispatch(request, options = {}) {
  const id = `raw-${++nextId}`;
  const params = request.params ?? {};
  const headers = { "Content-Type": "application/json", Accept: "application/json, text/event-stream",
                    "MCP-Protocol-Version": VERSION, "Mcp-Method": request.method, ...auth,
                    ...(options.context?.headers ?? {}) };
  const name = request.method === "tools/call" ? params.name : params.taskId;
  if (typeof name === "string") headers["Mcp-Name"] = name;
  const resp = await fetch(url, { method: "POST", headers, signal: options.signal,
                                  body: JSON.stringify({ jsonrpc: "2.0", id, ...request }) });
  const text = await resp.text();
  const messages = (resp.headers.get("content-type") ?? "").startsWith("text/event-stream")
    ? text.split("\n").filter((l) => l.startsWith("data:")).map((l) => JSON.parse(l.slice(5)))
    : [JSON.parse(text)];
  const answer = messages.find((m) => m.id === id);
  if (!answer) throw new Error(`no answer to ${request.method}: ${text.slice(0, 300)}`);
  return answer.error ? { kind: "error", error: answer.error } : { kind: "result", result: answer.result };
}

async function main() {
  const client = new Client(clientInfo, { capabilities, versionNegotiation: { mode: { pin: VERSION } } });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: auth } }));
  const session = createTaskSessionFromClient(client, {
    endpointId: "webctx-test", rawDispatch,
    v2RequestFraming: { protocolVersion: VERSION, clientInfo, clientCapabilities: capabilities },
  });
  const out = { era: client.getProtocolEra(), execution: session.capabilities.execution };
  try {
    const messages = [];
    const run = await session.callTool("web_context", ARGS);
    out.kind = run.kind;
    const { outcome } = await run.settle({
      onEvent: (event) => { if (event.type === "task" && event.task.statusMessage) messages.push(event.task.statusMessage); },
    });
    out.messages = messages;
    out.status = outcome.status;
    if (outcome.status === "completed") {
      out.isError = !!outcome.result.isError;
      out.chunks = outcome.result.structuredContent ? outcome.result.structuredContent.chunks.length : 0;
    }
    const second = await session.callTool("web_context", { ...ARGS, question: "what is lithium plating?" });
    out.second = { kind: second.kind, taskId: second.handle ? second.handle.taskId : null };
    await second.cancel();
    const after = await rawDispatch({ method: "tasks/get", params: {
      taskId: out.second.taskId, _meta: { "io.modelcontextprotocol/protocolVersion": VERSION,
      "io.modelcontextprotocol/clientInfo": clientInfo, "io.modelcontextprotocol/clientCapabilities": capabilities } } });
    out.second.after = after.kind === "result" ? after.result.status : after.error;
  } finally {
    await session.close();
    await client.close();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => { process.stderr.write(String((err && err.stack) || err) + "\n"); process.exit(1); });
