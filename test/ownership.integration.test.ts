/**
 * Ownership and routing across workers (docs/adr/0013-worker-ownership.md): two worker processes
 * with their own worker ids and their own SLIPWAY_HOMEs, as if on two hosts, serve one task queue.
 * Every activity on a sandbox must run on the queue of the worker that created it (read from the
 * histories: ActivityTaskScheduled's task queue and ActivityTaskStarted's worker identity), and a
 * worker killed for good has its streams recreated on the other.
 */
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { loadObjectiveFile } from '../config/objective-file';
import { agentTaskQueue, integrationBranch, objectiveWorkflowId, ownerTaskQueue, streamWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { WORKER_ID_FILE } from '../lib/worker-id';
import { objectiveWorkflow } from '../workflows/objective';
import { sandboxStateQuery } from '../workflows/sandbox';
import { waitFor } from './helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective, type Plan } from './helpers/objective';
import { gitIn, makeDemoRepo, tempDir } from './helpers/repo';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';

const workers: WorkerProcess[] = [];
afterEach(() => {
  for (const w of workers.splice(0)) w.crash();
});

const STREAMS = ['alpha', 'beta', 'gamma', 'delta'];

async function client(): Promise<Client> {
  return new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
}

interface ActivityEvent {
  workflowId: string;
  type: string;
  queue: string;
  /** The identity of the worker that started it (workers/worker.ts puts the worker id last). */
  startedBy?: string;
}

/** Every activity a workflow (all its runs) scheduled, with its queue and who started it. */
async function activitiesOf(c: Client, workflowId: string): Promise<ActivityEvent[]> {
  const out: ActivityEvent[] = [];
  let runId: string | undefined = (await c.workflow.getHandle(workflowId).describe()).runId;
  while (runId) {
    const history = await c.workflow.getHandle(workflowId, runId).fetchHistory();
    const byId = new Map<string, ActivityEvent>();
    for (const e of history.events ?? []) {
      const scheduled = e.activityTaskScheduledEventAttributes;
      if (scheduled) {
        const a = { workflowId, type: scheduled.activityType!.name!, queue: scheduled.taskQueue!.name! };
        byId.set(String(e.eventId), a);
        out.push(a);
      }
      const started = e.activityTaskStartedEventAttributes;
      if (started) byId.get(String(started.scheduledEventId))!.startedBy = started.identity ?? undefined;
    }
    runId = history.events?.[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId || undefined;
  }
  return out;
}

/** The worker id an owner-routed queue belongs to, or undefined for the shared queues. */
function ownerOfQueue(queue: string, taskQueue: string): string | undefined {
  const m = queue.match(new RegExp(`^${taskQueue}@(.+?)(-agents)?$`));
  return m?.[1];
}

function objectiveSpec(repo: string) {
  return {
    objective: 'four helpers on two workers',
    repository: repo,
    max_parallel_streams: 4,
    gates: [{ name: 'test', command: 'node --test' }],
    agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
    streams: STREAMS.map((id) => ({ id, task: `helper ${id}` })),
  };
}

async function twoWorkers(taskQueue: string, extra: NodeJS.ProcessEnv = {}) {
  const homes = [tempDir('slipway-home-a-'), tempDir('slipway-home-b-')];
  // One id given, one kept under its home (lib/worker-id.ts): both are how a host gets its id.
  const envs = [
    { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: taskQueue, SLIPWAY_HOME: homes[0], SLIPWAY_WORKER_ID: 'host-a', ...extra },
    { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: taskQueue, SLIPWAY_HOME: homes[1], ...extra },
  ];
  const procs = await Promise.all(envs.map((env) => startWorkerProcess(env)));
  workers.push(...procs);
  const ids = ['host-a', readFileSync(path.join(homes[1], WORKER_ID_FILE), 'utf8').trim()];
  expect(ids[1]).toMatch(/^[A-Za-z0-9][A-Za-z0-9._-]*$/);
  expect(ids[1]).not.toBe(ids[0]);
  expect(procs[1].output()).toContain(`as worker ${ids[1]} `);
  return { procs, ids };
}

/**
 * Checks every activity of every sandbox (its sandbox workflow and its stream's runs) and of the
 * merger: the owner recorded at creation is the queue each later activity was scheduled on and
 * the worker that started it. Returns the owner of each stream's (last) sandbox.
 */
async function expectOwnerRouting(c: Client, objectiveId: string, taskQueue: string) {
  const objective = await activitiesOf(c, objectiveWorkflowId(objectiveId));
  // prepareObjective is a local activity (ADR 0034): the worker that ran it, the objective's own,
  // holds the merger; the merger's activities show which one that is.
  expect(objective.map((a) => a.type)).not.toContain('prepareObjective');
  const merger = objective;
  const make = merger.find((a) => a.type === 'prepareMerger')!;
  const mergerOwner = ownerOfQueue(make.queue, taskQueue)!;
  expect(mergerOwner).toBeDefined();
  // A lone merge or a batch of the streams waiting together (ADR 0031): both on the merger's owner.
  expect(merger.some((a) => a.type === 'mergeWithGates' || a.type === 'mergeBatch')).toBe(true);
  for (const a of merger) {
    expect(a.queue, `${a.type} of the objective`).toBe(ownerTaskQueue(taskQueue, mergerOwner));
    if (a.startedBy) expect(a.startedBy.endsWith(`/${mergerOwner}`), `${a.type} started by ${a.startedBy}`).toBe(true);
  }

  const owners: Record<string, string> = {};
  for (const stream of STREAMS) {
    // The stream creates, uses and destroys its sandbox itself (ADR 0032).
    const all = await activitiesOf(c, streamWorkflowId(objectiveId, stream));
    const create = all.find((a) => a.type === 'createSandbox')!;
    // Creation goes to any worker: the one that takes it holds the sandbox from then on.
    expect(create.queue).toBe(taskQueue);
    const owner = create.startedBy!.split('/').at(-1)!;
    owners[stream] = owner;
    const later = all.filter((a) => a !== create);
    // The work is committed by the agent run and the passing gates themselves (ADR 0034): no commitWork.
    expect(later.map((a) => a.type)).toEqual(expect.arrayContaining(['runAgent', 'runGates', 'destroySandbox']));
    for (const a of later) {
      const expected = a.type === 'runAgent' ? agentTaskQueue(ownerTaskQueue(taskQueue, owner)) : ownerTaskQueue(taskQueue, owner);
      expect(a.queue, `${a.type} of ${stream}`).toBe(expected);
      expect(a.startedBy?.endsWith(`/${owner}`), `${a.type} of ${stream} started by ${a.startedBy}`).toBe(true);
    }
  }
  return { mergerOwner, owners };
}

describe('sandboxes owned by workers', () => {
  it('two workers, one objective of four streams: every activity of a sandbox runs on its owner', async () => {
    const taskQueue = `own-${randomUUID().slice(0, 8)}`;
    const { ids } = await twoWorkers(taskQueue);
    const repo = makeDemoRepo();
    const plan: Plan = Object.fromEntries(STREAMS.map((id) => [id, [{ files: helperFiles(id), sleep_ms: 300 }]]));
    const file = writeObjective(objectiveSpec(repo), plan);
    const id = `own-${randomUUID().slice(0, 6)}`;
    const c = await client();
    const handle = await c.workflow.start(objectiveWorkflow, { taskQueue, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder.sort()).toEqual([...STREAMS].sort());
    for (const s of STREAMS) expect(gitIn(repo, 'show', `${integrationBranch(id)}:src/${s}.js`)).toContain(s);

    const { mergerOwner, owners } = await expectOwnerRouting(c, id, taskQueue);
    expect(ids).toContain(mergerOwner);
    for (const owner of Object.values(owners)) expect(ids).toContain(owner);
  }, 300_000);

  it('a worker killed for good: its streams are recreated on the other and the objective completes the same', async () => {
    const taskQueue = `gone-${randomUUID().slice(0, 8)}`;
    // One activity at a time per worker, so sandbox creations go to both (the poller that waits longest gets the next task).
    const { procs, ids } = await twoWorkers(taskQueue, { SLIPWAY_ACTIVITY_CONCURRENCY: '1' });
    const repo = makeDemoRepo();
    const plan: Plan = Object.fromEntries(STREAMS.map((id) => [id, [{ files: helperFiles(id), sleep_ms: 8000 }]]));
    const file = writeObjective(objectiveSpec(repo), plan);
    const id = `gone-${randomUUID().slice(0, 6)}`;
    const c = await client();
    const input = { ...(await loadObjectiveFile(file, { id })), ownerGraceSeconds: 10 };
    const handle = await c.workflow.start(objectiveWorkflow, { taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });

    // Every sandbox is ready and the repository's worker is known; the other worker is the victim.
    const placed = await waitFor(async () => {
      // prepareObjective is a local activity (ADR 0034): the merger's own activity names its owner.
      const make = (await activitiesOf(c, objectiveWorkflowId(id))).find((a) => a.type === 'prepareMerger');
      const mergerOwner = make ? ownerOfQueue(make.queue, taskQueue) : undefined;
      if (!mergerOwner) return undefined;
      const owners: Record<string, string> = {};
      for (const s of STREAMS) {
        const st = await c.workflow
          .getHandle(streamWorkflowId(id, s))
          .query(sandboxStateQuery)
          .catch(() => undefined);
        if (st?.state !== 'ready' || !st.info?.owner) return undefined;
        owners[s] = st.info.owner;
      }
      return { mergerOwner, owners };
    }, 'every sandbox to be ready');
    const victim = ids.find((w) => w !== placed.mergerOwner)!;
    const survivor = placed.mergerOwner;
    const victimStreams = STREAMS.filter((s) => placed.owners[s] === victim);
    expect(victimStreams.length, `sandboxes: ${JSON.stringify(placed.owners)}`).toBeGreaterThan(0);

    procs[ids.indexOf(victim)].crash();
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder.sort()).toEqual([...STREAMS].sort());
    for (const s of STREAMS) expect(gitIn(repo, 'show', `${integrationBranch(id)}:src/${s}.js`)).toBe(helperFiles(s)[`src/${s}.js`]!.trim());
    const merges = gitIn(repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(id)).split('\n');
    expect(merges).toHaveLength(STREAMS.length);

    for (const s of STREAMS) {
      const stream = await activitiesOf(c, streamWorkflowId(id, s));
      const creates = stream.filter((a) => a.type === 'createSandbox');
      const last = await c.workflow.getHandle(streamWorkflowId(id, s)).query(sandboxStateQuery);
      if (!victimStreams.includes(s)) {
        expect(creates, `${s} kept its sandbox`).toHaveLength(1);
        expect(last.info?.owner).toBe(placed.owners[s]);
        continue;
      }
      // Recreated on the survivor, which ran everything after; the ledger says why.
      expect(creates).toHaveLength(2);
      expect(last.info?.owner).toBe(survivor);
      for (const a of stream) {
        // Owner checks and creates go to the shared queue (a create is taken by whichever worker lives).
        if (a.type === 'ownerAlive' || a.type === 'createSandbox') expect(a.queue).toBe(taskQueue);
        else if (!a.startedBy) expect(a.queue.startsWith(ownerTaskQueue(taskQueue, victim)), `${a.type} of ${s} never started, on ${a.queue}`).toBe(true);
        else expect(a.queue.startsWith(ownerTaskQueue(taskQueue, a.startedBy.split('/').at(-1)!)), `${a.type} of ${s} on ${a.queue} by ${a.startedBy}`).toBe(true);
      }
      const bySurvivor = stream.filter((a) => a.startedBy?.endsWith(`/${survivor}`) && a.queue !== taskQueue).map((a) => a.type);
      // Which steps the survivor reruns depends on where the kill landed (an agent run, a gate, a
      // commit); that it ran the stream's work in the new sandbox at all is the claim.
      expect(bySurvivor.some((t) => ['runAgent', 'runGates', 'commitWork'].includes(t)), `${s}: ${JSON.stringify(bySurvivor)}`).toBe(true);
      const view = result.streams.find((v) => v.id === s)!;
      expect(result.ledger.some((e) => e.stream === s && e.kind === 'sandbox_failure' && e.summary.includes(`"${victim}"`)), `ledger of ${s}`).toBe(true);
      expect(view.phase).toBe('merged');
      // The gone owner's sandbox is not destroyed through it (nobody would take the task): only the replacement's destroy, on the survivor.
      expect(stream.filter((a) => a.type === 'destroySandbox').map((a) => a.startedBy?.split('/').at(-1))).toEqual([survivor]);
    }
    // Nothing is left behind: the replacements reused and then removed the worktrees.
    await waitFor(async () => (gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)?.length === 1 ? true : undefined), 'every worktree to be removed');
  }, 480_000);
});
