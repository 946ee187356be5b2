/**
 * The service watcher and reaper on Daytona: the watcher ends a sandbox Daytona stopped or
 * archived outside Slipway with Daytona's reason; the reaper's leftover sweep (ADR 0019, "the janitor"): Daytona sandboxes of
 * the service found by their labels (`provider.list`), whose sandbox ended or never made it into
 * the billing database, are deleted; live ones and ones still being made are kept. Against the
 * local fake of Daytona's API (real SDK), real Postgres and Temporal.
 */
import { promises as fs } from 'node:fs';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import { createSandboxServiceActivities } from '../../activities/service';
import { defaultProviderFor } from '../../activities/service/providers';
import { serviceSandboxBranch, serviceSandboxGroup } from '../../core/sandbox-service';
import { FakeDaytona } from '../helpers/fake-daytona';
import { startServiceHarness, type ServiceHarness } from './harness';

const fake = new FakeDaytona();
let h: ServiceHarness;

beforeAll(async () => {
  await fake.start();
  h = await startServiceHarness({ reaper: false, providerFor: defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test', retries: 0 } }) });
}, 120_000);
afterAll(async () => {
  await h?.stop();
  await fake.stop();
});

it('deletes Daytona sandboxes of ended or unknown service sandboxes, keeps live and young ones', async () => {
  const a = await h.account({ limit: 2 });
  await a.profile({ name: 'daytona', provider: 'daytona' });
  const live = (await a.api.create({ profile: 'daytona' })).id;
  await h.waitFor(a.api, live, ['ready'], 60_000);
  const ended = (await a.api.create({ profile: 'daytona' })).id;
  await h.waitFor(a.api, ended, ['ready'], 60_000);

  // Leftovers as a crash leaves them: Daytona sandboxes of the account's group the billing
  // database knows nothing of (an old one and one just made), and one whose sandbox ended while
  // its Daytona sandbox stayed (the row says terminated; the workflow's delete never happened).
  const direct = new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test' });
  const make = async (id: string) => direct.create({ sandboxId: id, repository: h.repo, group: serviceSandboxGroup(a.id), name: id, branch: serviceSandboxBranch(id), base: 'main' });
  const unknownOld = await make('sbx_aaaaaaaaaaaaaaaaaaaa');
  const unknownYoung = await make('sbx_bbbbbbbbbbbbbbbbbbbb');
  const past = new Date(Date.now() - 10 * 60_000);
  await fs.utimes(`${unknownOld.root}.json`, past, past);
  await h.database.db.query(`UPDATE sandboxes SET status = 'terminated' WHERE id = $1`, [ended]);
  const remoteOf = async (root: string) => (JSON.parse(await fs.readFile(`${root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
  const rootOf = async (id: string) => (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [id])).rows[0]!.root;
  const remotes = {
    live: await remoteOf(await rootOf(live)),
    ended: await remoteOf(await rootOf(ended)),
    unknownOld: await remoteOf(unknownOld.root),
    unknownYoung: await remoteOf(unknownYoung.root),
  };
  for (const r of Object.values(remotes)) expect(fake.sandboxes.has(r)).toBe(true);

  const acts = createSandboxServiceActivities({ db: h.database.db, providerFor: defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test' } }), client: h.host.client });
  const result = await acts.reapSandboxes({ orphanGraceMs: 60_000 });
  expect(result.removedLeftovers.sort()).toEqual([ended, 'sbx_aaaaaaaaaaaaaaaaaaaa'].sort());
  expect(fake.sandboxes.has(remotes.ended)).toBe(false);
  expect(fake.sandboxes.has(remotes.unknownOld)).toBe(false);
  expect(fake.sandboxes.has(remotes.live)).toBe(true);
  expect(fake.sandboxes.has(remotes.unknownYoung)).toBe(true);
  // The live sandbox still answers.
  expect((await a.api.exec(live, { command: 'echo', args: ['alive'] })).stdout).toBe('alive\n');
});

it('the watcher ends a sandbox Daytona stopped or archived outside Slipway, with the reason Daytona gave', async () => {
  const a = await h.account({ limit: 2 });
  await a.profile({ name: 'daytona', provider: 'daytona' });
  const remoteOf = async (id: string) => {
    const root = (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [id])).rows[0]!.root;
    return (JSON.parse(await fs.readFile(`${root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
  };
  const cases = [
    ['stopped', 'was stopped outside Slipway'],
    ['archived', 'was archived'],
  ] as const;
  for (const [state, said] of cases) {
    const id = (await a.api.create({ profile: 'daytona' })).id;
    await h.waitFor(a.api, id, ['ready'], 60_000);
    fake.setState(await remoteOf(id), state);
    const done = await h.waitFor(a.api, id, ['terminated', 'failed'], 30_000);
    expect([state, done.end_reason]).toEqual([state, 'sandbox_lost']);
    const { rows } = await h.database.db.query<{ detail: { reason: string; detail?: string } }>(`SELECT detail FROM audit_events WHERE sandbox_id = $1 AND event = 'abnormal_exit'`, [id]);
    expect(rows.map((r) => r.detail.detail ?? '')).toEqual([expect.stringContaining(said)]);
  }
});
