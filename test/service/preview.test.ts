/**
 * Preview ports (issue 15, ADR 0015) over real HTTP, Postgres, Temporal and bubblewrap: a
 * server started in a confined sandbox is reached at its preview origin with the account's
 * token, a signed link or the cookie it becomes; everything else is refused. Attack tests: the
 * proxy never reaches a service on the host's loopback (a real server there counts its hits),
 * whatever port, Host or path is asked; account B reaches nothing of account A's; expired and
 * tampered links are refused. Without bubblewrap this file fails (the host refuses to start).
 */
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import type { AddressInfo } from 'node:net';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import { listeningPorts } from '../../activities/sandbox/port-relay';
import { cookieValue, parsePreviewHost, previewHost, signPreviewLink, verifyPreviewLink, withoutCookie } from '../../activities/service/preview';
import type { PreviewPortView } from '../../api/schemas';
import { rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

if (!findExecutable('bwrap')) throw new Error(`the preview suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);

const KEY = randomBytes(32);
const APP_PORT = 8000;
let h: ServiceHarness;
let a: TestAccount;
let b: TestAccount;
let sa: string;
let sb: string;
let apiPort: number;
const servers: AbortController[] = [];

// The app inside the sandbox: a page, an echo of the headers it got, and an upgrade that echoes bytes.
const APP = `
const http = require('http');
const port = Number(process.argv[2]);
const s = http.createServer((req, res) => {
  if (req.url === '/headers') { res.setHeader('content-type', 'application/json'); return res.end(JSON.stringify(req.headers)); }
  if (req.url === '/early') { res.writeHead(200, { 'content-length': '5' }); return res.end('early', () => req.socket.destroy()); }
  if (req.url === '/cut') { res.writeHead(200, { 'content-length': '1000' }); res.write('partial'); return setTimeout(() => req.socket.destroy(), 50); }
  if (req.url === '/redirect') { res.writeHead(302, { location: 'http://127.0.0.1:' + process.argv[3] + '/' }); return res.end(); }
  res.setHeader('content-type', 'text/html');
  res.end('<html><head><title>preview</title></head><body><h1 id="msg">Hello from ' + process.env.SLIPWAY_SANDBOX_ID + ' port ' + port + '</h1></body></html>');
});
s.on('upgrade', (req, socket) => {
  socket.write('HTTP/1.1 101 Switching Protocols\\r\\nupgrade: echo\\r\\nconnection: upgrade\\r\\n\\r\\n');
  socket.on('data', (d) => socket.write(d));
});
s.listen(port, '127.0.0.1', () => console.log('listening'));
`;

/** A host service on 127.0.0.1 that a sandbox must never reach through the proxy. */
let hostHits = 0;
let hostServer: http.Server;
let hostPort: number;

/** Starts the app in a sandbox as a long exec (a preview lives while its command runs). */
async function startApp(token: string, id: string, port: number): Promise<void> {
  const ac = new AbortController();
  servers.push(ac);
  await rawRequest(h.url, 'PUT', `/api/v1/sandboxes/${id}/files/app.js`, { token, body: Buffer.from(APP) });
  void rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, {
    token,
    body: JSON.stringify({ command: 'node', args: ['app.js', String(port), String(hostPort)], timeout_seconds: 900 }),
    signal: ac.signal,
  }).catch(() => undefined);
}

/** A request to a preview origin: the Host header names it, the connection goes to the API's port. */
function previewRequest(url: string, opts: { headers?: Record<string, string>; method?: string; path?: string } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: string }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port: apiPort, method: opts.method ?? 'GET', path: opts.path ?? `${u.pathname}${u.search}`, headers: { host: u.host, ...opts.headers } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

async function until(check: () => Promise<boolean>, what: string, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check().catch(() => false))) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function openPort(token: string, id: string, port: number, extra: Record<string, unknown> = {}): Promise<PreviewPortView> {
  const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/ports`, { token, body: JSON.stringify({ port, ...extra }) });
  expect(res.status).toBe(201);
  return (await res.json()) as PreviewPortView;
}

beforeAll(async () => {
  hostServer = http.createServer((_req, res) => {
    hostHits++;
    res.end('HOST SECRET');
  });
  await new Promise<void>((r) => hostServer.listen(0, '127.0.0.1', r));
  hostPort = (hostServer.address() as AddressInfo).port;
  h = await startServiceHarness({ preview: { key: KEY, domain: 'localhost' } });
  apiPort = Number(new URL(h.url).port);
  a = await h.account({ limit: 2 });
  b = await h.account({ limit: 2 });
  await a.profile({ name: 'confined' });
  await b.profile({ name: 'confined' });
  [sa, sb] = await Promise.all([a.api.create({ profile: 'confined' }).then((s) => s.id), b.api.create({ profile: 'confined' }).then((s) => s.id)]);
  await Promise.all([h.waitFor(a.api, sa, ['ready']), h.waitFor(b.api, sb, ['ready'])]);
  await startApp(a.token, sa, APP_PORT);
  await startApp(b.token, sb, APP_PORT);
});

afterAll(async () => {
  for (const s of servers) s.abort();
  await h?.stop();
  await new Promise((r) => hostServer?.close(r));
});

describe('preview links and hosts (pure)', () => {
  const id = 'sbx_abcdefghijklmnopqrst';
  it.each([
    ['a fresh link', { sandboxId: id, port: 3000, nowMs: 1_000 }, { ok: true, expiresAtMs: 60_000 }],
    ['at its expiry', { sandboxId: id, port: 3000, nowMs: 60_000 }, { ok: false, reason: 'expired' }],
    ['for another port', { sandboxId: id, port: 3001, nowMs: 1_000 }, { ok: false, reason: 'bad_signature' }],
    ['for another sandbox', { sandboxId: 'sbx_bbcdefghijklmnopqrst', port: 3000, nowMs: 1_000 }, { ok: false, reason: 'bad_signature' }],
  ])('%s', (_what, t, want) => {
    const token = signPreviewLink(KEY, { sandboxId: id, port: 3000, expiresAtMs: 60_000 });
    expect(verifyPreviewLink(KEY, token, t)).toEqual(want);
  });
  it.each([
    ['another key', (t: string) => t, randomBytes(32), 'bad_signature'],
    ['a later expiry', (t: string) => t.replace(/^60/, '99'), KEY, 'bad_signature'],
    ['a flipped signature character', (t: string) => t.slice(0, -1) + (t.endsWith('A') ? 'B' : 'A'), KEY, 'bad_signature'],
    ['garbage', () => 'x.y', KEY, 'malformed'],
    ['empty', () => '', KEY, 'malformed'],
  ])('refuses a link with %s', (_what, tamper, key, reason) => {
    const token = tamper(signPreviewLink(KEY, { sandboxId: id, port: 3000, expiresAtMs: 60_000 }));
    expect(verifyPreviewLink(key, token, { sandboxId: id, port: 3000, nowMs: 1_000 })).toEqual({ ok: false, reason });
  });
  it.each([
    ['abcdefghijklmnopqrst-3000.localhost:8787', { sandboxId: id, port: 3000 }],
    ['ABCDEFGHIJKLMNOPQRST-3000.LOCALHOST', { sandboxId: id, port: 3000 }],
    ['abcdefghijklmnopqrst-03000.localhost', undefined],
    ['abcdefghijklmnopqrst-70000.localhost', undefined],
    ['abcdefghijklmnopqrst-0.localhost', undefined],
    ['127.0.0.1:8787', undefined],
    ['localhost', undefined],
    ['x.abcdefghijklmnopqrst-3000.localhost', undefined],
    ['abcdefghijklmnopqrst-3000.localhost.evil.com', undefined],
    [undefined, undefined],
  ])('Host %s', (host, want) => {
    expect(parsePreviewHost(host, 'localhost')).toEqual(want);
  });
  it('round-trips hosts, and reads and strips cookies', () => {
    expect(parsePreviewHost(previewHost(id, 5173, 'preview.example.com'), 'preview.example.com')).toEqual({ sandboxId: id, port: 5173 });
    expect(cookieValue('a=1; slipway_preview=tok; b=2', 'slipway_preview')).toBe('tok');
    expect(withoutCookie('a=1; slipway_preview=tok; b=2', 'slipway_preview')).toBe('a=1; b=2');
    expect(withoutCookie('slipway_preview=tok', 'slipway_preview')).toBeUndefined();
  });
  it('reads listening ports from the kernel table', () => {
    const table = [
      '  sl  local_address rem_address   st tx_queue rx_queue',
      '   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000',
      '   1: 0100007F:1F41 0100007F:C350 01 00000000:00000000',
      '   2: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 0',
    ].join('\n');
    expect([...listeningPorts(table)].sort()).toEqual([80, 8000]);
  });
});

describe('preview ports over the API', () => {
  let view: PreviewPortView;

  it('opens a port: 201 with the preview origin and a signed link; GET lists it', async () => {
    view = await openPort(a.token, sa, APP_PORT);
    expect(view.url).toBe(`http://${previewHost(sa, APP_PORT, 'localhost')}:${apiPort}/`);
    expect(view.link.startsWith(`${view.url}?slipway_preview=`)).toBe(true);
    const list = (await (await rawRequest(h.url, 'GET', `/api/v1/sandboxes/${sa}/ports`, { token: a.token })).json()) as { ports: PreviewPortView[] };
    expect(list.ports.map((p) => p.port)).toEqual([APP_PORT]);
  });

  it('serves the sandbox app to the account token, without passing the token on', async () => {
    await until(async () => (await previewRequest(view.url, { headers: { authorization: `Bearer ${a.token}` } })).status === 200, 'the app in the sandbox to answer');
    const page = await previewRequest(view.url, { headers: { authorization: `Bearer ${a.token}` } });
    expect(page.body).toContain(`Hello from ${sa} port ${APP_PORT}`);
    const echoed = await previewRequest(`${view.url}headers`, { headers: { authorization: `Bearer ${a.token}`, cookie: 'theme=dark; slipway_preview=abc' } });
    const seen = JSON.parse(echoed.body) as Record<string, string>;
    expect(seen.authorization).toBeUndefined();
    expect(seen.cookie).toBe('theme=dark');
  });

  it('a signed link answers 303 with a host-only cookie and the URL without it; the cookie then serves', async () => {
    const first = await previewRequest(view.link);
    expect(first.status).toBe(303);
    expect(first.headers.location).toBe('/');
    const setCookie = first.headers['set-cookie']![0]!;
    expect(setCookie).toMatch(/^slipway_preview=\d+\.[\w-]+; Max-Age=\d+; Path=\/; HttpOnly; SameSite=Lax$/);
    expect(setCookie).not.toMatch(/Domain=/i);
    const cookie = setCookie.split(';')[0]!;
    const page = await previewRequest(view.url, { headers: { cookie } });
    expect(page.status).toBe(200);
    expect(page.body).toContain(`Hello from ${sa}`);
  });

  it('refuses without a credential, with a tampered or expired link, and a link of another port', async () => {
    expect((await previewRequest(view.url)).status).toBe(401);
    const token = new URL(view.link).searchParams.get('slipway_preview')!;
    const tampered = token.slice(0, -2) + (token.endsWith('AA') ? 'BB' : 'AA');
    expect((await previewRequest(`${view.url}?slipway_preview=${tampered}`)).status).toBe(401);
    expect((await previewRequest(view.url, { headers: { cookie: `slipway_preview=${tampered}` } })).status).toBe(401);
    const expired = signPreviewLink(KEY, { sandboxId: sa, port: APP_PORT, expiresAtMs: Date.now() - 1000 });
    const res = await previewRequest(`${view.url}?slipway_preview=${expired}`);
    expect(res.status).toBe(401);
    expect(res.body).toContain('expired');
    // A valid link of another port of the same sandbox.
    const other = signPreviewLink(KEY, { sandboxId: sa, port: APP_PORT + 1, expiresAtMs: Date.now() + 60_000 });
    expect((await previewRequest(view.url, { headers: { cookie: `slipway_preview=${other}` } })).status).toBe(401);
  });

  it("account B's token and links reach nothing of account A's", async () => {
    const bView = await openPort(b.token, sb, APP_PORT);
    await until(async () => (await previewRequest(bView.url, { headers: { authorization: `Bearer ${b.token}` } })).status === 200, "B's app to answer");
    // B's token on A's preview: as if A's sandbox did not exist.
    const byToken = await previewRequest(view.url, { headers: { authorization: `Bearer ${b.token}` } });
    expect(byToken.status).toBe(404);
    expect(byToken.body).not.toContain('Hello');
    // B's valid link and cookie, presented at A's origin.
    const bToken = new URL(bView.link).searchParams.get('slipway_preview')!;
    expect((await previewRequest(`${view.url}?slipway_preview=${bToken}`)).status).toBe(401);
    expect((await previewRequest(view.url, { headers: { cookie: `slipway_preview=${bToken}` } })).status).toBe(401);
    // B cannot open, list or close A's ports.
    expect((await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sa}/ports`, { token: b.token, body: JSON.stringify({ port: 9000 }) })).status).toBe(404);
    expect((await rawRequest(h.url, 'GET', `/api/v1/sandboxes/${sa}/ports`, { token: b.token })).status).toBe(404);
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ports/${APP_PORT}`, { token: b.token })).status).toBe(404);
    // A's token sees A's app, never B's, at A's origin.
    expect((await previewRequest(view.url, { headers: { authorization: `Bearer ${a.token}` } })).body).toContain(`Hello from ${sa}`);
  });

  it('proxies an upgrade (WebSocket) both ways', async () => {
    const sock = net.connect(apiPort, '127.0.0.1');
    const token = new URL(view.link).searchParams.get('slipway_preview')!;
    sock.write(`GET /ws?slipway_preview=${token} HTTP/1.1\r\nHost: ${new URL(view.url).host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n`);
    let got = '';
    sock.on('data', (d: Buffer) => {
      got += d.toString('utf8');
      if (got.includes('\r\n\r\n') && !got.includes('ping-42')) sock.write('ping-42');
    });
    await until(async () => got.includes('ping-42'), 'the echo through the upgrade', 30_000);
    expect(got.startsWith('HTTP/1.1 101')).toBe(true);
    sock.destroy();
  });

  it('refuses an upgrade without a credential', async () => {
    const sock = net.connect(apiPort, '127.0.0.1');
    sock.write(`GET /ws HTTP/1.1\r\nHost: ${new URL(view.url).host}\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n`);
    let got = '';
    sock.on('data', (d: Buffer) => (got += d.toString('utf8')));
    await until(async () => got.includes('\r\n\r\n'), 'the refusal', 30_000);
    expect(got.startsWith('HTTP/1.1 401')).toBe(true);
    sock.destroy();
  });

  it('bad input: a port out of range or not a number is a 400 naming the field; nothing is opened', async () => {
    for (const body of [{ port: 0 }, { port: 70000 }, { port: '80' }, {}, { port: 80, link_ttl_seconds: 10 ** 9 }]) {
      const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sa}/ports`, { token: a.token, body: JSON.stringify(body) });
      expect(res.status).toBe(400);
      const err = (await res.json()) as { error: { issues: Array<{ path: string }> } };
      expect(err.error.issues[0]!.path).toMatch(/^(port|link_ttl_seconds)$/);
    }
    const list = (await (await rawRequest(h.url, 'GET', `/api/v1/sandboxes/${sa}/ports`, { token: a.token })).json()) as { ports: PreviewPortView[] };
    expect(list.ports.map((p) => p.port)).toEqual([APP_PORT]);
  });

  it('a port that is not open is a 404; a closed one too', async () => {
    const url = `http://${previewHost(sa, 9999, 'localhost')}:${apiPort}/`;
    const res = await previewRequest(url, { headers: { authorization: `Bearer ${a.token}` } });
    expect(res.status).toBe(404);
    expect(res.body).toContain('port_not_open');
    const extra = await openPort(a.token, sa, 9998);
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ports/9998`, { token: a.token })).status).toBe(204);
    expect((await previewRequest(extra.url, { headers: { authorization: `Bearer ${a.token}` } })).status).toBe(404);
    expect((await rawRequest(h.url, 'DELETE', `/api/v1/sandboxes/${sa}/ports/9998`, { token: a.token })).status).toBe(404);
  });
});

describe('MCP and metrics', () => {
  it('open_sandbox_port and close_sandbox_port over MCP (HTTP), with the account token', async () => {
    const transport = new StreamableHTTPClientTransport(new URL('/mcp', h.url), { requestInit: { headers: { authorization: `Bearer ${a.token}` } } });
    const mcp = new McpClient({ name: 'test', version: '1.0.0' });
    await mcp.connect(transport);
    try {
      const opened = (await mcp.callTool({ name: 'open_sandbox_port', arguments: { sandbox_id: sa, port: 8123 } })) as { structuredContent?: PreviewPortView; isError?: boolean };
      expect(opened.isError).toBeFalsy();
      expect(opened.structuredContent!.url).toBe(`http://${previewHost(sa, 8123, 'localhost')}:${apiPort}/`);
      const listed = (await (await rawRequest(h.url, 'GET', `/api/v1/sandboxes/${sa}/ports`, { token: a.token })).json()) as { ports: PreviewPortView[] };
      expect(listed.ports.map((p) => p.port)).toContain(8123);
      const closed = (await mcp.callTool({ name: 'close_sandbox_port', arguments: { sandbox_id: sa, port: 8123 } })) as { isError?: boolean };
      expect(closed.isError).toBeFalsy();
      // B's sandbox through A's MCP session: refused as not found.
      const foreign = (await mcp.callTool({ name: 'open_sandbox_port', arguments: { sandbox_id: sb, port: 8123 } })) as { isError?: boolean; content: Array<{ text: string }> };
      expect(foreign.isError).toBe(true);
      expect(foreign.content[0]!.text).toContain('not_found');
    } finally {
      await mcp.close();
    }
  });

  it('counts proxied requests, refusals and bytes', async () => {
    const m = await (await rawRequest(h.url, 'GET', '/metrics')).text();
    expect(m).toMatch(/slipway_preview_requests_total\{kind="http",outcome="proxied"\} [1-9]/);
    expect(m).toMatch(/slipway_preview_requests_total\{kind="http",outcome="invalid_link"\} [1-9]/);
    expect(m).toMatch(/slipway_preview_requests_total\{kind="upgrade",outcome="proxied"\} [1-9]/);
    expect(m).toMatch(/slipway_interactive_bytes_total\{surface="preview",direction="out"\} [1-9]/);
  });
});

/**
 * Keep-alive: one client connection (an agent with a single socket, as a browser's) carries
 * request after request whatever the previous answer was: a 502, a proxied page, or an upstream
 * that closed mid-body. A connection left half-owned after a hijacked reply hangs the next
 * request until Node's headers timeout (408 after ~90 s); each answer here must come well before.
 */
describe('preview requests on a reused keep-alive connection', () => {
  const LATE_PORT = 8002;
  const ANSWER_MS = 20_000;
  let agent: http.Agent;
  const auth = () => ({ authorization: `Bearer ${a.token}` });

  /** One request on the agent; fails loudly when no answer comes in ANSWER_MS. Reports the client socket's local port. */
  function onAgent(url: string, path = '/', body?: Buffer): Promise<{ status: number; body: string; localPort: number | undefined; error?: string }> {
    const u = new URL(url);
    return new Promise((resolve, reject) => {
      let localPort: number | undefined;
      const req = http.request({ agent, host: '127.0.0.1', port: apiPort, path, method: body ? 'POST' : 'GET', headers: { host: u.host, ...auth() } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString('utf8'), localPort }));
        res.on('error', (e) => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString('utf8'), localPort, error: e.message }));
        res.on('aborted', () => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString('utf8'), localPort, error: 'aborted' }));
      });
      req.on('socket', (s) => {
        if (s.localPort !== undefined) localPort = s.localPort;
        else s.once('connect', () => (localPort = s.localPort));
      });
      req.setTimeout(ANSWER_MS, () => req.destroy(new Error(`no answer to GET ${path} on the reused connection within ${ANSWER_MS} ms`)));
      req.on('error', reject);
      req.end(body);
    });
  }

  beforeAll(() => {
    agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  });
  afterAll(() => agent.destroy());

  it('after a 502 (nothing listening yet), the next request on the same connection is answered once the app listens', async () => {
    const view = await openPort(a.token, sa, LATE_PORT);
    const first = await onAgent(view.url);
    expect(first.status).toBe(502);
    await startApp(a.token, sa, LATE_PORT);
    // Each try must be answered (502 while the app starts, then 200), never left hanging.
    let last = first;
    const end = Date.now() + 60_000;
    while (last.status !== 200) {
      if (Date.now() > end) throw new Error(`the app never answered: last ${last.status} ${last.body}`);
      await new Promise((r) => setTimeout(r, 100));
      last = await onAgent(view.url);
    }
    expect(last.body).toContain(`Hello from ${sa} port ${LATE_PORT}`);
    // The 502 left the connection usable: the same socket carried the answer.
    expect(last.localPort).toBe(first.localPort);
  });

  it('after a proxied page, the next request on the same connection is answered on it', async () => {
    const url = `http://${previewHost(sa, APP_PORT, 'localhost')}:${apiPort}/`;
    const one = await onAgent(url);
    expect(one.status).toBe(200);
    const two = await onAgent(url, '/headers');
    expect(two.status).toBe(200);
    expect(JSON.parse(two.body)).toHaveProperty('host');
    expect(two.localPort).toBe(one.localPort);
  });

  it('after an app that answers before reading a large body and closes, the next request on the same connection is answered on it', async () => {
    const url = `http://${previewHost(sa, APP_PORT, 'localhost')}:${apiPort}/`;
    // Far more than the socket buffers hold: most of the body is still unread when the app answers.
    const early = await onAgent(url, '/early', Buffer.alloc(8 << 20, 'y'));
    // The app resets a connection with unread data: its answer may be lost on the way (502).
    expect([200, 502]).toContain(early.status);
    const next = await onAgent(url);
    expect(next.status).toBe(200);
    expect(next.body).toContain(`Hello from ${sa} port ${APP_PORT}`);
    expect(next.localPort).toBe(early.localPort);
  });

  it('after an upstream that closes mid-body, the client sees the cut and its next request is answered', async () => {
    const url = `http://${previewHost(sa, APP_PORT, 'localhost')}:${apiPort}/`;
    const cut = await onAgent(url, '/cut').catch((e: Error) => ({ status: 0, body: '', localPort: undefined, error: e.message }));
    // Never a complete-looking answer: the 1000 bytes promised did not all come.
    expect(cut.error).toBeDefined();
    expect(cut.body.length).toBeLessThan(1000);
    const next = await onAgent(url);
    expect(next.status).toBe(200);
    expect(next.body).toContain(`Hello from ${sa} port ${APP_PORT}`);
  });
});

describe("the proxy never reaches the host's loopback", () => {
  it('an open port the sandbox does not listen on, but the host does, is a 502 and the host service sees nothing', async () => {
    const hv = await openPort(a.token, sa, hostPort);
    const res = await previewRequest(hv.url, { headers: { authorization: `Bearer ${a.token}` } });
    expect(res.status).toBe(502);
    expect(res.body).not.toContain('HOST SECRET');
    // The API's own port, as a preview port: nothing of the sandbox listens there either.
    const api = await openPort(a.token, sa, apiPort);
    expect((await previewRequest(api.url, { headers: { authorization: `Bearer ${a.token}` } })).status).toBe(502);
    expect(hostHits).toBe(0);
  });

  it('Host, absolute-URI and path tricks go to the sandbox app or nowhere, never to the host', async () => {
    const url = `http://${previewHost(sa, APP_PORT, 'localhost')}:${apiPort}/`;
    const auth = { authorization: `Bearer ${a.token}` };
    const tries = [
      { path: `http://127.0.0.1:${hostPort}/` },
      { path: `//127.0.0.1:${hostPort}/` },
      { path: `/..%2f..%2f127.0.0.1:${hostPort}/` },
      { path: `@127.0.0.1:${hostPort}/` },
    ];
    for (const t of tries) {
      const res = await previewRequest(url, { headers: auth, path: t.path });
      expect(res.body).not.toContain('HOST SECRET');
    }
    // The app's redirect to the host's loopback is handed to the client as it is, not followed.
    const redirect = await previewRequest(`${url}redirect`, { headers: auth });
    expect(redirect.status).toBe(302);
    // A Host naming the host service itself is an API request (404), not a proxy.
    const direct = await previewRequest(`http://127.0.0.1:${hostPort}/`, { headers: auth });
    expect(direct.status).toBe(404);
    // The Host of a preview with a port number the sandbox does not serve, in every spelling.
    for (const host of [`${previewHost(sa, hostPort, 'localhost')}`, `${previewHost(sa, hostPort, 'localhost')}.`, `127.0.0.1.${previewHost(sa, hostPort, 'localhost')}`]) {
      const res = await previewRequest(`http://${host}:${apiPort}/`, { headers: auth });
      expect(res.body).not.toContain('HOST SECRET');
    }
    expect(hostHits).toBe(0);
  });

  it('a sandbox process cannot reach the host service itself either', async () => {
    const run = await a.api.exec(sa, { command: 'node', args: ['-e', `require('http').get('http://127.0.0.1:${hostPort}/', r => { console.log('reached', r.statusCode); process.exit(0) }).on('error', e => { console.log('refused', e.code); process.exit(0) })`] });
    expect(run.stdout).toContain('refused');
    expect(hostHits).toBe(0);
  });

  it('when the command serving the port ends, the preview answers 502', async () => {
    const view = await openPort(b.token, sb, APP_PORT);
    // B's server runs as an exec whose client walks away: the command is killed with it.
    servers[1]!.abort();
    await until(async () => (await previewRequest(view.url, { headers: { authorization: `Bearer ${b.token}` } })).status === 502, "B's app to be gone");
    expect(hostHits).toBe(0);
  });
});
