// The TypeScript SDK's client (@modelcontextprotocol/sdk, what Claude Code and Cursor build
// on) against a webctx MCP endpoint; prints one JSON line of what each step saw.
//   node ts_client.cjs <url> [<key>]     (NODE_PATH: the node_modules holding the SDK)
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const [url, key] = process.argv.slice(2);

// An OAuth-capable client's provider, as Claude Code's and Cursor's: on a 401 the SDK runs
// discovery and registration with it before it would open a browser.
const oauthProvider = {
  get redirectUrl() { return "http://127.0.0.1:9/callback"; },
  get clientMetadata() { return { client_name: "probe", redirect_uris: ["http://127.0.0.1:9/callback"] }; },
  clientInformation() { return undefined; },
  saveClientInformation() {},
  tokens() { return undefined; },
  saveTokens() {},
  redirectToAuthorization() { throw new Error("would open a browser"); },
  saveCodeVerifier() {},
  codeVerifier() { return ""; },
};

async function connect(options) {
  const client = new Client({ name: "probe", version: "1" });
  await client.connect(new StreamableHTTPClientTransport(new URL(url), options));
  return client;
}

async function failure(options) {
  try {
    const client = await connect(options);
    await client.close();
    return null;
  } catch (err) {
    return String(err && err.message ? err.message : err);
  }
}

async function main() {
  const out = {
    plain: await failure({}),
    oauth: await failure({ authProvider: oauthProvider }),
  };
  if (key) {
    const client = await connect({ requestInit: { headers: { Authorization: `Bearer ${key}` } } });
    out.server = client.getServerVersion();
    out.tools = (await client.listTools()).tools.map((t) => ({ name: t.name, annotations: t.annotations }));
    const args = { question: "how do lithium-ion batteries degrade?", max_sources: 4, token_budget: 800, wait_s: 0 };
    const started = await client.callTool({ name: "web_context", arguments: args });
    out.started = started.structuredContent;
    let result = started;
    for (let i = 0; i < 20 && result.structuredContent && result.structuredContent.status !== "succeeded" && !result.isError; i++) {
      result = await client.callTool({ name: "get_job", arguments: { job_id: started.structuredContent.job_id, wait_s: 20 } });
    }
    out.finished = { isError: !!result.isError, status: result.structuredContent && result.structuredContent.status,
                     chunks: result.structuredContent ? result.structuredContent.chunks.length : 0 };
    await client.close();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().catch((err) => { process.stderr.write(String(err && err.stack || err) + "\n"); process.exit(1); });
