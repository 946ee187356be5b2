/**
 * Exec and sessions through the service API on a Daytona sandbox (the local fake of Daytona's
 * API, spoken to by the real SDK; real Postgres, Temporal, HTTP). A remote sandbox has no folder
 * on this host: cwd is checked inside the sandbox (confined to its workspace, symbolic links
 * followed there), and a sandbox Daytona no longer has answers as a gone local one does (409).
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { defaultProviderFor } from '../../activities/service/providers';
import { FakeDaytona } from '../helpers/fake-daytona';
import { codeOf, rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

const fake = new FakeDaytona();
let h: ServiceHarness;
let a: TestAccount;
let id: string;

beforeAll(async () => {
  await fake.start();
  // No retries: an injected outage is answered at once, not after the provider's backoff.
  h = await startServiceHarness({ execConcurrency: 8, providerFor: defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test', retries: 0 } }) });
  a = await h.account({ limit: 3 });
  await a.profile({ name: 'daytona', provider: 'daytona' });
  id = (await a.api.create({ profile: 'daytona' })).id;
  await h.waitFor(a.api, id, ['ready'], 60_000);
});
afterAll(async () => {
  await h?.stop();
  await fake.stop();
});

const sh = (script: string, extra: Record<string, unknown> = {}) => ({ command: 'sh', args: ['-c', script], ...extra });
const daytonaId = async (sandbox: string) => {
  const root = (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [sandbox])).rows[0]!.root;
  return (JSON.parse(await fs.readFile(`${root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
};
const workspace = async (sandbox: string) => path.join(fake.sandboxes.get(await daytonaId(sandbox))!.home, 'workspace');
type ErrorBody = { error: { code: string; message: string; issues?: Array<{ path: string; message: string }> } };
const execRaw = async (sandbox: string, body: Record<string, unknown>) => {
  const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${sandbox}/exec`, { token: a.token, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as ErrorBody, retryAfter: res.headers.get('retry-after') };
};

type Frame = { type: string; data?: string; exit_code?: number | null; code?: string; issues?: Array<{ path: string }> };
const ndjson = async (res: Response) => (await res.text()).split('\n').filter(Boolean).map((l) => JSON.parse(l) as Frame);
const text = (frames: Frame[], type = 'stdout') => frames.filter((f) => f.type === type).map((f) => f.data).join('');

describe('exec cwd on a Daytona sandbox', () => {
  it('runs in a folder of the workspace', async () => {
    await a.api.exec(id, sh('mkdir -p sub/deeper && ln -s sub/deeper inner-link'));
    const ws = await workspace(id);
    expect((await a.api.exec(id, { command: 'pwd', cwd: 'sub/deeper' })).stdout).toBe(`${ws}/sub/deeper\n`);
    // A link that stays inside is followed (to where it leads).
    expect((await a.api.exec(id, { command: 'pwd', cwd: 'inner-link' })).stdout).toBe(`${ws}/sub/deeper\n`);
    expect((await a.api.exec(id, { command: 'pwd', cwd: '.' })).stdout).toBe(`${ws}\n`);
  });

  it('refuses a cwd that leaves the workspace with a 400 naming cwd, by .., absolute path or symbolic link; nothing runs', async () => {
    // The attack: links planted by the sandbox's own commands, pointing out of the workspace.
    await a.api.exec(id, sh('ln -sfn / to-root && ln -sfn .. to-parent && mkdir -p d && ln -sfn ../../.. d/up'));
    for (const cwd of ['..', '../..', 'sub/../..', '/tmp', 'to-root', 'to-parent', 'd/up', 'to-root/etc']) {
      const res = await execRaw(id, { command: 'sh', args: ['-c', 'touch escaped-marker'], cwd });
      expect([cwd, res.status, res.body.error.code]).toEqual([cwd, 400, 'path_refused']);
      expect(res.body.error.issues?.map((i) => i.path)).toEqual(['cwd']);
    }
    const ws = await workspace(id);
    for (const place of [path.dirname(ws), path.dirname(path.dirname(ws)), '/']) {
      await expect(fs.access(path.join(place, 'escaped-marker'))).rejects.toThrow();
    }
  });

  it('refuses a cwd that is no folder with 400 invalid_cwd naming cwd', async () => {
    await a.api.exec(id, sh('echo x > a-file'));
    for (const [cwd, why] of [
      ['no/such/folder', 'no such folder'],
      ['a-file', 'not a folder'],
    ]) {
      const res = await execRaw(id, { command: 'true', cwd });
      expect(res.status).toBe(400);
      expect(res.body.error).toMatchObject({ code: 'invalid_cwd', issues: [{ path: 'cwd', message: why }] });
    }
  });

  it('checks a streamed exec\'s cwd the same way', async () => {
    const ok = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, { token: a.token, body: JSON.stringify({ stream: true, command: 'pwd', cwd: 'sub' }) });
    expect(ok.status).toBe(200);
    expect(text(await ndjson(ok))).toBe(`${await workspace(id)}/sub\n`);
    const out = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, { token: a.token, body: JSON.stringify({ stream: true, command: 'pwd', cwd: 'to-root' }) });
    expect(out.status).toBe(400);
    expect(((await out.json()) as ErrorBody).error).toMatchObject({ code: 'path_refused', issues: [{ path: 'cwd' }] });
  });
});

describe('sessions on a Daytona sandbox', () => {
  it('streamed exec: stdin in, stdout and stderr out, the exit code last', async () => {
    const res = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${id}/exec`, { token: a.token, body: JSON.stringify(sh('cat; echo oops >&2; exit 3', { stream: true, stdin: 'from stdin\n' })) });
    expect(res.status).toBe(200);
    const frames = await ndjson(res);
    expect(frames.at(-1)).toMatchObject({ type: 'exit', exit_code: 3 });
    expect(text(frames)).toBe('from stdin\n');
    expect(text(frames, 'stderr')).toBe('oops\n');
  });

  it('WebSocket: input typed after the start comes back, then EOF and the exit code', async () => {
    const ws = new WebSocket(`${h.url.replace(/^http/, 'ws')}/api/v1/sandboxes/${id}/exec/ws`, { headers: { authorization: `Bearer ${a.token}` } });
    const got: Frame[] = [];
    ws.on('message', (d) => got.push(JSON.parse(d.toString()) as Frame));
    const closed = new Promise<number>((resolve) => ws.on('close', (code) => resolve(code)));
    await new Promise<void>((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    ws.send(JSON.stringify({ type: 'start', ...sh('while read l; do echo "line:$l"; done; pwd; exit 7'), cwd: 'sub' }));
    ws.send(Buffer.from('first\n'));
    ws.send(JSON.stringify({ type: 'stdin', data: Buffer.from('second\n').toString('base64') }));
    ws.send(JSON.stringify({ type: 'stdin_close' }));
    expect(await closed).toBe(1000);
    expect(got.at(-1)).toMatchObject({ type: 'exit', exit_code: 7 });
    expect(text(got)).toBe(`line:first\nline:second\n${await workspace(id)}/sub\n`);
  });

  it('WebSocket: a start whose cwd leaves the workspace closes with 4400 and an error naming cwd', async () => {
    const ws = new WebSocket(`${h.url.replace(/^http/, 'ws')}/api/v1/sandboxes/${id}/exec/ws`, { headers: { authorization: `Bearer ${a.token}` } });
    const got: Frame[] = [];
    ws.on('message', (d) => got.push(JSON.parse(d.toString()) as Frame));
    const closed = new Promise<number>((resolve) => ws.on('close', (code) => resolve(code)));
    await new Promise<void>((resolve, reject) => {
      ws.once('open', resolve);
      ws.once('error', reject);
    });
    ws.send(JSON.stringify({ type: 'start', command: 'true', cwd: 'to-root' }));
    expect(await closed).toBe(4400);
    expect(got.find((f) => f.type === 'error')).toMatchObject({ code: 'path_refused', issues: [{ path: 'cwd' }] });
  });
});

describe('provider failures on a Daytona sandbox', () => {
  it('an outage of Daytona is a 503 to retry (Retry-After), not a 409: the sandbox is still there', async () => {
    fake.inject({ path: /\/files\/bulk-upload$/, status: 503, times: 1 });
    const res = await execRaw(id, { command: 'true' });
    expect([res.status, res.body.error.code]).toEqual([503, 'provider_unavailable']);
    expect(Number(res.retryAfter)).toBeGreaterThanOrEqual(1);
    expect(res.body.error.message).not.toContain(fake.url);
    expect((await a.api.exec(id, { command: 'echo', args: ['still here'] })).stdout).toBe('still here\n');
  });

  it('a sandbox deleted behind Slipway\'s back answers 409 sandbox_ended, as a local sandbox whose folder vanished does', async () => {
    const other = (await a.api.create({ profile: 'daytona' })).id;
    await h.waitFor(a.api, other, ['ready'], 60_000);
    const remote = await daytonaId(other);
    const deleted = await fetch(`${fake.url}/sandbox/${remote}`, { method: 'DELETE', headers: { authorization: `Bearer ${fake.apiKey}` } });
    expect(deleted.status).toBe(200);
    // Before or after the watcher notices, the answer is the same.
    expect(await codeOf(a.api.exec(other, { command: 'true' }))).toBe('409 sandbox_ended');
    expect(await codeOf(a.api.exec(other, { command: 'true', cwd: 'sub' }))).toBe('409 sandbox_ended');
    const stream = await rawRequest(h.url, 'POST', `/api/v1/sandboxes/${other}/exec`, { token: a.token, body: JSON.stringify({ stream: true, command: 'true' }) });
    expect(stream.status).toBe(409);
    expect(((await stream.json()) as ErrorBody).error.code).toBe('sandbox_ended');
    // The watcher ends it for good (waitFor throws if it does not).
    await h.waitFor(a.api, other, ['terminated', 'failed'], 30_000);
  });
});
