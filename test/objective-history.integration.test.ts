/**
 * The objective's history at the caps, read from the real Temporal server: the largest allowed
 * objective (MAX_STREAMS streams, all in parallel, zero-work agents, gate `true`) and a planner
 * that answers with too many streams.
 */
import path from 'node:path';
import type { temporal } from '@temporalio/proto';
import { Worker } from '@temporalio/worker';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import { MAX_STREAMS } from '../core/stream-graph';
import type { ObjectiveResult } from '../core/types';
import { objectiveFeedQuery, objectiveWorkflow } from '../workflows/objective';
import { writeObjective } from './helpers/objective';
import { slipway } from './helpers/cli';
import { gitIn, makeDemoRepo, PROJECT_ROOT } from './helpers/repo';
import { runHistories, startTestWorker, type TestWorker } from './helpers/temporal';

const ZERO_WORK = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'zero-work.mjs');
const PLANNER = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'planner.mjs');

/**
 * Most objective events one zero-work stream can cost, however slow the machine: its child (3
 * events), at most one batch per feed line (9) and its merge request (1), the merge (2 phase
 * upserts, the merge activity's 3, the decision signal's 2) and a workflow task (3 events) for
 * each of the 14 things that may wake the objective. docs/adr/0009-bounded-objective-history.md.
 */
const ZERO_WORK_EVENTS_PER_STREAM = 3 + 9 + 1 + 7 + 14 * 3;
/** The objective's own events: start, search attributes, preparing, finishing, their tasks. */
const OBJECTIVE_FIXED_EVENTS = 60;

let worker: TestWorker;
beforeAll(async () => {
  worker = await startTestWorker({ agentConcurrency: 4 });
});
afterAll(async () => {
  await worker?.stop();
});

describe('objective history at the caps', () => {
  it(`the largest allowed objective (${MAX_STREAMS} streams, all in parallel) completes with a bounded history`, async () => {
    const repo = makeDemoRepo();
    const id = 'history-cap';
    const file = writeObjective({
      objective: 'the largest objective Slipway allows, with agents that do nothing',
      repository: repo,
      max_parallel_streams: 64,
      gates: [{ name: 'true', command: 'true' }],
      agents: {
        builder: { provider: 'script', command: `node ${ZERO_WORK} builder` },
        reviewer: { provider: 'script', command: `node ${ZERO_WORK} reviewer` },
      },
      streams: Array.from({ length: MAX_STREAMS }, (_, i) => ({ id: `s${i}`, task: `stream ${i}` })),
    });
    const input = await loadObjectiveFile(file, { repository: repo, id });
    expect(input.streams).toHaveLength(MAX_STREAMS);

    const started = Date.now();
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    const result: ObjectiveResult = await handle.result();
    const runtimeMs = Date.now() - started;

    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toHaveLength(MAX_STREAMS);

    const description = await handle.describe();
    const history = await handle.fetchHistory();
    const events = history.events ?? [];
    const signals = events.filter((e) => e.workflowExecutionSignaledEventAttributes).map((e) => e.workflowExecutionSignaledEventAttributes!.signalName);
    const count = (name: string) => signals.filter((s) => s === name).length;
    const figures = {
      runtimeMs,
      events: description.historyLength,
      bytes: description.historySize,
      eventsPerStream: Math.round((description.historyLength / MAX_STREAMS) * 10) / 10,
      batchSignals: count('streamEvents'),
      mergeReadySignals: count('streamMergeReady'),
      workflowTasks: events.filter((e) => e.workflowTaskCompletedEventAttributes).length,
    };
    console.log(`objective history at ${MAX_STREAMS} streams: ${JSON.stringify(figures)}`);

    expect(events.length).toBe(description.historyLength);
    // Batches, not one signal per line: the old per-event signal is gone, and each stream sends
    // a few batches (merge-ready and its end at once; the rest within the flush delay).
    expect(count('streamEvent')).toBe(0);
    // The merge request rides in the stream's events batch (patch merge-request-in-events, ADR 0018):
    // no separate merge-ready signal.
    expect(figures.mergeReadySignals).toBe(0);
    // The feed still has every stream's lines, in the order they happened per stream.
    const { events: feed, done } = await handle.query(objectiveFeedQuery, 0);
    expect(done).toBe(true);
    for (const s of input.streams) {
      const lines = feed.filter((e) => e.source === s.id).map((e) => e.text.split(/[ :]/)[0]);
      expect(lines[0]).toBe('provisioning');
      expect(lines.at(-1)).toBe('merged');
    }
    const streamLines = feed.filter((e) => e.source.startsWith('s')).length;
    // Merge-ready and the end each go at once (two batches at least), and the reviewer's run
    // always travels with merge-ready: fewer signals than lines whatever the machine's speed.
    expect(figures.batchSignals).toBeGreaterThanOrEqual(2 * MAX_STREAMS);
    expect(figures.batchSignals).toBeLessThanOrEqual(streamLines - MAX_STREAMS);
    console.log(`stream feed lines: ${streamLines}, sent in ${figures.batchSignals} batch signals`);

    expect(description.historyLength).toBeLessThanOrEqual(ZERO_WORK_EVENTS_PER_STREAM * MAX_STREAMS + OBJECTIVE_FIXED_EVENTS);
    expect(description.historyLength).toBeLessThan(10_000);
    expect(description.historySize).toBeDefined();
    expect(description.historySize!).toBeLessThan(4 * 1024 * 1024);
  }, 900_000);

  it('continues as new when its history grows, its streams kept by id: all merged, the whole feed printable after the end', async () => {
    const repo = makeDemoRepo();
    const id = 'history-rollover';
    const file = writeObjective({
      objective: 'enough streams to roll the objective over several times',
      repository: repo,
      max_parallel_streams: 2,
      gates: [{ name: 'true', command: 'true' }],
      agents: {
        builder: { provider: 'script', command: `node ${ZERO_WORK} builder` },
        reviewer: { provider: 'script', command: `node ${ZERO_WORK} reviewer` },
      },
      streams: [
        { id: 'r0', task: 'r0' },
        { id: 'r1', task: 'r1' },
        { id: 'r2', task: 'r2', depends_on: ['r0'] },
        { id: 'r3', task: 'r3' },
        { id: 'r4', task: 'r4', depends_on: ['r2', 'r3'] },
        { id: 'r5', task: 'r5' },
      ],
    });
    const input = { ...(await loadObjectiveFile(file, { repository: repo, id })), continueAsNewAfterEvents: 40 };
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    const result: ObjectiveResult = await worker.client.workflow.getHandle(objectiveWorkflowId(id)).result();

    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(['r0', 'r1', 'r2', 'r3', 'r4', 'r5']);
    expect(result.mergeOrder.indexOf('r4')).toBeGreaterThan(result.mergeOrder.indexOf('r2'));
    // The head reported after several rollovers is the branch's.
    expect(result.integrationHead).toBe(gitIn(repo, 'rev-parse', integrationBranch(id)));
    const subjects = gitIn(repo, 'log', '--first-parent', '--format=%s', integrationBranch(id));
    expect(subjects.match(/^slipway: merge stream r\d into/gm)).toHaveLength(6);

    // The chain of runs, newest first, from the histories (continuedExecutionRunId links them).
    const runs = (await runHistories(worker.client, objectiveWorkflowId(id))).map(({ runId, history }) => {
      const events: temporal.api.history.v1.IHistoryEvent[] = history.events ?? [];
      const last = events.at(-1)!;
      return { runId, events: events.length, ended: last.workflowExecutionContinuedAsNewEventAttributes ? 'continued_as_new' : last.workflowExecutionCompletedEventAttributes ? 'completed' : 'other' };
    });
    console.log(`objective runs (newest first): ${JSON.stringify(runs)}`);
    expect(runs.length).toBeGreaterThan(1);
    expect(runs.map((r) => r.ended)).toEqual(['completed', ...runs.slice(1).map(() => 'continued_as_new')]);
    expect(runs.at(-1)!.runId).toBe(handle.firstExecutionRunId);

    // Today's code replays what it recorded: every run, and the streams with their batched events.
    const recorded = await Promise.all([
      ...runs.map(async (r) => ({ workflowId: `objective-${r.runId}`, history: await worker.client.workflow.getHandle(objectiveWorkflowId(id), r.runId).fetchHistory() })),
      ...input.streams.map(async (s) => ({ workflowId: s.id, history: await worker.client.workflow.getHandle(streamWorkflowId(id, s.id)).fetchHistory() })),
    ]);
    const replayErrors: string[] = [];
    for await (const r of Worker.runReplayHistories({ workflowBundle: { codePath: inject('workflowBundlePath') } }, recorded)) {
      if (r.error) replayErrors.push(`${r.workflowId}: ${r.error.message}`);
    }
    expect(replayErrors).toEqual([]);

    // The ended objective's feed comes from every run's history.
    const watch = await slipway(['watch', '--objective', id], { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue });
    expect(watch.code).toBe(0);
    for (const s of input.streams) expect(watch.stdout).toMatch(new RegExp(`\\[${s.id}\\] merged`));
    expect(watch.stdout.trim().split('\n').at(-1)).toBe(`objective ${id}: completed`);
  }, 600_000);

  it(`a planner answering with more than ${MAX_STREAMS} streams fails the objective, naming the field`, async () => {
    const repo = makeDemoRepo();
    const id = 'history-too-many';
    const file = writeObjective(
      {
        objective: 'a plan that is too big',
        repository: repo,
        agents: {
          builder: { provider: 'script', command: `node ${ZERO_WORK} builder` },
          reviewer: { provider: 'script', command: `node ${ZERO_WORK} reviewer` },
          planner: { provider: 'script', command: `node ${PLANNER}`, max_output_retries: 0 },
        },
      },
      { _plans: [{ streams: Array.from({ length: MAX_STREAMS + 1 }, (_, i) => ({ id: `p${i}`, task: `planned ${i}` })) }] },
    );
    const input = await loadObjectiveFile(file, { repository: repo, id });
    const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    expect(result.outcome).toBe('failed');
    expect(result.error).toMatch(new RegExp(`streams: too many streams: ${MAX_STREAMS + 1}, at most ${MAX_STREAMS} allowed`));
    expect(result.streams).toEqual([]);
  }, 300_000);
});
