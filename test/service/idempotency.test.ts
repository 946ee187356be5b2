/**
 * Idempotency-Key on POST create and exec: a retried request gets the first answer and the work
 * is done once, a reused key with another body is refused, a bad key is a 400.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hideHostPaths } from '../../api/service';
import { startServiceHarness, type ServiceHarness } from './harness';

let h: ServiceHarness;
let a: Awaited<ReturnType<ServiceHarness['account']>>;

beforeAll(async () => {
  h = await startServiceHarness();
  a = await h.account({ limit: 3 });
  await a.profile({ name: 'p' });
});
afterAll(async () => {
  await h?.stop();
});

const post = (path: string, body: unknown, key?: string) =>
  fetch(new URL(path, h.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${a.token}`, 'content-type': 'application/json', ...(key !== undefined ? { 'idempotency-key': key } : {}) },
    body: JSON.stringify(body),
  });

describe('Idempotency-Key', () => {
  it('creates once for a key, answers a retry with the same sandbox, refuses the key with another body', async () => {
    const first = await post('/api/v1/sandboxes', { profile: 'p' }, 'create-1');
    expect(first.status).toBe(201);
    const created = (await first.json()) as { id: string };
    const again = await post('/api/v1/sandboxes', { profile: 'p' }, 'create-1');
    expect(again.status).toBe(201);
    expect(again.headers.get('idempotent-replayed')).toBe('true');
    expect(((await again.json()) as { id: string }).id).toBe(created.id);
    expect((await a.api.list()).filter((s) => s.status !== 'terminated')).toHaveLength(1);
    const other = await post('/api/v1/sandboxes', { profile: 'p', deadline_minutes: 5 }, 'create-1');
    expect(other.status).toBe(422);
    expect(((await other.json()) as { error: { code: string } }).error.code).toBe('idempotency_key_reused');
    const bad = await post('/api/v1/sandboxes', { profile: 'p' }, 'spaces are not allowed');
    expect(bad.status).toBe(400);
    await h.waitFor(a.api, created.id, ['ready']);

    // Exec: the command runs once; the retry gets its answer.
    const body = { command: 'sh', args: ['-c', 'echo run >> runs.txt; wc -l < runs.txt'] };
    const run1 = await post(`/api/v1/sandboxes/${created.id}/exec`, body, 'exec-1');
    expect(run1.status).toBe(200);
    const out1 = (await run1.json()) as { stdout: string };
    const run2 = await post(`/api/v1/sandboxes/${created.id}/exec`, body, 'exec-1');
    expect(run2.headers.get('idempotent-replayed')).toBe('true');
    expect((await run2.json()) as { stdout: string }).toEqual(out1);
    const count = await a.api.exec(created.id, { command: 'sh', args: ['-c', 'wc -l < runs.txt'] });
    expect(count.stdout.trim()).toBe('1');
    // Without a key, every request runs.
    await post(`/api/v1/sandboxes/${created.id}/exec`, body);
    expect((await a.api.exec(created.id, { command: 'sh', args: ['-c', 'wc -l < runs.txt'] })).stdout.trim()).toBe('2');
  });
});

describe('host paths in errors', () => {
  it('are never shown to tenants', async () => {
    const text = "could not create sandbox: /srv/repo/.slipway/worktrees/acct-1/sbx_x/.git is not a worktree of /srv/repo; bwrap: Can't mount /home/op/.cache: ENOENT";
    const shown = hideHostPaths(text, { sandbox: '/srv/repo/.slipway/worktrees/acct-1/sbx_x', repository: '/srv/repo' });
    expect(shown).toBe("could not create sandbox: <sandbox>/.git is not a worktree of <repository>; bwrap: Can't mount <host path>: ENOENT");
  });
});
