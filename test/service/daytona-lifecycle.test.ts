/**
 * The sandbox service on Daytona (`provider: daytona` profiles, ADR 0019) against the local fake of
 * Daytona's API (test/helpers/fake-daytona.ts), spoken to by the real SDK: create -> ready -> exec
 * and files -> idle suspend (Daytona sandbox stopped) -> woken by exec (started) -> DELETE (Daytona
 * sandbox deleted), with the billing rows of the other providers. Real Postgres, Temporal, HTTP.
 */
import { promises as fs } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultProviderFor } from '../../activities/service/providers';
import { FakeDaytona } from '../helpers/fake-daytona';
import { startServiceHarness, type ServiceHarness } from './harness';

const fake = new FakeDaytona();
let h: ServiceHarness;
beforeAll(async () => {
  await fake.start();
  h = await startServiceHarness({ providerFor: defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test' } }) });
});
afterAll(async () => {
  await h?.stop();
  await fake.stop();
});

const sh = (script: string) => ({ command: 'sh', args: ['-c', script] });
const root = async (id: string) => (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [id])).rows[0]!.root;
const daytonaId = async (id: string) => (JSON.parse(await fs.readFile(`${await root(id)}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
const state = (daytona: string) => fake.sandboxes.get(daytona)?.state ?? 'gone';

describe('service sandboxes on daytona (fake)', () => {
  it('create, exec and files in a Daytona sandbox, idle stop and start on exec, DELETE deletes it; billing rows closed', async () => {
    const a = await h.account({ limit: 2 });
    await a.profile({ name: 'daytona-small', provider: 'daytona', idleTimeoutSeconds: 1.5 });
    const { id } = await a.api.create({ profile: 'daytona-small' });
    const ready = await a.api.get(id, 60);
    expect(ready).toMatchObject({ status: 'ready', provisioning_kind: 'cold_boot' });
    const remote = await daytonaId(id);
    expect(state(remote)).toBe('started');
    expect(fake.sandboxes.get(remote)!.labels).toMatchObject({ 'slipway.sandbox': expect.any(String) });

    const run = await a.api.exec(id, sh('echo hello from $SLIPWAY_SANDBOX_ID; git rev-parse --abbrev-ref HEAD'));
    expect(run).toMatchObject({ exit_code: 0, timed_out: false });
    expect(run.stdout).toBe(`hello from ${id}\nslipway/sandboxes/${id}\n`);
    const env = await a.api.exec(id, sh('env'));
    expect(env.stdout).not.toContain(fake.apiKey);
    await a.api.exec(id, sh('printf "draft\\n" > notes.txt'));

    // Idle: the Daytona sandbox stops (its disk stays); compute closes, storage opens.
    await h.waitFor(a.api, id, ['suspended'], 30_000);
    expect(state(remote)).toBe('stopped');
    expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
      ['compute', 1, 'idle_offload'],
      ['snapshot_storage', 1, null],
    ]);

    // The next call starts it again, with its files in place.
    const woke = await a.api.exec(id, sh('cat notes.txt'));
    expect(woke.stdout).toBe('draft\n');
    expect(state(remote)).toBe('started');
    expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
      ['compute', 1, 'idle_offload'],
      ['snapshot_storage', 1, 'restored'],
      ['compute', 2, null],
    ]);

    await a.api.destroy(id);
    const done = await h.waitFor(a.api, id, ['terminated'], 30_000);
    expect(done.end_reason).toBe('explicit_delete');
    expect(state(remote)).toBe('gone');
    expect((await h.sessions(id)).every((s) => s.end_reason !== null)).toBe(true);
  });

  it('terminates at the deadline: the Daytona sandbox is deleted and the compute row closed with reason deadline', async () => {
    const a = await h.account();
    await a.profile({ name: 'daytona-short', provider: 'daytona' });
    const { id } = await a.api.create({ profile: 'daytona-short', deadline_minutes: 0.05 });
    await a.api.get(id, 60);
    const remote = await daytonaId(id);
    expect(state(remote)).toBe('started');
    const done = await h.waitFor(a.api, id, ['terminated'], 30_000);
    expect(done.end_reason).toBe('deadline');
    expect(state(remote)).toBe('gone');
    expect((await h.sessions(id)).map((s) => [s.kind, s.end_reason])).toEqual([['compute', 'deadline']]);
  });
});
