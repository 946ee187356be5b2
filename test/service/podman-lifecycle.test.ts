/**
 * The sandbox service on podman (`provider: podman` profiles, ADR 0012): create -> ready ->
 * exec and files -> idle suspend (container stopped, workspace kept) -> woken by exec -> DELETE
 * (container and workspace gone), with the billing rows of the local provider's lifecycle. Real
 * Postgres, real Temporal, real HTTP, real podman.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { containerName, engineEnv } from '../../activities/sandbox/container';
import { defaultProviderFor } from '../../activities/service/providers';
import { startServiceHarness, type ServiceHarness } from './harness';

let h: ServiceHarness;
beforeAll(async () => {
  h = await startServiceHarness({ providerFor: defaultProviderFor() });
});
afterAll(async () => {
  await h?.stop();
});

const sh = (script: string) => ({ command: 'sh', args: ['-c', script] });
const root = async (id: string) => (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [id])).rows[0]!.root;
const containerState = (name: string) => {
  try {
    return execFileSync('podman', ['inspect', '--format', '{{.State.Status}}', name], { env: engineEnv(), encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return 'gone';
  }
};

describe('service sandboxes on podman', () => {
  it('create, exec and files in a container, idle suspend and wake, DELETE removes the container', async () => {
    const a = await h.account({ limit: 2 });
    await a.profile({ name: 'podman-small', provider: 'podman', idleTimeoutSeconds: 1.5, resources: { memory_mb: 256, processes: 128 } });
    const { id } = await a.api.create({ profile: 'podman-small' });
    const ready = await a.api.get(id, 60);
    expect(ready).toMatchObject({ status: 'ready', provisioning_kind: 'cold_boot' });
    const dir = await root(id);
    const name = containerName(dir);
    expect(containerState(name)).toBe('running');

    const run = await a.api.exec(id, sh('echo hello from $SLIPWAY_SANDBOX_ID; git rev-parse --abbrev-ref HEAD; pwd; grep CapEff /proc/self/status'));
    expect(run).toMatchObject({ exit_code: 0, timed_out: false });
    expect(run.stdout).toBe(`hello from ${id}\nslipway/sandboxes/${id}\n/workspace\nCapEff:\t0000000000000000\n`);
    await a.api.exec(id, sh('printf "draft\\n" > notes.txt'));

    // Idle: the container stops, its workspace stays; compute closes, storage opens.
    await h.waitFor(a.api, id, ['suspended'], 30_000);
    expect(containerState(name)).toBe('exited');
    expect(existsSync(dir)).toBe(true);
    expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
      ['compute', 1, 'idle_offload'],
      ['snapshot_storage', 1, null],
    ]);

    // The next call wakes it, with its files in place.
    const woke = await a.api.exec(id, sh('cat notes.txt'));
    expect(woke.stdout).toBe('draft\n');
    expect(containerState(name)).toBe('running');
    expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
      ['compute', 1, 'idle_offload'],
      ['snapshot_storage', 1, 'restored'],
      ['compute', 2, null],
    ]);

    await a.api.destroy(id);
    const done = await h.waitFor(a.api, id, ['terminated'], 30_000);
    expect(done.end_reason).toBe('explicit_delete');
    expect(containerState(name)).toBe('gone');
    expect(existsSync(dir)).toBe(false);
  });
});
