/**
 * Batch merges (docs/adr/0031-batch-merges.md) on the real Temporal test server, real git and
 * script agents. The streams but the first wait in their quality gate until the first one's merge
 * has begun, and its post-merge gate waits until the test has seen the others queued behind it
 * (conditions, not times), so they are merged as one batch:
 * - a post-merge gate that fails only for two streams together: the batch is bisected, the
 *   culprit takes the normal post-merge-gate-failure path, every other stream lands;
 * - the worker killed with SIGKILL in the middle of a batch's gate: the retry undoes the
 *   unreported merges and makes them again, one merge commit per stream, an undisturbed run's tree.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult, ObjectiveStatus } from '../core/types';
import { objectiveFeedQuery, objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { waitFor } from './helpers/cli';
import { PLAN_BUILDER, writeObjective, type Plan } from './helpers/objective';
import { gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';

let worker: TestWorker;
// The streams held in their quality gate take an activity slot each: room for the first stream's work too.
const ACTIVITY_SLOTS = 8;
beforeAll(async () => {
  worker = await startTestWorker({ activityConcurrency: ACTIVITY_SLOTS });
});
afterAll(async () => {
  await worker?.stop();
});
const processes: WorkerProcess[] = [];
afterEach(() => {
  for (const w of processes.splice(0)) w.crash();
});

const builder = { provider: 'script', command: `node ${PLAN_BUILDER}` };
const file = (id: string, content = `module.exports = '${id}';\n`) => ({ [`out/${id}.js`]: content });
/** Stream ids of the integration branch's merge commits, oldest first. */
const mergesOn = (repo: string, id: string) =>
  [...gitIn(repo, 'log', '--first-parent', '--reverse', '--merges', '--format=%s', integrationBranch(id)).matchAll(/merge stream (\S+) into/g)].map((m) => m[1]);

/**
 * The held start: `first` merges alone (the others' quality gate waits for `sync/queue`), its
 * post-merge gate waits for `sync/release` (see `holdFirst`) until all others are queued behind it.
 */
async function mergeTheRestAsOneBatch(query: () => Promise<ObjectiveStatus>, first: string, sync: string) {
  await waitFor(async () => (await query()).streams.find((s) => s.id === first)?.phase === 'merging', `${first} to merge first`, 240_000);
  writeFileSync(path.join(sync, 'queue'), '');
  await waitFor(async () => (await query()).streams.every((s) => s.id === first || s.phase === 'merge_ready'), 'the other streams queued behind the first merge', 240_000);
  writeFileSync(path.join(sync, 'release'), '');
}
/** The quality gate of every stream but `first`: it waits until the test lets them queue. */
const queueGate = (first: string, sync: string) => ({ name: 'queue', command: `[ -f out/${first}.js ] || while [ ! -f ${sync}/queue ]; do sleep 0.1; done` });
/** Shell for a post-merge gate: waits for the release (a no-op once given). */
const holdFirst = (sync: string) => `while [ ! -f ${sync}/release ]; do sleep 0.1; done`;

describe('batch merges', () => {
  it('bisects a batch whose post-merge gate fails only for two streams together: the culprit goes round its fix loop, the others land', async () => {
    const sync = tempDir('slipway-batch-');
    const id = 'batch-bisect';
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const ids = ['a', 'b', 'c', 'd', 'e'];
    // b and d are each fine alone; together (both still "bad") they break the integration branch.
    const gate = `${holdFirst(sync)}; ! (grep -qs bad out/b.js && grep -qs bad out/d.js)`;
    const plan: Plan = Object.fromEntries(ids.map((s) => [s, [{ files: file(s, s === 'b' || s === 'd' ? `module.exports = 'bad ${s}';\n` : undefined) }, { files: file(s, `module.exports = 'good ${s}';\n`) }]]));
    const objective = writeObjective(
      { objective: 'five files', repository: repo, max_parallel_streams: 5, gates: [queueGate('a', sync)], post_merge_gates: [{ name: 'pair', command: gate }], agents: { builder }, streams: ids.map((s) => ({ id: s, task: `file ${s}` })) },
      plan,
    );
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(objective, { id })] });
    await mergeTheRestAsOneBatch(() => handle.query(objectiveStatusQuery), 'a', sync);
    const result = (await handle.result()) as ObjectiveResult;

    expect(result.outcome).toBe('completed');
    expect(pictureCheckout(repo)).toEqual(before);
    // Exactly one of b, d was the culprit: sent back once with the gate's failure, then landed fixed.
    const failures = result.ledger.filter((e) => e.kind === 'post_merge_gate_failure');
    expect(failures.map((e) => e.result)).toEqual(['retrying', 'recovered']);
    const culprit = failures[0].stream!;
    expect(['b', 'd']).toContain(culprit);
    for (const s of result.streams) expect(s.iterations).toBe(s.id === culprit ? 2 : 1);
    // One merge commit per stream, the culprit last; it landed in its fixed form.
    const merges = mergesOn(repo, id);
    expect([...merges].sort()).toEqual(ids);
    expect(merges.at(-1)).toBe(culprit);
    expect(gitIn(repo, 'show', `${integrationBranch(id)}:out/${culprit}.js`)).toContain('good');
    expect(merges[0]).toBe('a');
    // The batch b-e was tried whole, failed, and was bisected.
    const feed = (await handle.query(objectiveFeedQuery, 0)).events.map((e) => e.text);
    expect(feed.some((t) => /failed its post-merge gates and was reverted: bisecting into/.test(t))).toBe(true);
    const scheduled = ((await handle.fetchHistory()).events ?? []).flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
    expect(scheduled).toContain('mergeBatch');
  }, 400_000);

  it('a worker killed in the middle of a batch\'s post-merge gate: no stream merged twice, and the tree is an undisturbed run\'s', async () => {
    const sync = tempDir('slipway-batch-kill-');
    const runs = path.join(sync, 'runs');
    // Run 1 (alpha, alone) waits for the queue; run 2 (the batch of beta and gamma) hangs until the worker is killed under it.
    const hold = `echo run >> ${runs}; ${holdFirst(sync)}; if [ "$(wc -l < ${runs})" = 2 ]; then touch ${sync}/held; sleep 600; fi`;
    const ids = ['alpha', 'beta', 'gamma'];
    const run = async (id: string, gate: string, streamGates: Array<{ name: string; command: string }>, disturb?: (c: Client, worker: WorkerProcess) => Promise<void>) => {
      const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `${id}-${randomUUID().slice(0, 8)}`, SLIPWAY_ACTIVITY_CONCURRENCY: String(ACTIVITY_SLOTS) };
      const repo = makeDemoRepo();
      const before = pictureCheckout(repo);
      const objective = writeObjective(
        { objective: 'three files', repository: repo, max_parallel_streams: 3, gates: streamGates, post_merge_gates: [{ name: 'post', command: gate }], agents: { builder }, streams: ids.map((s) => ({ id: s, task: `file ${s}` })) },
        Object.fromEntries(ids.map((s) => [s, [{ files: file(s) }]])),
      );
      const c = new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
      const w = await startWorkerProcess(env);
      processes.push(w);
      const handle = await c.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(objective, { id })] });
      if (disturb) {
        await disturb(c, w);
        processes.push(await startWorkerProcess(env));
      }
      const result = (await handle.result()) as ObjectiveResult;
      expect(pictureCheckout(repo)).toEqual(before);
      const scheduled = ((await handle.fetchHistory()).events ?? []).flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
      return { repo, result, scheduled };
    };
    const [calm, crashed] = await Promise.all([
      run('batch-calm', 'true', []),
      run('batch-crash', hold, [queueGate('alpha', sync)], async (c, w) => {
        await mergeTheRestAsOneBatch(() => c.workflow.getHandle(objectiveWorkflowId('batch-crash')).query(objectiveStatusQuery), 'alpha', sync);
        await waitFor(async () => existsSync(path.join(sync, 'held')), "the batch's post-merge gate to run", 240_000);
        w.crash();
      }),
    ]);

    expect(calm.result.outcome).toBe('completed');
    expect(crashed.result.outcome).toBe('completed');
    expect(crashed.scheduled).toContain('mergeBatch');
    const merges = mergesOn(crashed.repo, 'batch-crash');
    expect(merges[0]).toBe('alpha');
    expect([...merges].sort()).toEqual(ids);
    const tree = (repo: string, id: string) => gitIn(repo, 'rev-parse', `${integrationBranch(id)}^{tree}`);
    expect(tree(crashed.repo, 'batch-crash')).toBe(tree(calm.repo, 'batch-calm'));
    // The first merge's gate, the batch's killed gate, and its retry on the new worker.
    expect(readFileSync(runs, 'utf8').trim().split('\n')).toHaveLength(3);
    // Nothing is left behind: the merger worktree is gone, only the checkout remains.
    expect(gitIn(crashed.repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
  }, 400_000);
});
