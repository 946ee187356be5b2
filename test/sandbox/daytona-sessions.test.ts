/**
 * Daytona interactive sessions (ADR 0019) beyond the shared contract (daytona.test.ts runs the
 * contract's session cases): which Daytona routes carry them, values kept out of argv, binary
 * output, many writes in order, refusals. Against the fake; the real SDK talks to it over HTTP
 * and WebSocket on 127.0.0.1.
 */
import { promises as fs } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import { PathEscapeError } from '../../activities/sandbox/paths';
import type { SandboxHandle, SandboxSession } from '../../activities/sandbox/provider';
import { SessionRequestError } from '../../activities/sandbox/session';
import { FakeDaytona } from '../helpers/fake-daytona';
import { makeRepo, processesWith, sandboxRequest, tempDir, waitFor } from './helpers';

const fake = new FakeDaytona();
let parent: string;
let repo: string;
let provider: DaytonaSandboxProvider;
let handle: SandboxHandle;
let daytonaId: string;

beforeAll(async () => {
  await fake.start();
  parent = tempDir('daytona-sessions');
  ({ repo } = makeRepo(parent));
  provider = new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake' });
  handle = await provider.create(sandboxRequest(repo, 'sessions', { group: 'daytona' }));
  daytonaId = (JSON.parse(await fs.readFile(`${handle.root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
});
afterAll(async () => {
  await fake.stop();
  if (parent) await fs.rm(parent, { recursive: true, force: true });
});

const collect = (session: SandboxSession) => {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  session.stdout.on('data', (d: Buffer) => out.push(d));
  session.stderr.on('data', (d: Buffer) => err.push(d));
  const ended = Promise.all([session.stdout, session.stderr].map((s) => new Promise((r) => s.once('end', r))));
  return { out: () => Buffer.concat(out), err: () => Buffer.concat(err), ended };
};

describe('daytona sessions', () => {
  it('a pty session goes through Daytona\'s PTY WebSocket, a plain one through a session command with its input route', async () => {
    const before = fake.requests.length;
    const term = await provider.openSession(handle, { command: 'echo in-a-terminal', shell: true, pty: { cols: 80, rows: 24 } });
    const t = collect(term);
    expect((await term.exit).exitCode).toBe(0);
    await t.ended;
    expect(t.out().toString()).toContain('in-a-terminal');
    const plain = await provider.openSession(handle, { command: 'cat', shell: true });
    const p = collect(plain);
    plain.stdin.end('piped\n');
    expect(await plain.exit).toEqual({ exitCode: 0, signal: null });
    await p.ended;
    expect(p.out().toString()).toBe('piped\n');
    const seen = fake.requests.slice(before);
    expect(seen).toContain(`WS /toolbox/${daytonaId}/process/pty/create-connect`);
    expect(seen.some((r) => /^POST \/toolbox\/[^/]+\/process\/session\/[^/]+\/command\/[^/]+\/input$/.test(r))).toBe(true);
    expect(seen.some((r) => /^WS \/toolbox\/[^/]+\/process\/session\/[^/]+\/command\/[^/]+\/logs$/.test(r))).toBe(true);
  });

  it('the output of a terminal starts with the command\'s own: no prompt, no echo of the line that started it', async () => {
    const term = await provider.openSession(handle, { command: 'printf first-line', shell: true, pty: { cols: 80, rows: 24 } });
    const t = collect(term);
    await term.exit;
    await t.ended;
    expect(t.out().toString()).toBe('first-line');
  });

  it.each([false, true])('environment values reach the command but never any command line in the sandbox (pty: %s)', async (pty) => {
    const secret = `s3cret-${Math.random().toString(36).slice(2)}`;
    const session = await provider.openSession(handle, { command: 'printf "%s\\n" "$TOKEN"; sleep 30', shell: true, env: { TOKEN: secret }, ...(pty ? { pty: { cols: 80, rows: 24 } } : {}) });
    const s = collect(session);
    expect(await waitFor(async () => s.out().toString().includes(secret), 30_000)).toBe(true);
    expect(await processesWith(secret)).toEqual([]);
    session.kill();
    expect(await session.exit).toEqual({ exitCode: null, signal: 'SIGKILL' });
  });

  it('binary output and many small writes arrive unchanged and in order; stderr stays apart', async () => {
    const session = await provider.openSession(handle, { command: 'cat; printf "\\000\\377end" >&2', shell: true });
    const s = collect(session);
    const sent: Buffer[] = [];
    for (let i = 0; i < 200; i++) {
      const chunk = Buffer.from([i, 255 - i, 0, 10]);
      sent.push(chunk);
      session.stdin.write(chunk);
    }
    session.stdin.end();
    expect((await session.exit).exitCode).toBe(0);
    await s.ended;
    expect(s.out().equals(Buffer.concat(sent))).toBe(true);
    expect([...s.err()]).toEqual([0, 255, ...Buffer.from('end')]);
  });

  it('a command that never reads its input still ends, and its exit code comes back', async () => {
    const session = await provider.openSession(handle, { command: 'exit 3', shell: true });
    expect(await session.exit).toEqual({ exitCode: 3, signal: null });
  });

  it('refuses what exec refuses, before anything starts', async () => {
    const before = fake.requests.filter((r) => r.includes('/process/pty') || r.includes('/exec')).length;
    await expect(provider.openSession(handle, { command: '' })).rejects.toBeInstanceOf(SessionRequestError);
    await expect(provider.openSession(handle, { command: 'true', pty: { cols: 0, rows: 24 } })).rejects.toThrow(/pty\.cols/);
    await expect(provider.openSession(handle, { command: 'true', env: { 'BAD NAME': 'x' } })).rejects.toThrow(/BAD NAME.*not a variable name/);
    await expect(provider.openSession(handle, { command: 'pwd', cwd: '../..' })).rejects.toBeInstanceOf(PathEscapeError);
    expect(fake.requests.filter((r) => r.includes('/process/pty') || r.includes('/exec')).length).toBe(before);
    const plain = await provider.openSession(handle, { command: 'sleep 30', shell: true });
    expect(() => plain.resize(100, 40)).toThrow(/resize needs a session with a pty/);
    expect(() => plain.signal('TERM' as NodeJS.Signals)).toThrow(/signal must be a signal name/);
    plain.kill();
    await plain.exit;
  });

  it('leaves no script, pid file or FIFO behind in the sandbox', async () => {
    const session = await provider.openSession(handle, { command: 'true', shell: true });
    await session.exit;
    const term = await provider.openSession(handle, { command: 'true', shell: true, pty: { cols: 80, rows: 24 } });
    await term.exit;
    const left = await provider.exec(handle, { command: 'ls -A ../.slipway-exec', shell: true });
    // Only this exec's own pid file, while it runs.
    expect(left.stdout.trim().split('\n')).toEqual([expect.stringMatching(/^[0-9a-f]{16}\.sh\.pid$/)]);
  });
});
