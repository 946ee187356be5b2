/**
 * `slipway cancel`: an objective with one stream merged and one blocked for guidance is
 * cancelled; its streams and sandboxes are cleaned up, the merged work stays on the integration
 * branch, and the objective ends with outcome `cancelled` (not failed, not a cancelled workflow
 * with its worktrees left on disk).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamSandboxId, streamSandboxWorkflowId, streamWorkflowId } from '../core/ids';
import { sandboxWorkflow } from '../workflows/sandbox';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { slipway, waitFor } from './helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

let worker: TestWorker;
let home: string;
beforeAll(async () => {
  home = tempDir('slipway-home-');
  process.env.SLIPWAY_HOME = home;
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
  await fs.rm(home, { recursive: true, force: true });
});

const worktrees = (repo: string) => gitIn(repo, 'worktree', 'list', '--porcelain').split('\n').filter((l) => l.startsWith('worktree ')).map((l) => l.slice(9));

describe('slipway cancel', () => {
  it('stops the streams, cleans up their sandboxes and ends cancelled with the merged work kept', async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const id = 'cancel-me';
    const file = writeObjective(
      {
        repository: repo,
        objective: 'one merges, one blocks',
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        max_fix_iterations: 0,
        on_exhausted: 'ask_human',
        gates: [{ name: 'test', command: 'node --test' }],
        streams: [
          { id: 'good', task: 'x' },
          { id: 'stuck', task: 'y' },
        ],
      },
      { good: [{ files: helperFiles('good') }], stuck: [{ files: helperFiles('stuck', '(x) => x', 'assert.strictEqual(1, 2)') }] },
    );
    const input = await loadObjectiveFile(file, { id });
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    await waitFor(async () => {
      const s = await handle.query(objectiveStatusQuery);
      const phase = (sid: string) => s.streams.find((v) => v.id === sid)?.phase;
      return phase('good') === 'merged' && phase('stuck') === 'blocked';
    }, 'good to merge and stuck to block', 120_000);
    expect(existsSync(path.join(repo, '.slipway/worktrees', id, 'stuck'))).toBe(true);

    const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue, SLIPWAY_HOME: home };
    const cancelled = await slipway(['cancel', id], env);
    expect(cancelled.code, cancelled.stderr).toBe(0);
    expect(cancelled.stdout).toContain(`${id}: cancelled; 1/2 streams merged (kept on ${integrationBranch(id)})`);

    const result = await handle.result();
    expect(result.outcome).toBe('cancelled');
    expect(result.phase).toBe('done');
    expect(result.mergeOrder).toEqual(['good']);
    expect(gitIn(repo, 'cat-file', '-t', `${integrationBranch(id)}:src/good.js`)).toBe('blob');
    // Every sandbox and the merger worktree are gone; the stream workflows have ended.
    expect(worktrees(repo)).toEqual([repo]);
    const stuck = await worker.client.workflow.getHandle(streamWorkflowId(id, 'stuck')).describe();
    expect(stuck.status.name).not.toBe('RUNNING');
    expect(pictureCheckout(repo)).toEqual(before);

    // Cancelling an objective that has ended is refused with exit 2.
    const again = await slipway(['cancel', id], env);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain(`objective "${id}" is not running`);
  });

  it('a stream that ends before it hears its merge decision does not fail the objective', async () => {
    const repo = makeDemoRepo();
    const id = 'gone-before-decision';
    const sync = tempDir('slipway-sync-');
    // The first merge's post-merge gate holds until the test says go.
    const hold = `if [ ! -f ${sync}/held ]; then touch ${sync}/held; while [ ! -f ${sync}/go ]; do sleep 0.1; done; fi`;
    const file = writeObjective(
      {
        repository: repo,
        objective: 'two streams',
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        gates: [{ name: 'test', command: 'node --test' }],
        post_merge_gates: [{ name: 'hold', command: hold }],
        streams: [
          { id: 'a', task: 'x' },
          { id: 'b', task: 'y' },
        ],
      },
      { a: [{ files: helperFiles('a') }], b: [{ files: helperFiles('b') }] },
    );
    const input = await loadObjectiveFile(file, { id });
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    await waitFor(async () => existsSync(path.join(sync, 'held')), 'the first merge to reach its post-merge gate', 120_000);
    const merging = (await handle.query(objectiveStatusQuery)).streams.find((v) => v.phase === 'merging')!.id;
    // That stream is cancelled by hand while the queue merges it.
    const stream = worker.client.workflow.getHandle(streamWorkflowId(id, merging));
    await stream.cancel();
    await waitFor(async () => (await stream.describe()).status.name !== 'RUNNING', 'the stream to end', 60_000);
    await fs.writeFile(path.join(sync, 'go'), '');

    const result = await handle.result();
    expect(result.error).toBeUndefined();
    expect(result.outcome).not.toBe('failed');
    expect([...result.mergeOrder].sort()).toEqual(['a', 'b']);
    expect(gitIn(repo, 'cat-file', '-t', `${integrationBranch(id)}:src/b.js`)).toBe('blob');
  });

  it('a sandbox that cannot be cleaned up leaves a merged stream merged and the objective completed', async () => {
    const repo = makeDemoRepo();
    const id = 'cleanup-fails';
    const sync = tempDir('slipway-sync-');
    const hold = `if [ ! -f ${sync}/held ]; then touch ${sync}/held; while [ ! -f ${sync}/go ]; do sleep 0.1; done; fi`;
    const file = writeObjective(
      {
        repository: repo,
        objective: 'one stream',
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        gates: [{ name: 'test', command: 'node --test' }],
        post_merge_gates: [{ name: 'hold', command: hold }],
        streams: [{ id: 'a', task: 'x' }],
      },
      { a: [{ files: helperFiles('a') }] },
    );
    const input = await loadObjectiveFile(file, { id });
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    await waitFor(async () => existsSync(path.join(sync, 'held')), 'the merge to reach its post-merge gate', 120_000);
    // The stream's worktree can no longer be moved or removed (immutable, even for root).
    const worktree = path.join(repo, '.slipway/worktrees', id, 'a');
    execFileSync('chattr', ['+i', worktree]);
    try {
      await fs.writeFile(path.join(sync, 'go'), '');
      const result = await handle.result();
      expect(result.outcome).toBe('completed');
      expect(result.streams.find((v) => v.id === 'a')?.phase).toBe('merged');
      expect(result.error).toBeUndefined();
    } finally {
      execFileSync('chattr', ['-i', worktree]);
    }
  });

  it('a stream sandbox whose owner is gone by the time it is ready removes its worktree instead of leaking it', async () => {
    const repo = makeDemoRepo();
    const sandboxId = streamSandboxId('ownerless', 'lost');
    const result = await worker.client.workflow.execute(sandboxWorkflow, {
      taskQueue: worker.taskQueue,
      workflowId: streamSandboxWorkflowId(sandboxId),
      args: [{ sandboxId, provider: 'local', repository: repo, objectiveId: 'ownerless', name: 'lost', branch: 'slipway/ownerless/lost', base: 'main', ownerWorkflowId: 'stream:ownerless:never-started' }],
    });
    expect(result).toMatchObject({ state: 'terminated' });
    expect(existsSync(path.join(repo, '.slipway/worktrees/ownerless/lost'))).toBe(false);
    expect(worktrees(repo)).toEqual([repo]);
  });
});
