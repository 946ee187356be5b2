/**
 * Interactive sessions and preview ports of a sandbox held by a worker on another host
 * (docs/adr/0028): an API process with its own worker id and no service worker, and the sandbox
 * made by a separate `slipway api --no-http` process with another worker id and SLIPWAY_HOME (as
 * in owner-calls.test.ts). The owner runs the session or the port relay and dials the API back
 * over a WebSocket tunnel; the bytes never go through Temporal. Checked: a pty session echoes
 * what is typed, an SSH shell through the API's broker runs there, a preview of an HTTP server inside the sandbox answers through the API, another
 * account gets 404, and a tunnel id is accepted once (a replayed dial, even with the right
 * proof, is a 404).
 */
import http from 'node:http';
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { randomBytes, randomUUID } from 'node:crypto';
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ownerTaskQueue } from '../../core/ids';
import { TUNNEL_PATH, tunnelKey, tunnelProof } from '../../activities/service/tunnel';
import type { PreviewPortView } from '../../api/schemas';
import { waitFor } from '../helpers/cli';
import { loadSshHostKey } from '../../api/ssh-server';
import type { SshTokenView } from '../../api/schemas';
import { Client as SshClient } from 'ssh2';
import { rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';
import { openExecSocket, startOwnerProcess, type OwnerProcess } from './remote-owner';

const OWNER_ID = `owner-${randomBytes(3).toString('hex')}`;
const API_ID = `api-${randomBytes(3).toString('hex')}`;
const PAYLOAD_KEY = randomBytes(32);
const APP_PORT = 8000;
let h: ServiceHarness;
let a: TestAccount;
let b: TestAccount;
let owner: OwnerProcess;
let sandboxId: string;
let apiPort: number;
const apps: AbortController[] = [];

beforeAll(async () => {
  // Calls through a remote owner need encrypted payloads; the tunnel's proof is keyed from the same key.
  process.env.SLIPWAY_PAYLOAD_KEY = PAYLOAD_KEY.toString('base64');
  const ssh = { host: '127.0.0.1', port: 0, hostKey: await loadSshHostKey(mkdtempSync(path.join(os.tmpdir(), 'slipway-ssh-key-'))) };
  h = await startServiceHarness({ worker: false, workerId: API_ID, ownerGraceSeconds: 10, preview: { key: randomBytes(32), domain: 'localhost' }, ssh });
  apiPort = Number(new URL(h.url).port);
  owner = await startOwnerProcess(h, OWNER_ID);
  a = await h.account({ limit: 2 });
  b = await h.account({ limit: 2 });
  await a.profile({ name: 'linux' });
  sandboxId = (await a.api.create({ profile: 'linux' })).id;
  await h.waitFor(a.api, sandboxId, ['ready'], 120_000);
}, 240_000);

afterAll(async () => {
  for (const ac of apps) ac.abort();
  if (owner && owner.child.exitCode === null) owner.child.kill('SIGKILL');
  await h?.stop();
});


/** The tunnels the API logged as open for this sandbox. */
function tunnelsOpened(): Array<{ tunnelId: string; kind: string; workflowId: string }> {
  return h.logs
    .map((l) => JSON.parse(l) as { msg?: string; sandboxId?: string; tunnelId?: string; kind?: string; workflowId?: string })
    .filter((l) => l.msg === 'owner tunnel open' && l.sandboxId === sandboxId)
    .map((l) => ({ tunnelId: l.tunnelId!, kind: l.kind!, workflowId: l.workflowId! }));
}

/** Dials the API's tunnel path as an owner would; resolves with the HTTP status of a refusal, or 101. */
function dialTunnelStatus(tunnelId: string, proof: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${h.url.replace(/^http/, 'ws')}${TUNNEL_PATH}${tunnelId}`, { headers: { authorization: `Bearer ${proof}` } });
    ws.once('open', () => {
      ws.terminate();
      resolve(101);
    });
    ws.once('unexpected-response', (_req, res) => {
      resolve(res.statusCode!);
      ws.terminate();
    });
    ws.once('error', (e) => (/socket hang up|ECONNRESET/.test(e.message) ? undefined : reject(e)));
  });
}

function previewRequest(url: string, headers: Record<string, string>): Promise<{ status: number; body: string }> {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    // A new connection per request (agent: false): see the report on keep-alive after a 502.
    const req = http.request({ host: '127.0.0.1', port: apiPort, method: 'GET', path: `${u.pathname}${u.search}`, headers: { host: u.host, ...headers }, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('sessions and previews of a sandbox held by another worker', () => {
  it('a terminal session (pty) through the remote owner echoes typed input, resizes, and ends with its exit code', async () => {
    const s = await openExecSocket(h.url, a.token, sandboxId);
    s.ws.send(JSON.stringify({ type: 'start', command: 'sh', args: ['-c', 'test -t 0 && echo tty; while read l; do echo "line:$l"; stty size; done; exit 3'], pty: { cols: 80, rows: 24 } }));
    // Typed bytes (binary frames, as a terminal client sends them): the terminal echoes them, the loop answers.
    await waitFor(async () => s.text().includes('tty'), 'the session to start on the owner', 120_000);
    s.ws.send(Buffer.from('hello owner\n'));
    await waitFor(async () => s.text().includes('line:hello owner'), 'the typed line back', 60_000);
    s.ws.send(JSON.stringify({ type: 'resize', cols: 120, rows: 40 }));
    // The new size shows once the resize reached the terminal: send lines until it does.
    await waitFor(async () => (s.ws.send(Buffer.from('again\n')), s.text().includes('40 120')), 'the new size', 60_000, 500);
    s.ws.send(Buffer.from('\x04')); // ^D ends the read loop
    expect(await s.closed).toBe(1000);
    expect(s.got.at(-1)).toMatchObject({ type: 'exit', exit_code: 3 });
    // The terminal echoed the input (a pty inside the sandbox on the owner), then the loop answered.
    expect(s.text()).toMatch(/hello owner\r?\n[\s\S]*line:hello owner/);
    const [tunnel] = tunnelsOpened().filter((t) => t.kind === 'session');
    expect(tunnel).toBeDefined();
    // The call ran on the owner's queue; only the call (not the bytes) is in history.
    const history = await h.host.client.workflow.getHandle(tunnel!.workflowId).fetchHistory();
    const queues = (history.events ?? []).map((e) => e.activityTaskScheduledEventAttributes?.taskQueue?.name).filter(Boolean);
    expect(queues).toEqual([ownerTaskQueue(h.host.serviceTaskQueue, OWNER_ID)]);
    // No output signals or input updates (as a streamed exec has): the bytes went over the tunnel.
    expect((history.events ?? []).filter((e) => e.workflowExecutionSignaledEventAttributes || e.workflowExecutionUpdateAcceptedEventAttributes)).toEqual([]);
  }, 240_000);

  it('a streamed exec with a pty through the remote owner runs under a terminal, and its whole stdin (a partial last line) ends the input', async () => {
    const before = tunnelsOpened().filter((t) => t.kind === 'session').length;
    let out = '';
    const exit = await a.api.execStream(sandboxId, { command: 'sh', args: ['-c', 'test -t 0 && echo tty; stty size; tr a-z A-Z; echo "input ended"'], pty: { cols: 90, rows: 30 }, stdin: 'abc\nde' }, (_stream, data) => {
      out += data;
    });
    expect(exit).toMatchObject({ type: 'exit', exit_code: 0, timed_out: false });
    // A terminal of the asked size on the owner (the call workflow's path has none), and the end of
    // input typed for a partial line. The terminal echoes the input whenever it arrives, so the
    // lines are checked apart, not in order.
    expect(out).toMatch(/tty\r?\n/);
    expect(out).toMatch(/30 90\r?\n/);
    expect(out).toMatch(/ABC\r?\n[\s\S]*DE[\s\S]*input ended/);
    expect(tunnelsOpened().filter((t) => t.kind === 'session').length).toBe(before + 1);
  }, 240_000);

  it('a tunnel id is accepted once: dialling it again, even with the right proof, is a 404, as is an unknown id', async () => {
    const [tunnel] = tunnelsOpened();
    expect(tunnel).toBeDefined();
    const key = tunnelKey(PAYLOAD_KEY);
    expect(await dialTunnelStatus(tunnel!.tunnelId, tunnelProof(key, tunnel!.tunnelId))).toBe(404);
    expect(await dialTunnelStatus(randomUUID(), tunnelProof(key, 'x'))).toBe(404);
    // (a wrong proof on an awaited id is a 401: test/owner-tunnel.test.ts)
  });

  it("another account's token on the session gets 404, before anything reaches the owner", async () => {
    const before = tunnelsOpened().length;
    await expect(openExecSocket(h.url, b.token, sandboxId)).rejects.toThrow('HTTP 404');
    expect(tunnelsOpened().length).toBe(before);
  });

  it('a preview port of an HTTP server inside the sandbox answers through the API; another account gets 404', async () => {
    const app = `require('http').createServer((req, res) => res.end('hello from the owner ' + req.url)).listen(${APP_PORT}, '127.0.0.1', () => console.log('listening'));`;
    await rawRequest(h.url, 'PUT', `/api/v1/sandboxes/${sandboxId}/files/app.js`, { token: a.token, body: Buffer.from(app) });
    const ac = new AbortController();
    apps.push(ac);
    void rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandboxId}/exec`, { token: a.token, body: JSON.stringify({ command: 'node', args: ['app.js'], timeout_seconds: 900 }), signal: ac.signal }).catch(() => undefined);
    const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandboxId}/ports`, { token: a.token, body: JSON.stringify({ port: APP_PORT }) });
    expect(res.status).toBe(201);
    const view = (await res.json()) as PreviewPortView;
    // The server starts on the owner as a call there: wait until the preview answers.
    const got = await waitFor(
      async () => {
        const r = await previewRequest(`${view.url}page?x=1`, { authorization: `Bearer ${a.token}` });
        return r.status === 200 ? r : undefined;
      },
      'the preview to answer',
      120_000,
      500,
    );
    expect(got.body).toBe('hello from the owner /page?x=1');
    expect(tunnelsOpened().some((t) => t.kind === 'port')).toBe(true);
    const other = await previewRequest(view.url, { authorization: `Bearer ${b.token}` });
    expect(other.status).toBe(404);
    expect(other.body).not.toContain('hello from the owner');
  }, 240_000);

  it('an SSH shell through the API\'s broker runs on the remote owner: typed commands answer, exit status comes back', async () => {
    const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandboxId}/ssh_tokens`, { token: a.token, body: '{}' });
    expect(res.status).toBe(201);
    const t = (await res.json()) as SshTokenView;
    const client = new SshClient();
    await new Promise<void>((resolve, reject) => {
      client.on('ready', () => resolve()).on('error', reject);
      client.connect({ host: '127.0.0.1', port: h.host.sshPort!, username: t.token, hostVerifier: () => true, tryKeyboard: false });
    });
    try {
      const stream = await new Promise<import('ssh2').ClientChannel>((resolve, reject) => client.shell({ rows: 24, cols: 80, term: 'xterm' }, (e, ch) => (e ? reject(e) : resolve(ch))));
      let out = '';
      stream.on('data', (d: Buffer) => (out += d.toString('utf8')));
      const code = new Promise<number | null>((r) => stream.once('exit', (c: number | null) => r(c)));
      // Typing before the login shell set its terminal up may be flushed (as on any terminal): wait for its prompt.
      await waitFor(async () => out.length > 0, 'the shell\'s prompt over SSH', 120_000);
      let typed = 0;
      await waitFor(
        async () => {
          if (out.includes(`on-${sandboxId}-21`) && out.includes('24 80')) return true;
          if (typed++ % 8 === 0) stream.write('echo "on-$SLIPWAY_SANDBOX_ID-$((20+1))"; stty size\n');
          return false;
        },
        'the shell to answer over SSH',
        120_000,
      );
      stream.write('exit 7\n');
      expect(await code).toBe(7);
    } finally {
      client.end();
    }
    expect(tunnelsOpened().filter((x) => x.kind === 'session').length).toBeGreaterThanOrEqual(2);
  }, 240_000);
});
