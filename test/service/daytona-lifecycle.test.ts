/**
 * The sandbox service on Daytona (`provider: daytona` profiles, ADR 0019) against the local fake of
 * Daytona's API (test/helpers/fake-daytona.ts), spoken to by the real SDK: the lifecycle every
 * provider passes (provider-suites.ts; idle suspend stops the Daytona sandbox, exec starts it,
 * DELETE deletes it), and the deadline. Real Postgres, Temporal, HTTP.
 */
import { promises as fs } from 'node:fs';
import { expect, it } from 'vitest';
import { defaultProviderFor } from '../../activities/service/providers';
import { FakeDaytona } from '../helpers/fake-daytona';
import { describeProviderLifecycle } from '../sandbox/provider-suites';

const fake = new FakeDaytona();
/** Root -> Daytona id, read from Slipway's record while it exists (DELETE removes it). */
const remotes = new Map<string, string>();
const daytonaId = async (root: string) => {
  if (!remotes.has(root)) remotes.set(root, (JSON.parse(await fs.readFile(`${root}.json`, 'utf8')) as { daytonaId: string }).daytonaId);
  return remotes.get(root)!;
};
const stateOf = (remote: string) => fake.sandboxes.get(remote)?.state ?? 'gone';

describeProviderLifecycle('daytona (fake)', {
  provider: 'daytona',
  before: async () => {
    await fake.start();
  },
  after: () => fake.stop(),
  providerFor: () => defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test' } }),
  state: async (root) => {
    const s = stateOf(await daytonaId(root));
    if (s === 'started') return 'running';
    if (s === 'stopped' || s === 'gone') return s;
    throw new Error(`Daytona sandbox of ${root} is ${s}`);
  },
  onReady: async (root) => {
    expect(fake.sandboxes.get(await daytonaId(root))!.labels).toMatchObject({ 'slipway.sandbox': expect.any(String) });
  },
  secret: () => fake.apiKey,
});
