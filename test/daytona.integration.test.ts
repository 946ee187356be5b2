/**
 * An objective end to end with `sandbox: { provider: daytona }` (ADR 0019) against the local
 * fake of Daytona's HTTP API: the worker's router makes the Daytona provider from its
 * environment (DAYTONA_API_KEY, DAYTONA_API_URL), every stream builds, runs its gates and is
 * reviewed in a Daytona sandbox started from a git bundle, its work comes back as a bundle, and
 * the merge queue merges it. Real Temporal, real git, the real SDK over HTTP.
 */
import { randomUUID } from 'node:crypto';
import { cpSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';
import { FakeDaytona } from './helpers/fake-daytona';
import { waitFor } from './helpers/cli';
import { DEMO_DIR, gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

function daytonaObjective(repo: string): string {
  const dir = tempDir('slipway-daytona-objective-');
  cpSync(path.join(DEMO_DIR, 'agents'), path.join(dir, 'agents'), { recursive: true });
  const file = path.join(dir, 'objective.yaml');
  writeFileSync(
    file,
    stringify({
      objective: 'Add greet, sum and clamp helpers to the toolkit, each with a test',
      repository: repo,
      base_branch: 'main',
      max_parallel_streams: 3,
      max_fix_iterations: 2,
      gates: [{ name: 'test', command: 'node --test', timeout_seconds: 120 }],
      agents: {
        builder: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/builder.mjs"' },
        reviewer: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/reviewer.mjs"' },
      },
      streams: [
        { id: 'greet', task: 'Add greet(name) returning "Hello, <name>!"' },
        { id: 'sum', task: 'Add sum(values) adding up an array of numbers' },
        { id: 'clamp', task: 'Add clamp(value, low, high) keeping a number within bounds' },
      ],
      sandbox: { provider: 'daytona' },
    }),
  );
  return file;
}

describe('objectives on daytona (fake)', () => {
  const fake = new FakeDaytona();
  let worker: TestWorker;
  const saved: Record<string, string | undefined> = {};
  beforeAll(async () => {
    await fake.start();
    for (const [k, v] of Object.entries(fake.env())) {
      saved[k] = process.env[k];
      process.env[k] = v;
    }
    worker = await startTestWorker();
  });
  afterAll(async () => {
    await worker?.stop();
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await fake.stop();
  });

  it('builds three streams in Daytona sandboxes, fixes a gate failure, merges all, deletes the sandboxes and leaves the checkout untouched', async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const id = `daytona-${randomUUID().slice(0, 6)}`;
    const input = await loadObjectiveFile(daytonaObjective(repo), { id });
    expect(input.sandbox?.provider).toBe('daytona');
    // No credential in the workflow input.
    expect(JSON.stringify(input)).not.toContain(fake.apiKey);
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    const ofObjective = () => [...fake.sandboxes.values()].filter((s) => s.labels['slipway.group'] === id);
    await waitFor(async () => ofObjective().length > 0, 'a stream sandbox in Daytona');
    const result = (await handle.result()) as ObjectiveResult;

    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(['clamp', 'greet', 'sum']);
    expect(result.streams.find((s) => s.id === 'clamp')!.iterations).toBe(2);
    const branch = integrationBranch(id);
    for (const name of ['greet', 'sum', 'clamp']) expect(gitIn(repo, 'cat-file', '-t', `${branch}:src/${name}.js`)).toBe('blob');
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
    expect(ofObjective()).toEqual([]);
    expect(pictureCheckout(repo)).toEqual(before);
    const history = JSON.stringify(await handle.fetchHistory());
    expect(history).not.toContain(fake.apiKey);
    gitIn(repo, 'fsck', '--strict', '--no-dangling');
  }, 300_000);
});
