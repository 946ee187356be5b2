/**
 * The janitor and Daytona (ADR 0019): an ended objective's Daytona sandboxes are found by their
 * labels and deleted, one whose record a crash lost included; another objective's stay. Against
 * the local fake of Daytona's API (real SDK) and the real Temporal test server (the objective's
 * liveness is asked of it).
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { afterAll, beforeAll, expect, inject, it } from 'vitest';
import { DAYTONA_DIR, DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import { createJanitorActivities, temporalHomeOf } from '../../activities/sandbox/janitor';
import { registerObjective, updateRegistry } from '../../activities/sandbox/registry';
import { FakeDaytona } from '../helpers/fake-daytona';
import { makeRepo, sandboxRequest, tempDir } from './helpers';

const fake = new FakeDaytona();
let connection: Connection;
let parent: string;

beforeAll(async () => {
  await fake.start();
  connection = await Connection.connect({ address: inject('temporalAddress') });
  parent = tempDir('daytona-janitor');
});
afterAll(async () => {
  await connection?.close();
  await fake.stop();
  if (parent) await fs.rm(parent, { recursive: true, force: true });
});

it("sweeps an ended objective's Daytona sandboxes by label, records and all; another objective's stay", async () => {
  const { repo } = makeRepo(parent);
  const registry = path.join(parent, 'repositories.json');
  const client = new Client({ connection });
  const home = await temporalHomeOf(client)();
  const provider = new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test' });
  const daytonaIdOf = async (root: string) => (JSON.parse(await fs.readFile(`${root}.json`, 'utf8')) as { daytonaId: string }).daytonaId;

  // An objective no Temporal server runs (ended), registered here long enough ago to be swept.
  const gone = 'ended-daytona-obj';
  await registerObjective(repo, gone, undefined, registry, home);
  await updateRegistry((r) => {
    r.repositories[repo]!.objectives[gone]!.addedAt = new Date(Date.now() - 10 * 60_000).toISOString();
  }, registry);
  const one = await provider.create(sandboxRequest(repo, 'one', { group: gone }));
  const two = await provider.create(sandboxRequest(repo, 'two', { group: gone }));
  const remotes = [await daytonaIdOf(one.root), await daytonaIdOf(two.root)];
  // A crash lost the second one's record: only its labels still tie it to the objective.
  await fs.rm(`${two.root}.json`);
  // Another objective's sandbox (not registered here, so never this janitor's to sweep).
  const other = await provider.create(sandboxRequest(repo, 'kept', { group: 'other-obj' }));
  const otherRemote = await daytonaIdOf(other.root);

  const acts = createJanitorActivities({ client, daytona: provider });
  const sweep = await acts.janitorSweepRepository({ repository: repo, registry });
  expect(sweep.errors).toEqual([]);
  const swept = sweep.objectives.find((o) => o.id === gone)!;
  expect(swept.liveness).toMatchObject({ state: 'ended' });
  expect(swept.removedWorktrees.sort()).toEqual([one.root, two.root].sort());
  for (const r of remotes) expect(fake.sandboxes.has(r)).toBe(false);
  expect(existsSync(path.join(repo, DAYTONA_DIR, gone))).toBe(false);
  expect(fake.sandboxes.has(otherRemote)).toBe(true);
  expect(existsSync(`${other.root}.json`)).toBe(true);
  await provider.destroy({ repository: repo, root: other.root });
});
