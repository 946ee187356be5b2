/**
 * The service's CLI verbs as a user runs them (real processes): billing administration against
 * the test Postgres, `slipway sandbox ...` against the API over HTTP, `slipway mcp` over
 * stdio, `slipway usage`, and the embedded PGlite billing with its single-process lock.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { openPglite, processIdentity } from '../../activities/billing/db';
import { connectBillingSocket, billingSocketPath } from '../../activities/billing/socket';
import { SandboxApiClient } from '../../api/client';
import { codeOf, startServiceHarness, type ServiceHarness } from './harness';
import { tempDir } from './repo';
import { BIN } from '../helpers/cli';

function slipway(args: string[], env: NodeJS.ProcessEnv = {}, stdin?: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const base = { ...process.env };
    delete base.DATABASE_URL;
    delete base.SLIPWAY_API_TOKEN;
    const child = spawn(process.execPath, [BIN, ...args], { env: { ...base, ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    child.stdin.end(stdin ?? '');
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

let h: ServiceHarness;
let dbEnv: NodeJS.ProcessEnv;
let apiEnv: NodeJS.ProcessEnv;
beforeAll(async () => {
  h = await startServiceHarness();
  dbEnv = { DATABASE_URL: h.database.url };
});
afterAll(async () => {
  await h?.stop();
});

describe('slipway account, token, project, profile', () => {
  it('sets up an account that the API then serves', async () => {
    expect(await slipway(['account', 'create', 'cli-co', '--concurrency', '2'], dbEnv)).toMatchObject({ code: 0, stdout: 'account cli-co created (concurrency 2)\n' });
    expect((await slipway(['account', 'create', 'cli-co'], dbEnv)).code).toBe(2); // already exists: bad input
    expect((await slipway(['account', 'create', 'Bad Name'], dbEnv)).code).toBe(2);
    const token = await slipway(['token', 'create', '--account', 'cli-co', '--name', 'ci'], dbEnv);
    expect(token.code).toBe(0);
    expect(token.stdout.trim()).toMatch(/^slp_[A-Za-z0-9_-]{43}$/);
    const project = await slipway(['project', 'create', 'web', '--account', 'cli-co'], dbEnv);
    expect(project.stdout.trim()).toMatch(/^[0-9a-f-]{36}$/);
    const profile = await slipway(['profile', 'create', 'linux-small', '--account', 'cli-co', '--repo', h.repo, '--base', 'main', '--idle-seconds', '120'], dbEnv);
    expect(profile).toMatchObject({ code: 0 });
    expect(profile.stdout).toContain('profile linux-small');
    // Tenants run untrusted code: confined and offline unless the operator says otherwise.
    expect(profile.stdout).toContain('bubblewrap, network off');
    expect(JSON.parse((await slipway(['profile', 'list', '--account', 'cli-co', '--json'], dbEnv)).stdout)).toMatchObject([{ name: 'linux-small', confinement: 'bubblewrap', network: false }]);
    apiEnv = { SLIPWAY_API_URL: h.url, SLIPWAY_API_TOKEN: token.stdout.trim(), PROJECT: project.stdout.trim() };
  });
});

describe('unconfined tenants need the operator to opt in', () => {
  it('takes a kubernetes profile\'s --kubernetes section, refusing a bad one naming the field (exit 2, nothing stored)', async () => {
    expect((await slipway(['account', 'create', 'cli-kube'], dbEnv)).code).toBe(0);
    const base = ['profile', 'create', 'k8s', '--account', 'cli-kube', '--repo', h.repo, '--provider', 'kubernetes'];
    const bad = await slipway([...base, '--kubernetes', JSON.stringify({ namespace: 'sandboxes', resources: { limits: { memory: 'lots' } } })], dbEnv);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--kubernetes: kubernetes.resources.limits.memory: must be a Kubernetes quantity');
    const elsewhere = await slipway(['profile', 'create', 'pm', '--account', 'cli-kube', '--repo', h.repo, '--provider', 'podman', '--kubernetes', '{}'], dbEnv);
    expect(elsewhere.code).toBe(2);
    expect(elsewhere.stderr).toContain('--kubernetes applies to --provider kubernetes only');
    expect(JSON.parse((await slipway(['profile', 'list', '--account', 'cli-kube', '--json'], dbEnv)).stdout)).toEqual([]);
    const ok = await slipway([...base, '--kubernetes', JSON.stringify({ image: 'ghcr.io/acme/sandbox:1', namespace: 'sandboxes', warm_pool: 1 })], dbEnv);
    expect(ok).toMatchObject({ code: 0 });
    expect(JSON.parse((await slipway(['profile', 'list', '--account', 'cli-kube', '--json'], dbEnv)).stdout)).toMatchObject([{ name: 'k8s', provider: 'kubernetes', kubernetes: { image: 'ghcr.io/acme/sandbox:1', namespace: 'sandboxes', warm_pool: 1 } }]);
  });

  it('refuses a profile with --confinement none unless --allow-unconfined is given, naming the option', async () => {
    await slipway(['account', 'create', 'cli-open'], dbEnv);
    const refused = await slipway(['profile', 'create', 'open', '--account', 'cli-open', '--repo', h.repo, '--confinement', 'none'], dbEnv);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toContain('--confinement none');
    expect(refused.stderr).toContain('--allow-unconfined');
    const allowed = await slipway(['profile', 'create', 'open', '--account', 'cli-open', '--repo', h.repo, '--confinement', 'none', '--allow-unconfined', '--network'], dbEnv);
    expect(allowed).toMatchObject({ code: 0 });
    expect(allowed.stdout).toContain('none, network on');
  });

  it('slipway api refuses to start without bubblewrap and says what to install', async () => {
    // No bwrap on this PATH; nothing else is started before the check.
    const res = await slipway(['api', '--port', '0'], { ...dbEnv, PATH: tempDir('empty-path') });
    expect(res.code).not.toBe(0);
    expect(res.stderr).toContain('apt-get install bubblewrap');
    expect(res.stderr).toContain('--allow-unconfined');
  });
});

describe('slipway sandbox', () => {
  it('creates, execs, edits files, lists and destroys through the API', async () => {
    const created = await slipway(['sandbox', 'create', '--profile', 'linux-small', '--grant', `${apiEnv.PROJECT}:cache:read`, '--wait', '--json'], apiEnv);
    expect(created.stderr).toBe('');
    const sandbox = JSON.parse(created.stdout) as { id: string; status: string; grants: unknown[] };
    expect(sandbox).toMatchObject({ status: 'ready', grants: [{ project_id: apiEnv.PROJECT, scopes: ['cache:read'] }] });
    const id = sandbox.id;

    const exec = await slipway(['sandbox', 'exec', id, '--', 'sh', '-c', 'echo out; echo err >&2; exit 3'], apiEnv);
    expect(exec).toMatchObject({ code: 3, stdout: 'out\n', stderr: 'err\n' });
    const withStdin = await slipway(['sandbox', 'exec', id, '-i', '--env', 'X=1', '--', 'sh', '-c', 'cat; echo $X'], apiEnv, 'piped\n');
    expect(withStdin).toMatchObject({ code: 0, stdout: 'piped\n1\n' });

    const local = path.join(tempDir('cli-files'), 'in.txt');
    writeFileSync(local, 'from disk\n');
    expect((await slipway(['sandbox', 'files', 'put', id, 'docs/in.txt', local], apiEnv)).code).toBe(0);
    expect((await slipway(['sandbox', 'files', 'get', id, 'docs/in.txt'], apiEnv)).stdout).toBe('from disk\n');
    const outFile = `${local}.out`;
    await slipway(['sandbox', 'files', 'get', id, 'docs/in.txt', '-o', outFile], apiEnv);
    expect(readFileSync(outFile, 'utf8')).toBe('from disk\n');
    expect((await slipway(['sandbox', 'files', 'rm', id, 'docs/in.txt'], apiEnv)).code).toBe(0);
    const missing = await slipway(['sandbox', 'files', 'get', id, 'docs/in.txt'], apiEnv);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('file_not_found');
    const escape = await slipway(['sandbox', 'files', 'get', id, '../../../../etc/passwd'], apiEnv);
    expect(escape.stderr).toContain('path_refused');

    expect((await slipway(['sandbox', 'list'], apiEnv)).stdout).toContain(`${id}  ready`);
    expect((await slipway(['sandbox', 'get', id], apiEnv)).stdout).toContain(`${id}  ready  profile linux-small/linux`);

    // MCP over stdio, as an agent would launch it.
    const transport = new StdioClientTransport({ command: process.execPath, args: [BIN, 'mcp'], env: { ...(process.env as Record<string, string>), ...(apiEnv as Record<string, string>) }, stderr: 'pipe' });
    const mcp = new McpClient({ name: 'cli-test', version: '1.0.0' });
    await mcp.connect(transport);
    try {
      const r = (await mcp.callTool({ name: 'exec_in_sandbox', arguments: { sandbox_id: id, command: 'echo', args: ['over stdio'] } })) as { content: Array<{ text: string }> };
      expect(JSON.parse(r.content[0]!.text)).toMatchObject({ exit_code: 0, stdout: 'over stdio\n' });
    } finally {
      await mcp.close();
    }

    const destroyed = await slipway(['sandbox', 'destroy', id, '--wait', '--json'], apiEnv);
    expect(JSON.parse(destroyed.stdout)).toMatchObject({ status: 'terminated', end_reason: 'explicit_delete' });

    const month = new Date().toISOString().slice(0, 7);
    const usage = await slipway(['usage', '--account', 'cli-co', '--month', month, '--json'], dbEnv);
    const report = JSON.parse(usage.stdout) as { lines: Array<{ kind: string; minutes: number; sessions: number }>; compute_minutes: number };
    expect(report.lines).toEqual([{ kind: 'compute', platform: 'linux', minutes: expect.any(Number), sessions: 1 }]);
    expect(report.compute_minutes).toBeGreaterThan(0);
    expect((await slipway(['usage', '--account', 'cli-co', '--month', '2026-13'], dbEnv)).code).toBe(2);
  });

  it('says clearly when the token or the API is missing', async () => {
    expect((await slipway(['sandbox', 'list'])).stderr).toContain('SLIPWAY_API_TOKEN');
    const down = await slipway(['sandbox', 'list'], { SLIPWAY_API_URL: 'http://127.0.0.1:9', SLIPWAY_API_TOKEN: 'x' });
    expect(down).toMatchObject({ code: 1 });
    expect(down.stderr).toContain('cannot reach the sandbox API');
    expect((await slipway(['sandbox', 'list'], { ...apiEnv, SLIPWAY_API_TOKEN: 'slp_wrong' })).stderr).toContain('unauthorized');
  });
});

describe('slipway account set --disable', () => {
  it("ends the account's sandboxes at once (no reaper runs here) and refuses its tokens from the next request", async () => {
    const a = await h.account({ limit: 2 });
    await a.profile({ name: 'p' });
    const ids = [(await a.api.create({ profile: 'p' })).id, (await a.api.create({ profile: 'p' })).id];
    for (const id of ids) expect((await a.api.get(id, 60)).status).toBe('ready');
    const other = await h.account();
    await other.profile({ name: 'p' });
    const { id: bystander } = await other.api.create({ profile: 'p' });
    expect((await other.api.get(bystander, 60)).status).toBe('ready');

    const res = await slipway(['account', 'set', a.id, '--disable'], { ...dbEnv, TEMPORAL_ADDRESS: inject('temporalAddress') });
    expect(res, res.stderr).toMatchObject({ code: 0 });
    expect(res.stdout).toContain(`ending 2 live sandbox(es) of ${a.id} now`);
    expect(await codeOf(a.api.list())).toBe('403 sandboxes_disabled');
    const status = async (id: string) => (await h.database.db.query<{ status: string }>('SELECT status FROM sandboxes WHERE id = $1', [id])).rows[0]!.status;
    for (const id of ids) {
      expect(await until(async () => (await status(id)) === 'terminated')).toBe(true);
      const sessions = await h.sessions(id);
      expect(sessions.map((s) => [s.kind, s.end_reason])).toEqual([['compute', 'account_disabled']]);
      expect(sessions[0]!.ended_at).not.toBeNull();
    }
    // Another account is untouched.
    expect((await other.api.get(bystander)).status).toBe('ready');
    await other.api.destroy(bystander);
    expect((await slipway(['account', 'set', a.id, '--enable', '--disable'], dbEnv)).code).toBe(2);
  });
});

describe('embedded billing database (PGlite)', () => {
  it('needs no server, and refuses a second process while one holds it', async () => {
    const home = tempDir('cli-home');
    const env = { SLIPWAY_HOME: home };
    expect(await slipway(['account', 'create', 'embedded'], env)).toMatchObject({ code: 0 });
    expect((await slipway(['account', 'list'], env)).stdout).toContain('embedded');
    const held = await openPglite(path.join(home, 'billing'));
    try {
      const refused = await slipway(['account', 'list'], env);
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/in use by process \d+/);
    } finally {
      await held.close();
    }
    expect((await slipway(['account', 'list'], env)).code).toBe(0);
  });
});

/** Polls `check` until it holds (a condition, not a time window); false after `timeoutMs`. */
async function until(check: () => Promise<boolean> | boolean, timeoutMs = 30_000): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return check();
}

/** `slipway api` as a real process; resolves with its URL once it serves. */
function startApi(env: NodeJS.ProcessEnv): Promise<{ child: ChildProcess; url: string; stderr: () => string }> {
  const base = { ...process.env };
  delete base.DATABASE_URL;
  const child = spawn(process.execPath, [BIN, 'api', '--port', '0', '--reaper-seconds', '3600', '--watch-seconds', '0'], { env: { ...base, ...env }, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  return new Promise((resolve, reject) => {
    child.stderr!.on('data', (c) => {
      stderr += c;
      const m = /sandbox API on (http:\/\/\S+?) \(/.exec(stderr);
      if (m) resolve({ child, url: m[1]!, stderr: () => stderr });
    });
    child.once('exit', (code) => reject(new Error(`slipway api exited with ${code} before serving:\n${stderr}`)));
  });
}

const exited = (child: ChildProcess) => new Promise<void>((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', () => resolve())));

describe('embedded billing database (PGlite) while `slipway api` runs', () => {
  it('serves the CLI through its billing socket: a revoked token gets 401 and a disabled account ends its sandboxes at once; a SIGKILLed API starts again at once', async () => {
    const home = tempDir('emb-api');
    const env = { SLIPWAY_HOME: home, TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `emb-${randomBytes(4).toString('hex')}` };
    expect(await slipway(['account', 'create', 'emb', '--concurrency', '2'], env)).toMatchObject({ code: 0 });
    const first = (await slipway(['token', 'create', '--account', 'emb', '--name', 'first'], env)).stdout.trim();
    const firstId = (await openTokenIds(home))[0]!;

    let api = await startApi(env);
    const children = [api.child];
    try {
      expect((await new SandboxApiClient(api.url, first).list()).length).toBe(0);
      // The socket is the operator's only.
      const socket = billingSocketPath(path.join(home, 'billing'));
      expect(statSync(socket).mode & 0o777).toBe(0o600);
      expect(statSync(path.dirname(socket)).mode & 0o777).toBe(0o700);

      // Issue a token, make a profile, revoke a token: all while the API holds the billing database.
      const second = await slipway(['token', 'create', '--account', 'emb', '--name', 'second'], env);
      expect(second, second.stderr).toMatchObject({ code: 0 });
      const secondApi = new SandboxApiClient(api.url, second.stdout.trim());
      expect(await slipway(['profile', 'create', 'p', '--account', 'emb', '--repo', h.repo, '--base', 'main'], env)).toMatchObject({ code: 0 });
      const revoked = await slipway(['token', 'revoke', '--account', 'emb', firstId], env);
      expect(revoked, revoked.stderr).toMatchObject({ code: 0, stdout: `token ${firstId} revoked\n` });
      expect(await codeOf(new SandboxApiClient(api.url, first).list())).toBe('401 unauthorized');
      expect(await codeOf(secondApi.list())).toBe('ok');
      // Bad input through the socket still reads as bad input.
      expect((await slipway(['account', 'create', 'emb'], env)).code).toBe(2);

      // Disable: the sandbox ends now (the reaper ticks hourly here), billing closed, tokens refused.
      const { id } = await secondApi.create({ profile: 'p' });
      expect((await secondApi.get(id, 60)).status).toBe('ready');
      const disabled = await slipway(['account', 'set', 'emb', '--disable'], env);
      expect(disabled, disabled.stderr).toMatchObject({ code: 0 });
      expect(disabled.stdout).toContain('ending 1 live sandbox(es) of emb now');
      expect(await codeOf(secondApi.list())).toBe('403 sandboxes_disabled');
      const billingDb = connectBillingSocket(socket);
      const ended = async () => {
        const { rows } = await billingDb.query<{ status: string; end_reason: string | null }>('SELECT status, end_reason FROM sandboxes WHERE id = $1', [id]);
        return rows[0]!.status === 'terminated';
      };
      expect(await until(ended)).toBe(true);
      const sessions = await billingDb.query<{ kind: string; end_reason: string; ended_at: Date | null }>('SELECT kind, end_reason, ended_at FROM sandbox_sessions WHERE sandbox_id = $1', [id]);
      expect(sessions.rows.map((r) => [r.kind, r.end_reason])).toEqual([['compute', 'account_disabled']]);
      expect(sessions.rows[0]!.ended_at).toBeInstanceOf(Date);

      // kill -9, and start again at once: the dead holder's lock and socket are taken over.
      const pid = api.child.pid!;
      api.child.kill('SIGKILL');
      await exited(api.child);
      expect(processIdentity(pid)).toBeUndefined();
      api = await startApi(env);
      children.push(api.child);
      expect(await slipway(['account', 'set', 'emb', '--enable'], env)).toMatchObject({ code: 0 });
      expect(await codeOf(new SandboxApiClient(api.url, second.stdout.trim()).list())).toBe('ok');

      api.child.kill('SIGTERM');
      await exited(api.child);
      // Stopped cleanly: the billing database is free again for the CLI alone.
      expect((await slipway(['account', 'list'], env)).stdout).toContain('emb');
    } finally {
      for (const c of children) c.kill('SIGKILL');
    }
  });

  it('restarts at once even when the killed holder has not been reaped yet (a zombie), or its pid was reused', async () => {
    const home = tempDir('emb-zombie');
    const dir = path.join(home, 'billing');
    const db = await openPglite(dir);
    await db.close();
    // A holder that died but is still a zombie: its parent (`exec sleep`) never waits for it.
    const parent = spawn('sh', ['-c', 'sleep 0 & echo $!; exec sleep 600'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      const zpid = Number(await new Promise<string>((resolve) => parent.stdout!.once('data', (c) => resolve(String(c)))));
      const stat = () => readFileSync(`/proc/${zpid}/stat`, 'utf8');
      expect(await until(() => stat().slice(stat().lastIndexOf(')') + 2).startsWith('Z'))).toBe(true);
      const start = stat().slice(stat().lastIndexOf(')') + 2).split(' ')[19];
      writeFileSync(path.join(dir, 'slipway.lock'), `${zpid} ${start}\n`);
      await (await openPglite(dir)).close();
    } finally {
      parent.kill('SIGKILL');
    }
    // A lock naming a live process with another start time: the pid was reused, the holder is gone.
    writeFileSync(path.join(dir, 'slipway.lock'), `1 999999999999\n`);
    await (await openPglite(dir)).close();
    // A live holder (same pid and start time) is refused.
    const alive = spawn('sleep', ['600'], { stdio: 'ignore' });
    try {
      await until(() => processIdentity(alive.pid!) !== undefined);
      writeFileSync(path.join(dir, 'slipway.lock'), `${alive.pid} ${processIdentity(alive.pid!)!.start}\n`);
      await expect(openPglite(dir)).rejects.toThrow(`in use by process ${alive.pid}`);
    } finally {
      alive.kill('SIGKILL');
    }
  });
});

/** The ids of the tokens in an embedded billing database nobody holds. */
async function openTokenIds(home: string): Promise<string[]> {
  const db = await openPglite(path.join(home, 'billing'));
  try {
    return (await db.query<{ id: string }>('SELECT id FROM api_tokens ORDER BY created_at')).rows.map((r) => r.id);
  } finally {
    await db.close();
  }
}
