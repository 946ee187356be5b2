/**
 * Daytona sandboxes (ADR 0019) against a local fake of Daytona's HTTP API
 * (test/helpers/fake-daytona.ts): the real SDK talks to it over HTTP on 127.0.0.1.
 */
import { promises as fs } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { daytonaSandboxRoot, DaytonaProviderError, DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import { BundleRefusedError } from '../../activities/sandbox/git-transport';
import { createStreamSandbox } from '../../activities/sandbox/objective-sandboxes';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { SandboxProviders } from '../../activities/sandbox/router';
import { SandboxConfigSchema } from '../../core/objective-schema';
import { ApplicationFailure } from '@temporalio/common';
import { FakeDaytona } from '../helpers/fake-daytona';
import { describeSandboxContract } from './contract';
import { gitIn, makeRepo, sandboxRequest, tempDir } from './helpers';

const fake = new FakeDaytona();
beforeAll(async () => {
  await fake.start();
});
afterAll(() => fake.stop());

describeSandboxContract('daytona (fake)', () => new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test' }), {
  workspacePath: async (handle) => {
    const record = JSON.parse(await fs.readFile(`${handle.root}.json`, 'utf8')) as { workspace: string };
    return record.workspace;
  },
});

describe('daytona: Daytona errors mapped, state watched, suspend and restore', () => {
  let parent: string;
  let repo: string;
  let provider: DaytonaSandboxProvider;
  let handle: SandboxHandle;
  const daytonaId = async (h: SandboxHandle) => (JSON.parse(await fs.readFile(`${h.root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;

  beforeAll(async () => {
    parent = tempDir('daytona');
    ({ repo } = makeRepo(parent));
    provider = new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test', maxRateLimitWaitMs: 5_000 });
    handle = await provider.create(sandboxRequest(repo, 'errors', { group: 'daytona' }));
  });
  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('creates with the snapshot, labels and auto-stop/auto-delete intervals; no credential reaches the sandbox', async () => {
    const s = fake.sandboxes.get(await daytonaId(handle))!;
    expect(s.snapshot).toBe('slipway-test');
    expect(s.labels).toMatchObject({ 'slipway.group': 'daytona', 'slipway.name': 'errors', 'slipway.sandbox': handle.sandboxId });
    expect(s.autoStopInterval).toBeGreaterThan(0);
    expect(s.autoDeleteInterval).toBeGreaterThan(0);
    expect(JSON.stringify({ labels: s.labels, env: s.env })).not.toContain(fake.apiKey);
    const env = await provider.exec(handle, { command: 'env', shell: true });
    expect(env.stdout).not.toContain(fake.apiKey);
  });

  it('a quota refusal fails the create with Daytona\'s message, and nothing is left running', async () => {
    const before = fake.sandboxes.size;
    fake.inject({ method: 'POST', path: /^\/api\/sandbox$/, status: 403, body: { statusCode: 403, message: 'Total CPU quota exceeded. Maximum allowed: 10' } });
    const err = await provider.create(sandboxRequest(repo, 'over-quota', { group: 'daytona' })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaProviderError);
    expect((err as DaytonaProviderError).kind).toBe('quota');
    expect((err as Error).message).toContain('Total CPU quota exceeded');
    expect(fake.sandboxes.size).toBe(before);
    await expect(fs.access(`${daytonaSandboxRoot(repo, 'daytona', 'over-quota')}.json`)).rejects.toThrow();
  });

  it('through the create activity, a quota refusal is a sandbox_failure carrying Daytona\'s message', async () => {
    const router = new SandboxProviders(new LocalSandboxProvider(), undefined, () => provider);
    fake.inject({ method: 'POST', path: /^\/api\/sandbox$/, status: 403, body: { statusCode: 403, message: 'Total memory quota exceeded' } });
    const err = await createStreamSandbox(router, {
      sandboxId: 'q.s', provider: 'local', repository: repo, objectiveId: 'daytona', name: 'quota-activity', branch: 'slipway/daytona/quota-activity', base: 'main', ownerWorkflowId: 'none',
      options: { provider: 'daytona', confinement: 'none', network: true, copyIgnored: false, warmPool: 0 },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApplicationFailure);
    expect((err as ApplicationFailure).type).toBe('sandbox_failure');
    expect((err as Error).message).toContain('Total memory quota exceeded');
  });

  it('the objective file refuses sandbox.limits with provider: daytona, naming the field', () => {
    expect(SandboxConfigSchema.safeParse({ provider: 'daytona' }).success).toBe(true);
    const bad = SandboxConfigSchema.safeParse({ provider: 'daytona', limits: { memory_mb: 512 } });
    expect(bad.success).toBe(false);
    expect(bad.error!.issues.find((i) => i.path.join('.') === 'limits')?.message).toMatch(/not supported by provider: daytona/);
  });

  it('a rate limit is waited out until its reset, then the call succeeds', async () => {
    fake.inject({ method: 'GET', path: /^\/api\/sandbox\/[^/]+$/, status: 429, headers: { 'retry-after': '1' }, body: { statusCode: 429, message: 'Too many requests' } });
    const started = Date.now();
    expect(await provider.probe(handle)).toEqual({ alive: true });
    expect(Date.now() - started).toBeGreaterThanOrEqual(900);
    expect(fake.requests.filter((r) => r.startsWith('GET /api/sandbox/')).length).toBeGreaterThanOrEqual(2);
  });

  it('a rate limit whose reset is too far away fails with the reset time', async () => {
    const reset = Math.floor(Date.now() / 1000) + 3600;
    fake.inject({ method: 'GET', path: /^\/api\/sandbox\/[^/]+$/, status: 429, headers: { 'x-ratelimit-reset': String(reset) }, body: { statusCode: 429, message: 'Too many requests' } });
    const err = (await provider.probe(handle).catch((e: unknown) => e)) as DaytonaProviderError;
    expect(err).toBeInstanceOf(DaytonaProviderError);
    expect(err.kind).toBe('rate_limit');
    expect(err.resetAt).toBe(reset * 1000);
    expect(err.message).toContain(new Date(reset * 1000).toISOString());
  });

  it('transient 5xx are retried; past the retries the error says so', async () => {
    fake.inject({ method: 'POST', path: /\/process\/session\/[^/]+\/exec$/, status: 503, times: 2 });
    const ok = await provider.exec(handle, { command: 'echo through', shell: true });
    expect(ok.stdout).toBe('through\n');
    fake.inject({ method: 'POST', path: /\/process\/session\/[^/]+\/exec$/, status: 502, times: 20 });
    const err = (await provider.exec(handle, { command: 'echo never', shell: true }).catch((e: unknown) => e)) as DaytonaProviderError;
    expect(err).toBeInstanceOf(DaytonaProviderError);
    expect(err.kind).toBe('transient');
    expect(err.status).toBe(502);
    fake.clearFailures();
  });

  it('a wrong API key is refused as unauthorized; no key at all names DAYTONA_API_KEY', async () => {
    const wrong = new DaytonaSandboxProvider({ apiKey: 'wrong', apiUrl: fake.url, target: 'fake' });
    await expect(wrong.probe(handle)).rejects.toMatchObject({ kind: 'unauthorized' });
    const saved = process.env.DAYTONA_API_KEY;
    delete process.env.DAYTONA_API_KEY;
    try {
      await expect(new DaytonaSandboxProvider({ apiUrl: fake.url }).probe(handle)).rejects.toThrow(/DAYTONA_API_KEY/);
    } finally {
      if (saved !== undefined) process.env.DAYTONA_API_KEY = saved;
    }
  });

  it('suspend stops the Daytona sandbox (disk kept) and restore starts it again', async () => {
    await provider.writeFile(handle, 'kept.txt', 'kept');
    const id = await daytonaId(handle);
    const { snapshotRef } = await provider.suspend(handle);
    expect(snapshotRef).toBe(`daytona:${id}`);
    expect(fake.sandboxes.get(id)!.state).toBe('stopped');
    expect(await provider.probe(handle)).toEqual({ alive: true });
    expect((await provider.list(repo)).find((s) => s.root === handle.root)?.head).toBe(handle.headCommit);
    const restored = await provider.restore(handle);
    expect(restored.head).toBe(handle.headCommit);
    expect(fake.sandboxes.get(id)!.state).toBe('started');
    expect((await provider.readFile(handle, 'kept.txt')).toString()).toBe('kept');
  });

  it('probe: a sandbox stopped, archived or deleted outside Slipway is dead, with the reason', async () => {
    const other = await provider.create(sandboxRequest(repo, 'probed', { group: 'daytona' }));
    const id = await daytonaId(other);
    expect(await provider.probe(other)).toEqual({ alive: true });
    fake.setState(id, 'stopped');
    expect(await provider.probe(other)).toMatchObject({ alive: false, reason: 'sandbox_stopped' });
    fake.setState(id, 'archived');
    expect(await provider.probe(other)).toMatchObject({ alive: false, reason: 'sandbox_archived' });
    fake.setState(id, 'destroyed');
    expect(await provider.probe(other)).toMatchObject({ alive: false, reason: 'sandbox_deleted' });
    await provider.destroy({ repository: repo, root: other.root });
  });

  it('refuses a bundle the agent rewrote so it no longer descends from the base; the branch is untouched', async () => {
    const rewrite = await provider.exec(handle, { command: `git checkout -q --orphan other && git -c user.name=a -c user.email=a@a commit -q --allow-empty -m evil && git branch -f ${handle.branch} HEAD && git checkout -q ${handle.branch}`, shell: true });
    expect(rewrite.exitCode, rewrite.stderr).toBe(0);
    await expect(provider.collect(handle)).rejects.toBeInstanceOf(BundleRefusedError);
    expect(gitIn(repo, 'rev-parse', `refs/heads/${handle.branch}`)).toBe(handle.headCommit);
  });

  it('destroy deletes the Daytona sandbox', async () => {
    const id = await daytonaId(handle);
    await provider.destroy({ repository: repo, root: handle.root });
    expect(fake.sandboxes.has(id)).toBe(false);
    expect((await provider.list(repo)).map((s) => s.root)).not.toContain(handle.root);
  });
});
