/**
 * An objective end to end with `sandbox: { provider: daytona }` (ADR 0019) against the local
 * fake of Daytona's HTTP API: the worker's router makes the Daytona provider from its
 * environment (DAYTONA_API_KEY, DAYTONA_API_URL), every stream builds, runs its gates and is
 * reviewed in a Daytona sandbox started from a git bundle, its work comes back as a bundle, and
 * the merge queue merges it (provider-suites.ts). The key is in neither the input nor the
 * history. Real Temporal, real git, the real SDK over HTTP.
 */
import { FakeDaytona } from './helpers/fake-daytona';
import { describeProviderObjective } from './sandbox/provider-suites';

const fake = new FakeDaytona();

describeProviderObjective('daytona (fake)', {
  sandbox: { provider: 'daytona' },
  noun: 'Daytona sandboxes',
  before: async () => {
    await fake.start();
    return fake.env();
  },
  after: () => fake.stop(),
  sandboxesOf: (objectiveId) => [...fake.sandboxes.entries()].filter(([, s]) => s.labels['slipway.group'] === objectiveId).map(([id]) => id),
  secret: () => fake.apiKey,
});
