/**
 * Interactive sessions over the API (ADR 0014): streaming exec (NDJSON) and the exec WebSocket,
 * against the real service (Temporal, Postgres, bubblewrap sandboxes): frames, a terminal,
 * bounded memory for a slow reader, account scoping, clear errors, metrics and idle activity.
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { BIN as SLIPWAY_FROM_SOURCE } from '../helpers/cli';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import WebSocket from 'ws';
import { processesWith, waitFor } from '../sandbox/helpers';
import { rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';
import { openExecSocket, type ExecFrame } from './remote-owner';

let h: ServiceHarness;
let a: TestAccount;
let b: TestAccount;
let sandboxId: string;

beforeAll(async () => {
  h = await startServiceHarness({ execConcurrency: 8 });
  a = await h.account({ limit: 2 });
  b = await h.account({ limit: 1 });
  await a.profile({ name: 'linux' });
  await a.profile({ name: 'idle', idleTimeoutSeconds: 1.5 });
  await b.profile({ name: 'linux' });
  sandboxId = (await a.api.create({ profile: 'linux' })).id;
  await h.waitFor(a.api, sandboxId, ['ready']);
});
afterAll(async () => {
  await h?.stop();
});

type Frame = ExecFrame;

const streamExec = async (token: string, id: string, body: Record<string, unknown>) =>
  rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, { token, body: JSON.stringify({ stream: true, ...body }) });

async function frames(res: Response): Promise<Frame[]> {
  return (await res.text())
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Frame);
}

const metric = async (name: string): Promise<number> => {
  const text = await (await rawRequest(h.url, 'GET', '/metrics')).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith(name))
    .reduce((sum, l) => sum + Number(l.split(' ').pop()), 0);
};


describe('streaming exec (NDJSON)', () => {
  it('streams stdout and stderr frames, feeds stdin, and ends with the exit frame', async () => {
    const res = await streamExec(a.token, sandboxId, { command: 'sh', args: ['-c', 'cat; echo oops >&2; printf "é"; exit 3'], stdin: 'from stdin\n' });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toContain('application/x-ndjson');
    const got = await frames(res);
    const last = got.at(-1)!;
    expect(last).toMatchObject({ type: 'exit', exit_code: 3, timed_out: false });
    expect(got.filter((f) => f.type === 'stdout').map((f) => f.data).join('')).toBe('from stdin\né');
    expect(got.filter((f) => f.type === 'stderr').map((f) => f.data).join('')).toBe('oops\n');
  });

  it('sends bytes as base64 when asked, and kills the command at its timeout', async () => {
    const bin = await frames(await streamExec(a.token, sandboxId, { command: 'printf', args: ['\\377\\000\\001'], output_encoding: 'base64' }));
    expect(Buffer.concat(bin.filter((f) => f.type === 'stdout').map((f) => Buffer.from(f.data!, 'base64')))).toEqual(Buffer.from([0xff, 0, 1]));
    const slow = await frames(await streamExec(a.token, sandboxId, { command: 'sh', args: ['-c', 'echo started; sleep 60'], timeout_seconds: 1 }));
    expect(slow.at(-1)).toMatchObject({ type: 'exit', timed_out: true });
    expect(slow[0]).toMatchObject({ type: 'stdout', data: 'started\n' });
  });

  it('runs under a terminal with pty', async () => {
    const got = await frames(await streamExec(a.token, sandboxId, { command: 'sh', args: ['-c', 'test -t 1 && stty size'], pty: { cols: 91, rows: 33 } }));
    expect(got.at(-1)).toMatchObject({ type: 'exit', exit_code: 0 });
    expect(got.filter((f) => f.type === 'stdout').map((f) => f.data).join('')).toContain('33 91');
    // The request's stdin is the whole input: under a terminal too, the command reads its end,
    // after a partial line as well (the fuzzer's `cat` with stdin "x" once ran to its timeout).
    const typed = await frames(await streamExec(a.token, sandboxId, { command: 'sh', args: ['-c', 'tr a-z A-Z; echo "input ended"'], stdin: 'x', pty: { cols: 80, rows: 24 }, timeout_seconds: 60 }));
    expect(typed.at(-1)).toMatchObject({ type: 'exit', exit_code: 0, timed_out: false });
    expect(typed.filter((f) => f.type === 'stdout').map((f) => f.data).join('')).toMatch(/X[^]*input ended/);
  });

  it('refuses bad input with 400 naming the field, before anything runs', async () => {
    for (const [body, field] of [
      [{ command: 'true', pty: { cols: 0, rows: 24 } }, 'pty.cols'],
      [{ command: 'true', output_encoding: 'hex' }, 'output_encoding'],
      [{ command: 'true', surprise: 1 }, '(body)'],
    ] as const) {
      const res = await streamExec(a.token, sandboxId, body);
      expect(res.status).toBe(400);
      const err = (await res.json()) as { error: { code: string; issues: Array<{ path: string }> } };
      expect(err.error.code).toBe('invalid_body');
      expect(err.error.issues.map((i) => i.path)).toContain(field);
    }
    const keyed = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandboxId}/exec`, { token: a.token, body: JSON.stringify({ stream: true, command: 'true' }), headers: { 'idempotency-key': 'k1' } });
    expect(keyed.status).toBe(400);
  });

  it('holds a bounded amount for a slow reader while the command prints 50 MB', async () => {
    const total = 50 * 1024 * 1024;
    const before = await metric('slipway_sandbox_session_bytes_total{account="' + a.id + '",direction="out"}');
    const url = new URL(`/api/v1/sandboxes/${sandboxId}/exec`, h.url);
    let received = 0;
    let exit: Frame | undefined;
    await new Promise<void>((resolve, reject) => {
      const req = http.request(url, { method: 'POST', headers: { authorization: `Bearer ${a.token}`, 'content-type': 'application/json' } }, (res) => {
        expect(res.statusCode).toBe(200);
        let pending = '';
        // A slow reader: one chunk, then a pause until the next turn of the event loop after a timer.
        res.on('data', (chunk: Buffer) => {
          res.pause();
          pending += chunk.toString('utf8');
          const lines = pending.split('\n');
          pending = lines.pop()!;
          for (const line of lines) {
            const f = JSON.parse(line) as Frame;
            if (f.type === 'stdout') received += Buffer.from(f.data!, 'base64').length;
            if (f.type === 'exit') exit = f;
          }
          setTimeout(() => res.resume(), 1);
        });
        res.on('end', resolve);
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(JSON.stringify({ stream: true, command: 'head', args: ['-c', String(total), '/dev/zero'], output_encoding: 'base64', timeout_seconds: 600 }));
    });
    expect(exit).toMatchObject({ type: 'exit', exit_code: 0 });
    expect(received).toBe(total);
    // The server read all 50 MB but never held more than a bound for this reader.
    expect((await metric('slipway_sandbox_session_bytes_total{account="' + a.id + '",direction="out"}')) - before).toBe(total);
    const highWater = await metric('slipway_sandbox_session_buffered_bytes_max');
    expect(highWater).toBeGreaterThan(0);
    expect(highWater).toBeLessThan(1024 * 1024);
  }, 300_000);
});

describe('exec WebSocket', () => {
  it('runs a terminal: stdin, resize, ^C, exit code', async () => {
    const s = await openExecSocket(h.url, a.token, sandboxId);
    s.ws.send(JSON.stringify({ type: 'start', command: 'sh', args: ['-c', 'stty size; trap "echo got-int" INT; while read l; do echo "line:$l"; stty size; done; exit 3'], pty: { cols: 80, rows: 24 } }));
    expect(await waitFor(async () => s.text().includes('24 80'), 30_000), s.text()).toBe(true);
    s.ws.send(JSON.stringify({ type: 'resize', cols: 120, rows: 40 }));
    // The new size shows once the resize reached the terminal: send lines until it does.
    expect(await waitFor(async () => (s.ws.send(Buffer.from('x\n')), s.text().includes('40 120')), 30_000), s.text()).toBe(true);
    s.ws.send(JSON.stringify({ type: 'stdin', data: Buffer.from('hello\n').toString('base64') }));
    expect(await waitFor(async () => s.text().includes('line:hello'), 30_000)).toBe(true);
    s.ws.send(JSON.stringify({ type: 'signal', signal: 'SIGINT' }));
    expect(await waitFor(async () => s.text().includes('got-int'), 30_000)).toBe(true);
    s.ws.send(Buffer.from('\x04')); // ^D ends the read loop
    expect(await s.closed).toBe(1000);
    expect(s.got.at(-1)).toMatchObject({ type: 'exit', exit_code: 3 });
  });

  it('answers a bad frame with an error naming the field; a bad start closes with 4400', async () => {
    const s = await openExecSocket(h.url, a.token, sandboxId);
    s.ws.send(JSON.stringify({ type: 'start', command: 'cat', pty: { cols: 'wide', rows: 24 } }));
    expect(await s.closed).toBe(4400);
    expect(s.got[0]).toMatchObject({ type: 'error', code: 'invalid_start' });
    expect(s.got[0].issues!.map((i) => i.path)).toContain('pty.cols');
    const t = await openExecSocket(h.url, a.token, sandboxId);
    t.ws.send(JSON.stringify({ type: 'start', command: 'cat' }));
    t.ws.send(JSON.stringify({ type: 'resize', cols: 10, rows: 10 })); // no pty: refused, the session goes on
    t.ws.send(JSON.stringify({ type: 'stdin', data: Buffer.from('still here\n').toString('base64') }));
    t.ws.send(JSON.stringify({ type: 'stdin_close' }));
    expect(await t.closed).toBe(1000);
    expect(t.got.find((f) => f.type === 'error')?.message).toMatch(/pty/);
    expect(t.text()).toBe('still here\n');
  });

  it('kills the session when the client goes away', async () => {
    const marker = `${Date.now() % 100000}.${process.pid}`;
    const s = await openExecSocket(h.url, a.token, sandboxId);
    s.ws.send(JSON.stringify({ type: 'start', command: 'sh', args: ['-c', `echo started; exec sleep ${marker}`] }));
    expect(await waitFor(async () => s.text().includes('started'), 30_000)).toBe(true);
    s.ws.terminate();
    expect(await waitFor(async () => (await processesWith(`sleep ${marker}`)).length === 0, 30_000)).toBe(true);
  });
});

describe('slipway sandbox shell and exec', () => {
  // The CLI from source (the published bin runs dist/, which may not be built from this tree).
  const BIN = SLIPWAY_FROM_SOURCE;
  const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

  it('drives a remote shell from a real terminal: typed commands, ^C interrupts sleep, exit 3 returns 3', async () => {
    // util-linux script(1) gives the CLI a real terminal here, as a user's would be.
    const child = spawn('script', ['-qfec', [process.execPath, BIN, 'sandbox', 'shell', sandboxId].map(quote).join(' '), '/dev/null'], {
      env: { ...process.env, SLIPWAY_API_URL: h.url, SLIPWAY_API_TOKEN: a.token, TERM: 'xterm' },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let screen = '';
    child.stdout.on('data', (d: Buffer) => (screen += d.toString()));
    child.stderr.on('data', (d: Buffer) => (screen += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    const type = (keys: string) => child.stdin.write(keys);
    // The typed line echoes as "$((1+2))"; only the shell's answer reads "hi-3".
    expect(await waitFor(async () => (type('echo hi-$((1+2))\r'), screen.includes('hi-3')), 60_000), screen).toBe(true);
    type('echo $((40+2))-sleeping; sleep 100\r');
    expect(await waitFor(async () => screen.includes('42-sleeping'), 30_000), screen).toBe(true);
    type('\x03');
    expect(await waitFor(async () => (type('echo after-$((1+1))\r'), screen.includes('after-2')), 30_000), screen).toBe(true);
    type('exit 3\r');
    expect(await exited).toBe(3);
  });

  it('slipway sandbox exec streams the output and exits with the exit code', async () => {
    const child = spawn(process.execPath, [BIN, 'sandbox', 'exec', sandboxId, '--', 'sh', '-c', 'echo first; sleep 0.2; echo err >&2; printf "\\377"; exit 5'], {
      env: { ...process.env, SLIPWAY_API_URL: h.url, SLIPWAY_API_TOKEN: a.token },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const out: Buffer[] = [];
    let err = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    expect(await new Promise((resolve) => child.on('close', resolve))).toBe(5);
    expect(Buffer.concat(out)).toEqual(Buffer.from([...Buffer.from('first\n'), 0xff]));
    expect(err).toBe('err\n');
  });
});

describe('MCP', () => {
  it('streams exec output as progress notifications when the caller asks for progress', async () => {
    const transport = new StreamableHTTPClientTransport(new URL('/mcp', h.url), { requestInit: { headers: { authorization: `Bearer ${a.token}` } } });
    const mcp = new McpClient({ name: 'test', version: '1.0.0' });
    await mcp.connect(transport);
    try {
      const messages: string[] = [];
      const result = (await mcp.callTool(
        { name: 'exec_in_sandbox', arguments: { sandbox_id: sandboxId, command: 'sh', args: ['-c', 'echo one; echo two >&2; echo three; exit 4'] } },
        undefined,
        { onprogress: (p) => void messages.push(p.message ?? '') },
      )) as unknown as { structuredContent: { exit_code: number; stdout: string; stderr: string } };
      expect(result.structuredContent).toMatchObject({ exit_code: 4, stdout: 'one\nthree\n', stderr: 'two\n' });
      expect(messages.join('')).toContain('stdout: one');
      expect(messages.join('')).toContain('stderr: two');
      // Without a progress token: the plain exec, one JSON answer.
      const plain = (await mcp.callTool({ name: 'exec_in_sandbox', arguments: { sandbox_id: sandboxId, command: "echo", args: ["plain"] } })) as unknown as { structuredContent: { stdout: string } };
      expect(plain.structuredContent.stdout).toBe('plain\n');
    } finally {
      await mcp.close();
    }
  });
});

describe('account scoping', () => {
  it("answers 404 for another account's sandbox on every new endpoint", async () => {
    const res = await streamExec(b.token, sandboxId, { command: 'true' });
    expect(res.status).toBe(404);
    await expect(openExecSocket(h.url, b.token, sandboxId)).rejects.toThrow('HTTP 404');
    await expect(openExecSocket(h.url, 'not-a-token', sandboxId)).rejects.toThrow('HTTP 401');
    const none = await streamExec(a.token, 'sbx_00000000000000000000', { command: 'true' });
    expect(none.status).toBe(404);
    const plain = await rawRequest(h.url, 'GET', `/api/v1/sandboxes/${sandboxId}/exec/ws`, { token: a.token });
    expect(plain.status).toBe(426);
    expect(((await plain.json()) as { error: { code: string } }).error.code).toBe('upgrade_required');
    expect((await rawRequest(h.url, 'GET', `/api/v1/sandboxes/${sandboxId}/exec/ws`, { token: b.token })).status).toBe(404);
  });
});

describe('metrics and activity', () => {
  it('counts sessions opened and bytes in and out', async () => {
    const opened = await metric(`slipway_sandbox_sessions_opened_total{account="${a.id}"`);
    expect(opened).toBeGreaterThanOrEqual(4);
    expect(await metric(`slipway_sandbox_session_bytes_total{account="${a.id}",direction="in"}`)).toBeGreaterThan(0);
  });

  it('an open session counts as activity: the sandbox is not suspended under it', async () => {
    const { id } = await a.api.create({ profile: 'idle' });
    await h.waitFor(a.api, id, ['ready']);
    const s = await openExecSocket(h.url, a.token, id);
    s.ws.send(JSON.stringify({ type: 'start', command: 'cat' }));
    const stamp = async () => (await h.database.db.query<{ t: Date }>('SELECT last_activity_at AS t FROM sandboxes WHERE id = $1', [id])).rows[0].t.getTime();
    const opened = await stamp();
    // The session keeps stamping activity: wait until a stamp lies past the idle threshold.
    expect(await waitFor(async () => (await stamp()) - opened > 2_000, 60_000)).toBe(true);
    expect((await a.api.get(id)).status).toBe('ready');
    s.ws.send(JSON.stringify({ type: 'stdin_close' }));
    expect(await s.closed).toBe(1000);
    await a.api.destroy(id);
  });
});
