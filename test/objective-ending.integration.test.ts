/**
 * How an objective and its streams end (docs/adr/0037), on the real Temporal server with real git:
 * a stream removes its sandbox while its final event is on its way to the objective (one workflow
 * task instead of two), and an objective with no merger worktree and no remote ends without a
 * `finishObjective` activity, reporting the integration head its own merges left; each run records
 * one patch marker, its baseline (ADR 0038). The histories recorded here replay deterministically
 * against the workflow code (the new side of every patch).
 */
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Client } from '@temporalio/client';
import { temporal } from '@temporalio/proto';
import { Worker } from '@temporalio/worker';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import { objectiveWorkflow } from '../workflows/objective';
import { OBJECTIVE_BASELINE, STREAM_BASELINE } from '../workflows/patches';
import { writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo, tempDir } from './helpers/repo';
import { runHistories, startTestWorker, type TestWorker } from './helpers/temporal';
import { waitFor } from './helpers/cli';

const E = temporal.api.enums.v1.EventType;
type Event = temporal.api.history.v1.IHistoryEvent;

let worker: TestWorker;
beforeAll(async () => {
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
});

const eventsOf = async (client: Client, workflowId: string): Promise<Event[]> => (await client.workflow.getHandle(workflowId).fetchHistory()).events ?? [];
const scheduled = (events: Event[]) => events.flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);

async function runObjective(id: string, postMergeGate: boolean) {
  const repo = makeDemoRepo();
  const file = writeObjective({
    objective: 'One file',
    repository: repo,
    ...(postMergeGate ? { post_merge_gates: [{ name: 'post', command: 'true' }] } : {}),
    agents: { builder: { provider: 'script', command: 'cat > /dev/null; echo one > one.txt; git add -A; git commit -qm one' } },
    streams: [{ id: 'only', task: 'write one file' }],
  });
  const input = await loadObjectiveFile(file, { repository: repo, id });
  const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
  return { repo, result };
}

/** Enough bare streams, two at a time, to roll the objective over (continue-as-new) while they run. */
async function runRollingObjective(on: TestWorker, id: string, streams: string[]) {
  const repo = makeDemoRepo();
  const file = writeObjective({
    objective: 'enough bare streams to roll the objective over',
    repository: repo,
    max_parallel_streams: 2,
    // Each stream writes a file of its own name, so every merge brings a change.
    agents: { builder: { provider: 'script', command: 'cat > /dev/null; echo "$SLIPWAY_STREAM" > "$SLIPWAY_STREAM.txt"; git add -A; git commit -qm "$SLIPWAY_STREAM"' } },
    streams: streams.map((s) => ({ id: s, task: s })),
  });
  const input = { ...(await loadObjectiveFile(file, { repository: repo, id })), continueAsNewAfterEvents: 40 };
  const result = await on.client.workflow.execute(objectiveWorkflow, { taskQueue: on.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
  return { repo, result };
}

describe('how an objective and its streams end (ADR 0037)', () => {
  it('without a merger worktree: no finishObjective, the reported head is the branch, and the stream removes its sandbox while its final event travels', async () => {
    const id = 'ending-bare';
    const { repo, result } = await runObjective(id, false);
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toEqual(['only']);
    const head = gitIn(repo, 'rev-parse', integrationBranch(id));
    expect(result.integrationHead).toBe(head);
    expect(gitIn(repo, 'show', `${head}:one.txt`)).toBe('one');

    const objective = await eventsOf(worker.client, objectiveWorkflowId(id));
    const objectiveActivities = scheduled(objective);
    expect(objectiveActivities).toContain('mergeWithGates');
    expect(objectiveActivities).not.toContain('finishObjective');
    expect(objectiveActivities).not.toContain('prepareMerger');
    // The stream's final event reached the objective: it saw the stream merged.
    expect(result.streams.find((s) => s.id === 'only')?.phase).toBe('merged');

    const stream = await eventsOf(worker.client, streamWorkflowId(id, 'only'));
    const finalSignal = stream.filter((e) => e.eventType === E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED).at(-1)!;
    const destroy = stream.find((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'destroySandbox')!;
    expect(destroy).toBeDefined();
    // Both commands came from one workflow task: no WORKFLOW_TASK_COMPLETED between them.
    const [from, to] = [Number(finalSignal.eventId), Number(destroy.eventId)].sort((a, b) => a - b);
    expect(stream.filter((e) => Number(e.eventId) > from && Number(e.eventId) < to && e.eventType === E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)).toEqual([]);
    // ...and the run ended only after the signal was delivered.
    const delivered = stream.find((e) => e.externalWorkflowExecutionSignaledEventAttributes?.initiatedEventId?.toString() === finalSignal.eventId?.toString());
    const completed = stream.find((e) => e.eventType === E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED)!;
    expect(delivered).toBeDefined();
    expect(Number(delivered!.eventId)).toBeLessThan(Number(completed.eventId));
    // The sandbox is gone, and with it the objective's worktree folder.
    expect(existsSync(path.join(repo, '.slipway', 'worktrees', id))).toBe(false);
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);

    // One patch marker per run, the baseline's (./workflows/patches, ADR 0038), and one
    // TemporalChangeVersion upsert with it, where each patch passed used to record both.
    for (const [events, baseline] of [[objective, OBJECTIVE_BASELINE.id], [stream, STREAM_BASELINE.id]] as const) {
      const markers = events.filter((e) => e.markerRecordedEventAttributes?.markerName === 'core_patch');
      expect(markers.map((e) => Buffer.from(e.markerRecordedEventAttributes!.details!['patch-data']!.payloads![0]!.data!).toString())).toEqual([expect.stringContaining(`"${baseline}"`)]);
      const versions = events.filter((e) => e.upsertWorkflowSearchAttributesEventAttributes?.searchAttributes?.indexedFields?.TemporalChangeVersion);
      expect(versions).toHaveLength(1);
    }

    // The recorded histories (the new side of both patches) replay against today's code.
    const histories = await Promise.all(
      [objectiveWorkflowId(id), streamWorkflowId(id, 'only')].map(async (workflowId) => ({ workflowId, history: await worker.client.workflow.getHandle(workflowId).fetchHistory() })),
    );
    const replayed: Array<string | undefined> = [];
    for await (const r of Worker.runReplayHistories({ workflowBundle: { codePath: inject('workflowBundlePath') } }, histories)) replayed.push(r.error?.message);
    expect(replayed).toEqual([undefined, undefined]);
  }, 120_000);

  it('with a merger worktree (a post-merge gate): finishObjective still removes it', async () => {
    const id = 'ending-merger';
    const { repo, result } = await runObjective(id, true);
    expect(result.outcome).toBe('completed');
    expect(result.integrationHead).toBe(gitIn(repo, 'rev-parse', integrationBranch(id)));
    const activities = scheduled(await eventsOf(worker.client, objectiveWorkflowId(id)));
    expect(activities).toEqual(expect.arrayContaining(['prepareMerger', 'finishObjective']));
    expect(existsSync(path.join(repo, '.slipway', 'worktrees', id)) ? readdirSync(path.join(repo, '.slipway', 'worktrees', id)) : []).toEqual([]);
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
  }, 120_000);

  it('without a merger worktree across continue-as-new: no run makes or removes a merger, and the head reported by the last is the branch', async () => {
    const id = 'ending-bare-rollover';
    const streams = ['b0', 'b1', 'b2', 'b3'];
    const { repo, result } = await runRollingObjective(worker, id, streams);
    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(streams);
    const head = gitIn(repo, 'rev-parse', integrationBranch(id));
    expect(result.integrationHead).toBe(head);
    for (const s of streams) expect(gitIn(repo, 'show', `${head}:${s}.txt`)).toBe(s);

    // Every run, newest first: the carried withoutMerger kept each one off the merger.
    const runs: Event[][] = (await runHistories(worker.client, objectiveWorkflowId(id))).map((r) => r.history.events ?? []);
    expect(runs.length).toBeGreaterThan(1);
    expect(runs.slice(1).every((events) => events.at(-1)!.eventType === E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW)).toBe(true);
    const activities = runs.flatMap(scheduled);
    expect(activities).not.toContain('prepareMerger');
    expect(activities).not.toContain('finishObjective');
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
  }, 180_000);

  it("a continued-as-new objective's result comes after its streams' sandbox cleanup (a resumed run hears their end through their final event)", async () => {
    // Sandboxes whose removal is slow: without the wait, the resumed run ends while they are still there.
    class SlowDestroy extends LocalSandboxProvider {
      override async destroy(...args: Parameters<LocalSandboxProvider['destroy']>) {
        await new Promise((r) => setTimeout(r, 1_500));
        return super.destroy(...args);
      }
    }
    const slow = await startTestWorker({ deps: { sandboxes: new SlowDestroy({ backgroundFill: false }) } });
    try {
      const id = 'ending-slow-cleanup';
      const { repo, result } = await runRollingObjective(slow, id, ['c0', 'c1', 'c2', 'c3']);
      // Read at once: nothing of the objective's is left when its result is there.
      const worktrees = gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm);
      const left = existsSync(path.join(repo, '.slipway', 'worktrees', id)) ? readdirSync(path.join(repo, '.slipway', 'worktrees', id)) : [];
      expect(result.outcome).toBe('completed');
      expect(worktrees).toHaveLength(1);
      expect(left).toEqual([]);
      const runs: Event[][] = (await runHistories(slow.client, objectiveWorkflowId(id))).map((r) => r.history.events ?? []);
      expect(runs.length).toBeGreaterThan(1);
      // The last run waited for its streams to close.
      expect(scheduled(runs[0]!)).toContain('workflowsClosed');
    } finally {
      await slow.stop();
    }
  }, 180_000);

  it('a continued-as-new objective that fails while a stream still runs ends without waiting for that stream (it runs on)', async () => {
    // Each stream's agent waits for a file of its own name: the test says when each one finishes.
    const marks = tempDir('slipway-marks-');
    const release = (stream: string) => writeFileSync(path.join(marks, stream), '');
    const on = await startTestWorker({ agentConcurrency: 3 });
    const id = 'ending-failed-resumed';
    const streamIds = ['a', 'b', 'slow'];
    try {
      const repo = makeDemoRepo();
      const file = writeObjective({
        objective: 'fail while a stream runs',
        repository: repo,
        max_parallel_streams: 3,
        agents: {
          builder: {
            provider: 'script',
            command: `cat > /dev/null; while [ ! -e "${marks}/$SLIPWAY_STREAM" ]; do sleep 0.05; done; echo "$SLIPWAY_STREAM" > "$SLIPWAY_STREAM.txt"; git add -A; git commit -qm "$SLIPWAY_STREAM"`,
          },
        },
        streams: streamIds.map((s) => ({ id: s, task: s })),
      });
      // Low enough that the streams' first events roll it over before their agents wait.
      const input = { ...(await loadObjectiveFile(file, { repository: repo, id })), continueAsNewAfterEvents: 20 };
      const handle = await on.client.workflow.start(objectiveWorkflow, { taskQueue: on.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
      const branch = integrationBranch(id);
      // The run that fails is a resumed one: the objective has rolled over once at least.
      await waitFor(async () => (await runHistories(on.client, objectiveWorkflowId(id))).length > 1, 'the objective to continue as new');
      release('a');
      await waitFor(async () => gitIn(repo, 'ls-tree', '--name-only', branch).split('\n').includes('a.txt'), 'stream a to be merged');
      // Someone moves the integration branch by hand: the queue refuses to merge on top of it, and the objective fails.
      gitIn(repo, 'update-ref', `refs/heads/${branch}`, gitIn(repo, 'rev-parse', 'main'));
      release('b');
      const result = await handle.result();
      // Read at once: the stream still running was not waited for.
      const slow = await on.client.workflow.getHandle(streamWorkflowId(id, 'slow')).describe();
      expect(result.outcome).toBe('failed');
      expect(result.error).toContain('refusing to merge on top of it');
      expect(slow.status.name).toBe('RUNNING');
      expect(result.streams.find((s) => s.id === 'a')?.phase).toBe('merged');
      expect(['merged', 'no_changes', 'escalated', 'failed']).not.toContain(result.streams.find((s) => s.id === 'slow')?.phase);
      expect((await runHistories(on.client, objectiveWorkflowId(id)))[0]!.history.events!.at(-1)!.eventType).toBe(E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED);
    } finally {
      // The streams the objective left: ended by hand, their agents let go.
      for (const s of streamIds) {
        await on.client.workflow.getHandle(streamWorkflowId(id, s)).terminate('test over').catch(() => undefined);
        release(s);
      }
      await on.stop();
    }
  }, 180_000);
});
