/**
 * `warm_pool` with `provider: podman` (ADR 0025): an objective's stream claims a running
 * container from the container pool instead of `podman run`, and the pool refills in the
 * background for the next objective. Real Temporal, real git, real podman, the locally built
 * sandbox image (scripts/setup.sh).
 */
import { randomUUID } from 'node:crypto';
import { promises as fs, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { CONTAINERS_DIR, defaultSandboxImage } from '../activities/sandbox/container';
import { containerPoolEntries, drainContainerPool } from '../activities/sandbox/container-pool';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';
import { waitFor } from './helpers/cli';
import { gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { podmanOk } from './sandbox/helpers';
import { startTestWorker, type TestWorker } from './helpers/temporal';

describe('objectives with sandbox: { provider: podman, warm_pool }', () => {
  let worker: TestWorker;
  const repo = makeDemoRepo();
  const containers = path.join(repo, CONTAINERS_DIR);
  const objectives = tempDir('slipway-pool-objectives-');
  beforeAll(async () => {
    worker = await startTestWorker();
  });
  afterAll(async () => {
    await worker?.stop();
    await drainContainerPool(containers).catch(() => undefined);
  });

  const run = async (name: string): Promise<{ id: string; result: ObjectiveResult }> => {
    const id = `${name}-${randomUUID().slice(0, 6)}`;
    // Objectives of one folder (as .slipway/objectives/): containers bind that folder read-only,
    // and the pool is per settings, so they share the pool.
    const file = path.join(objectives, `${name}.yaml`);
    writeFileSync(file, stringify({
      objective: `warm containers ${name}`,
      repository: repo,
      base_branch: 'main',
      sandbox: { provider: 'podman', network: false, warm_pool: 2 },
      agents: { builder: { provider: 'script', command: `echo "module.exports = 1;" > ${name}.js` } },
      streams: [{ id: 'one', task: 'x' }],
    }));
    const input = await loadObjectiveFile(file, { id });
    expect(input.sandbox).toMatchObject({ provider: 'podman', warmPool: 2 });
    const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    return { id, result };
  };

  it('has the sandbox image (never skipped: run scripts/setup.sh)', () => {
    expect(defaultSandboxImage(), 'no sandbox image: run `npm run setup` (scripts/setup.sh builds it)').toBeTruthy();
  });

  it('the first objective fills the pool; the next one claims a pooled container for its stream', async () => {
    const before = pictureCheckout(repo);
    const first = await run('first');
    expect(first.result.outcome).toBe('completed');
    // The create that found the pool empty filled it in the background: two running containers.
    const entries = await waitFor(async () => {
      const found = await containerPoolEntries(containers);
      return found.length >= 2 ? found : undefined;
    }, 'two pooled containers', 180_000);
    for (const e of entries) expect(podmanOk('inspect', '--type', 'container', '--format', '{{.State.Status}}', e.container)).toBe(true);

    const second = await run('second');
    expect(second.result.outcome).toBe('completed');
    expect(gitIn(repo, 'cat-file', '-t', `${integrationBranch(second.id)}:second.js`)).toBe('blob');
    // The stream took one of those containers: claimed (renamed to the sandbox's), then removed with the sandbox.
    const left = (await containerPoolEntries(containers)).map((e) => e.id);
    const claimed = entries.filter((e) => !left.includes(e.id));
    expect(claimed.length).toBeGreaterThanOrEqual(1);
    for (const e of claimed) expect(podmanOk('inspect', '--type', 'container', '--format', '{{.ID}}', e.container)).toBe(false);
    // The merger stays a plain worktree: no pool of worktrees was made for a container objective.
    expect((await fs.readdir(path.join(repo, '.slipway/pool')).catch(() => [] as string[])).filter((n) => n.endsWith('.ready'))).toEqual([]);
    expect(pictureCheckout(repo)).toEqual(before);
  }, 600_000);
});
