/**
 * Durability: a worker killed with SIGKILL in the middle of a run (with every process it
 * started), then a new worker. The objective must end exactly as an undisturbed run does: same
 * outcome, same integration tree, one merge commit per stream. A blocked stream stays blocked,
 * with its ledger, across the restart.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { streamStatusQuery } from '../workflows/stream';
import { slipway, waitFor } from './helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective, type Plan } from './helpers/objective';
import { gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';

const workers: WorkerProcess[] = [];
afterEach(async () => {
  for (const w of workers.splice(0)) {
    w.crash();
  }
});

async function client(): Promise<Client> {
  return new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
}

const STREAMS = ['alpha', 'beta', 'gamma'];

/** `gates: false`: none at all, so the merger is the integration branch alone, with no worktree (ADR 0033). */
function objectiveSpec(repo: string, gates = true) {
  return {
    objective: 'three slow helpers',
    repository: repo,
    gates: gates ? [{ name: 'test', command: 'node --test' }] : [],
    ...(gates ? {} : { post_merge_gates: [] }),
    agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
    streams: STREAMS.map((id) => ({ id, task: `helper ${id}` })),
  };
}
const plan: Plan = Object.fromEntries(STREAMS.map((id) => [id, [{ files: helperFiles(id), sleep_ms: 1500 }]]));

/** `deadline`: when the result must be in (then the run explains itself), before the test's own timeout. */
async function runWith(workerEnv: NodeJS.ProcessEnv, id: string, deadline: number, disturb?: (c: Client) => Promise<void>, gates = true) {
  const repo = makeDemoRepo();
  const before = pictureCheckout(repo);
  const file = writeObjective(objectiveSpec(repo, gates), plan);
  const c = await client();
  workers.push(await startWorkerProcess(workerEnv));
  const handle = await c.workflow.start(objectiveWorkflow, {
    taskQueue: workerEnv.SLIPWAY_TASK_QUEUE!,
    workflowId: objectiveWorkflowId(id),
    args: [await loadObjectiveFile(file, { id })],
  });
  if (disturb) await disturb(c);
  const result = await resultOrExplain(c, id, Math.max(deadline - Date.now(), 1_000));
  expect(pictureCheckout(repo)).toEqual(before);
  return { repo, result };
}

/**
 * The objective's result, or, when it has not come within `ms`, an error saying where the run
 * stands (each workflow's pending activities with their last failure, the workers' output), so a
 * hang in CI explains itself instead of ending as a bare test timeout.
 */
async function resultOrExplain(c: Client, id: string, ms: number): Promise<ObjectiveResult> {
  const handle = c.workflow.getHandle(objectiveWorkflowId(id));
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((r) => (timer = setTimeout(() => r('late'), ms)));
  const first = await Promise.race([handle.result(), late]).finally(() => clearTimeout(timer));
  if (first !== 'late') return first as ObjectiveResult;
  const lines: string[] = [];
  const describe = async (h: ReturnType<Client['workflow']['getHandle']>) => {
    const d = await h.describe().catch((e: Error) => e);
    if (d instanceof Error) return lines.push(`${h.workflowId}: ${d.message}`);
    lines.push(`${h.workflowId}: ${d.status.name}`);
    for (const a of d.raw.pendingActivities ?? []) {
      lines.push(`  activity ${a.activityType?.name} attempt ${a.attempt} ${temporal.api.enums.v1.PendingActivityState[a.state ?? 0]} last failure: ${a.lastFailure?.message ?? '-'}`);
    }
    for (const ch of d.raw.pendingChildren ?? []) lines.push(`  child ${ch.workflowId}`);
  };
  await describe(handle);
  const status = await handle.query(objectiveStatusQuery).catch((e: Error) => e);
  lines.push(status instanceof Error ? `status: ${status.message}` : `status: ${JSON.stringify(status.streams.map((s) => [s.id, s.phase]))}`);
  for (const s of STREAMS) await describe(c.workflow.getHandle(streamWorkflowId(id, s)));
  for (const w of workers) lines.push(`--- worker ${w.child.pid}${w.child.exitCode === null ? '' : ' (ended)'}:`, w.output().slice(-4000));
  throw new Error(`objective ${id} had no result after ${ms} ms:\n${lines.join('\n')}`);
}

const KILLED_MID_RUN_MS = 240_000;

describe('restarts', () => {
  const killedMidRun = async (gates: boolean) => {
    const env = () => ({ TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `restart-${randomUUID().slice(0, 8)}` });
    const [calmId, crashId] = gates ? ['restart-calm', 'restart-crash'] : ['restart-calm-bare', 'restart-crash-bare'];
    // Both runs explain themselves 20 s before the test's timeout (KILLED_MID_RUN_MS).
    const deadline = Date.now() + KILLED_MID_RUN_MS - 20_000;
    const calm = await runWith(env(), calmId, deadline, undefined, gates);

    const crashEnv = env();
    const crashed = await runWith(
      crashEnv,
      crashId,
      deadline,
      async (c) => {
        // Kill while builders are running and at least one stream is past its first merge.
        await waitFor(async () => {
          const s = await c.workflow.getHandle(objectiveWorkflowId(crashId)).query(objectiveStatusQuery);
          return s.streams.some((x) => x.phase === 'building') ? s : undefined;
        }, 'a builder to be running');
        workers.at(-1)!.crash();
        await new Promise((r) => setTimeout(r, 500));
        workers.push(await startWorkerProcess(crashEnv));
      },
      gates,
    );

    expect(crashed.result.outcome).toBe('completed');
    expect(crashed.result.outcome).toBe(calm.result.outcome);
    const tree = (repo: string, id: string) => gitIn(repo, 'rev-parse', `${integrationBranch(id)}^{tree}`);
    expect(tree(crashed.repo, crashId)).toBe(tree(calm.repo, calmId));
    const merges = gitIn(crashed.repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(crashId)).split('\n');
    expect(merges).toHaveLength(3);
    expect(new Set(merges.map((m) => m.match(/merge stream (\S+)/)![1]))).toEqual(new Set(['alpha', 'beta', 'gamma']));
    // No worktree or branch was created twice, and nothing is left behind.
    expect(gitIn(crashed.repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
    expect(gitIn(crashed.repo, 'branch', '--list', `slipway/${crashId}/*`).split('\n')).toHaveLength(4);
    // Without gates the merger was the integration branch alone: no merger worktree was ever asked for.
    const history = await (await client()).workflow.getHandle(objectiveWorkflowId(crashId)).fetchHistory();
    const activities = (history.events ?? []).map((e) => e.activityTaskScheduledEventAttributes?.activityType?.name).filter(Boolean);
    expect(activities.includes('prepareMerger')).toBe(gates);
    // Nothing to remove without one: the objective ends without finishObjective, reporting the head its merges left (ADR 0037).
    expect(activities.includes('finishObjective')).toBe(gates);
    expect(crashed.result.integrationHead).toBe(gitIn(crashed.repo, 'rev-parse', integrationBranch(crashId)));
    expect(calm.result.integrationHead).toBe(gitIn(calm.repo, 'rev-parse', integrationBranch(calmId)));
  };

  it('a worker killed mid-run: the objective ends as an undisturbed run does, without duplicate merges', () => killedMidRun(true), KILLED_MID_RUN_MS);

  it('the same without gates, where the merger has no worktree and merges are plumbing on the integration branch (ADR 0033)', () => killedMidRun(false), KILLED_MID_RUN_MS);

  it('a worker killed in the middle of a post-merge gate (merge and gates in one activity): the retry finds the merge, runs the gates again, and the tree is an undisturbed run\'s', async () => {
    const sync = tempDir('slipway-sync-');
    // Every run of the post-merge gate is logged; the first one hangs until the worker is killed under it.
    const hold = `echo run >> ${sync}/runs; if [ ! -f ${sync}/held ]; then touch ${sync}/held; sleep 600; fi`;
    const run = async (id: string, gate: string, disturb?: (worker: WorkerProcess) => Promise<void>) => {
      const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `${id}-${randomUUID().slice(0, 8)}` };
      const repo = makeDemoRepo();
      const before = pictureCheckout(repo);
      const file = writeObjective(
        {
          objective: 'two helpers',
          repository: repo,
          gates: [{ name: 'test', command: 'node --test' }],
          post_merge_gates: [{ name: 'post', command: gate }],
          agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
          streams: ['alpha', 'beta'].map((s) => ({ id: s, task: `helper ${s}` })),
        },
        { alpha: [{ files: helperFiles('alpha') }], beta: [{ files: helperFiles('beta') }] },
      );
      const c = await client();
      const worker = await startWorkerProcess(env);
      workers.push(worker);
      const handle = await c.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });
      if (disturb) {
        await disturb(worker);
        workers.push(await startWorkerProcess(env));
      }
      const result = (await handle.result()) as ObjectiveResult;
      expect(pictureCheckout(repo)).toEqual(before);
      const scheduled = ((await handle.fetchHistory()).events ?? []).flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
      return { repo, result, scheduled };
    };
    const [calm, crashed] = await Promise.all([
      run('gate-calm', 'true'),
      run('gate-crash', hold, async (worker) => {
        await waitFor(async () => existsSync(path.join(sync, 'held')), 'the first post-merge gate to run', 180_000);
        worker.crash();
      }),
    ]);

    expect(crashed.result.outcome).toBe('completed');
    expect(calm.result.outcome).toBe('completed');
    // The merges took the one-activity path (one stream at a time, or both in one batch when both
    // were waiting: ADR 0031), and no merge was made twice.
    const mergeActivities = crashed.scheduled.filter((a) => a === 'mergeWithGates' || a === 'mergeBatch');
    expect(mergeActivities.length).toBeGreaterThan(0);
    expect(crashed.scheduled).not.toContain('mergeStream');
    const merges = gitIn(crashed.repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch('gate-crash')).split('\n');
    expect(merges).toHaveLength(2);
    expect(new Set(merges.map((m) => m.match(/merge stream (\S+)/)![1]))).toEqual(new Set(['alpha', 'beta']));
    const tree = (repo: string, id: string) => gitIn(repo, 'rev-parse', `${integrationBranch(id)}^{tree}`);
    expect(tree(crashed.repo, 'gate-crash')).toBe(tree(calm.repo, 'gate-calm'));
    // The killed gate ran again on the new worker: one run per merge activity (a retry is the same
    // scheduled activity) plus the hung one.
    expect(readFileSync(path.join(sync, 'runs'), 'utf8').trim().split('\n')).toHaveLength(mergeActivities.length + 1);
  }, 300_000);

  it('a blocked stream stays blocked with its ledger across a worker restart, then takes guidance', async () => {
    const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `blocked-${randomUUID().slice(0, 8)}` };
    const repo = makeDemoRepo();
    const file = writeObjective(
      {
        objective: 'blocked across restart',
        repository: repo,
        max_fix_iterations: 0,
        gates: [{ name: 'test', command: 'node --test' }],
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: [{ id: 'stuck', task: 'needs help' }],
      },
      { stuck: [{ files: helperFiles('stuck', '(x) => x', 'assert.strictEqual(1, 2)') }], 'stuck:guided': [{ files: helperFiles('stuck') }] },
    );
    const c = await client();
    workers.push(await startWorkerProcess(env));
    const id = 'blocked-restart';
    const handle = await c.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });
    const stream = c.workflow.getHandle(streamWorkflowId(id, 'stuck'));
    const before = await waitFor(async () => {
      const s = await stream.query(streamStatusQuery);
      return s.phase === 'blocked' ? s : undefined;
    }, 'the stream to block');

    workers.at(-1)!.crash();
    workers.push(await startWorkerProcess(env));
    const after = await stream.query(streamStatusQuery);
    expect(after.phase).toBe('blocked');
    expect(after.blocked).toEqual(before.blocked);
    expect(after.ledger).toEqual(before.ledger);

    const send = await slipway(['mail', 'send', 'builder-stuck', 'Hint', 'Return x.', '--objective', id], env);
    expect(send.code).toBe(0);
    expect(((await handle.result()) as ObjectiveResult).outcome).toBe('completed');
  }, 240_000);
});
