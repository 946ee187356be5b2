/**
 * Bounded history (issue 10, docs/adr/0010-bounded-stream-history.md): the largest stream the
 * objective schema allows, on the real Temporal server with real git and zero-work script agents.
 * The builder at `max_iterations`' cap (it never prints a completion signal, so every build runs
 * all its iterations), the reviewer spending every output retry, `max_fix_iterations` at its cap, and a gate that fails until the
 * last fix iteration. Every run of the stream workflow is read back from the server and its event
 * count and encoded size are checked against the bound; the stream still ends merged.
 */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { temporal } from '@temporalio/proto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { existsSync } from 'node:fs';
import { integrationBranch, objectiveWorkflowId, streamSandboxWorkflowId, streamSandboxId, streamWorkflowId } from '../core/ids';
import { ITERATION_CAPS } from '../core/objective-schema';
import { objectiveWorkflow } from '../workflows/objective';
import { sandboxStateQuery } from '../workflows/sandbox';
import { guidanceUpdate, streamStatusQuery, streamWorkflow } from '../workflows/stream';
import { CONTINUE_AS_NEW_AFTER_EVENTS } from '../workflows/stream-interpreter';
import { waitFor } from './helpers/cli';
import { writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

/** The bound every run must stay under (Temporal's hard limit is 51,200 events, 50 MB). */
const MAX_EVENTS_PER_RUN = 10_000;
const MAX_BYTES_PER_RUN = 2 * 1024 * 1024;

let worker: TestWorker;
beforeAll(async () => {
  worker = await startTestWorker({ agentConcurrency: 4 });
});
afterAll(async () => {
  await worker?.stop();
});

interface RunSize {
  runId: string;
  events: number;
  /** Events without the ones timing decides (./runsOf). */
  workEvents: number;
  bytes: number;
  closedAs: string;
}

/** Every run of a workflow id, oldest first, from the server's histories (following the continue-as-new chain back). */
async function runsOf(workflowId: string): Promise<RunSize[]> {
  const runs: RunSize[] = [];
  let runId: string | undefined = (await worker.client.workflow.getHandle(workflowId).describe()).runId;
  while (runId) {
    const history: temporal.api.history.v1.IHistory = await worker.client.workflow.getHandle(workflowId, runId).fetchHistory();
    const events: temporal.api.history.v1.IHistoryEvent[] = history.events ?? [];
    const last = events.at(-1)!;
    const E = temporal.api.enums.v1.EventType;
    // Events whose number depends on timing, not on the work: workflow tasks, the feed's flush
    // timer and the batches it sends.
    const timing = new Set<number>([
      E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, E.EVENT_TYPE_WORKFLOW_TASK_STARTED, E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
      E.EVENT_TYPE_TIMER_STARTED, E.EVENT_TYPE_TIMER_FIRED, E.EVENT_TYPE_TIMER_CANCELED,
      E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED, E.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED,
    ]);
    runs.unshift({
      runId,
      events: events.length,
      workEvents: events.filter((e) => !timing.has(Number(e.eventType))).length,
      bytes: temporal.api.history.v1.History.encode(history).finish().length,
      closedAs: String(last.eventType),
    });
    runId = events[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId || undefined;
  }
  return runs;
}

describe('bounded stream history', () => {
  it(
    `the largest allowed stream (max_iterations ${ITERATION_CAPS.maxIterations}, max_fix_iterations ${ITERATION_CAPS.maxFixIterations}, max_output_retries ${ITERATION_CAPS.maxOutputRetries}) stays under ${MAX_EVENTS_PER_RUN} events per run and ends merged`,
    async () => {
      const repo = makeDemoRepo();
      const id = 'largest-stream';
      const last = ITERATION_CAPS.maxFixIterations + 1; // the first build and one per fix iteration
      const agents = tempDir('slipway-zero-agents-');
      // Zero work: the builder records its fix iteration (the gate reads it); the reviewer (one
      // run per step) answers unusably until its output retries are spent, then approves.
      writeFileSync(path.join(agents, 'builder.sh'), 'cat >/dev/null; echo "$SLIPWAY_ITERATION" > iteration.txt\n');
      const counter = path.join(agents, 'reviews');
      writeFileSync(
        path.join(agents, 'reviewer.sh'),
        `cat >/dev/null; n=$(($(cat ${counter} 2>/dev/null || echo 0) + 1)); echo $n > ${counter}\n` +
          `if [ $n -le ${ITERATION_CAPS.maxOutputRetries} ]; then echo 'no verdict'; else echo '<review>{"verdict": "approve", "summary": "ok"}</review>'; fi\n`,
      );
      const file = writeObjective({
        objective: 'The largest stream the schema allows',
        repository: repo,
        base_branch: 'main',
        max_fix_iterations: ITERATION_CAPS.maxFixIterations,
        on_exhausted: 'fail',
        gates: [{ name: 'last-iteration', command: `test "$(cat iteration.txt)" -ge ${last}` }],
        agents: {
          builder: { provider: 'script', command: `sh ${path.join(agents, 'builder.sh')}`, max_iterations: ITERATION_CAPS.maxIterations },
          reviewer: { provider: 'script', command: `sh ${path.join(agents, 'reviewer.sh')}`, max_output_retries: ITERATION_CAPS.maxOutputRetries },
        },
        streams: [{ id: 'big', task: 'Record the iteration' }],
      });
      const input = await loadObjectiveFile(file, { repository: repo, id });
      const started = Date.now();
      const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
      const seconds = (Date.now() - started) / 1000;

      expect(result.outcome).toBe('completed');
      const stream = result.streams.find((s) => s.id === 'big')!;
      expect(stream).toMatchObject({ phase: 'merged', iterations: last });
      expect(gitIn(repo, 'show', `${integrationBranch(id)}:iteration.txt`)).toBe(String(last));
      // Every fix iteration went round the loop; the objective kept the whole ledger.
      const ledger = result.ledger.filter((e) => e.stream === 'big').map((e) => e.result);
      expect(ledger.filter((r) => r === 'retrying')).toHaveLength(ITERATION_CAPS.maxFixIterations);
      expect(ledger.at(-1)).toBe('recovered');
      const builderRuns = (result.agentRuns ?? []).filter((r) => r.stream === 'big' && r.role === 'builder');
      expect(builderRuns).toHaveLength(last * ITERATION_CAPS.maxIterations);
      expect((result.agentRuns ?? []).filter((r) => r.role === 'reviewer').map((r) => r.result)).toEqual([
        ...Array(ITERATION_CAPS.maxOutputRetries).fill('invalid_output'),
        'finished',
      ]);

      // The sandbox outlived the run that made it and was removed by the last one (the stream owns it, ADR 0032).
      expect(await worker.client.workflow.getHandle(streamWorkflowId(id, 'big')).query(sandboxStateQuery)).toMatchObject({ state: 'terminated' });
      const worktree = (await worker.client.workflow.getHandle(streamWorkflowId(id, 'big')).query(streamStatusQuery)).sandboxPath;
      expect(worktree).toContain(id);
      expect(existsSync(worktree!)).toBe(false);

      const runs = await runsOf(streamWorkflowId(id, 'big'));
      const sizes = runs.map((r) => `${r.events} events/${Math.round(r.bytes / 1024)} KiB`);
      console.log(`largest stream: ${seconds.toFixed(1)} s, ${runs.length} runs, total ${runs.reduce((n, r) => n + r.events, 0)} events; per run: ${sizes.join(', ')}`);
      // One run per fix iteration (plus the first), each closed by continue-as-new but the last.
      expect(runs).toHaveLength(last);
      expect(runs.slice(0, -1).every((r) => r.closedAs === String(temporal.api.enums.v1.EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW))).toBe(true);
      expect(runs.at(-1)!.closedAs).toBe(String(temporal.api.enums.v1.EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED));
      for (const run of runs) {
        expect(run.events, `run ${run.runId}`).toBeLessThan(MAX_EVENTS_PER_RUN);
        expect(run.bytes, `run ${run.runId}`).toBeLessThan(MAX_BYTES_PER_RUN);
      }
      // No run grows with the stream's past in events; in bytes only by the ledger lines the
      // builder is shown (at most LEDGER_KEPT_BY_STREAM of them, a few hundred bytes each per run).
      // Counted without workflow tasks, timers and feed batches, whose number depends on timing.
      expect(runs.at(-2)!.workEvents).toBe(runs[1]!.workEvents);
      const perRunGrowth = (runs.at(-2)!.bytes - runs[1]!.bytes) / (runs.length - 3);
      expect(perRunGrowth).toBeLessThan(ITERATION_CAPS.maxIterations * 300);
      expect(Math.max(...runs.map((r) => r.events))).toBeLessThan(CONTINUE_AS_NEW_AFTER_EVENTS);
    },
    15 * 60_000,
  );

  it('a stream cancelled after it continued as new still releases its sandbox', async () => {
    const repo = makeDemoRepo();
    const id = 'cancel-carried';
    // The gate always fails: one fix iteration (a second run), then the stream blocks for guidance.
    const file = writeObjective({
      objective: 'Block after a fix iteration',
      repository: repo,
      base_branch: 'main',
      max_fix_iterations: 1,
      on_exhausted: 'ask_human',
      gates: [{ name: 'never', command: 'false' }],
      agents: { builder: { provider: 'script', command: 'cat >/dev/null; date +%N > work.txt' } },
      streams: [{ id: 'stuck', task: 'Never pass' }],
    });
    const input = await loadObjectiveFile(file, { repository: repo, id });
    const objective = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    const stream = worker.client.workflow.getHandle(streamWorkflowId(id, 'stuck'));
    const status = await waitFor(async () => {
      const s = await stream.query(streamStatusQuery).catch(() => undefined);
      return s?.phase === 'blocked' ? s : undefined;
    }, 'the stream to block after its fix iteration');
    expect(status.iteration).toBe(2);
    expect((await runsOf(streamWorkflowId(id, 'stuck'))).length).toBe(2);
    expect(existsSync(status.sandboxPath!)).toBe(true);

    await objective.cancel();
    await expect(stream.result()).rejects.toThrow();
    expect(await stream.query(sandboxStateQuery)).toMatchObject({ state: 'terminated' });
    expect(existsSync(status.sandboxPath!)).toBe(false);
  });

  it('a blocked stream probes its own sandbox while it waits, ever less often, notices it removed outside Slipway and recreates it for the next step (ADR 0032)', async () => {
    const repo = makeDemoRepo();
    const id = 'probed-idle';
    const file = writeObjective({
      objective: 'Block after a fix iteration',
      repository: repo,
      base_branch: 'main',
      max_fix_iterations: 1,
      on_exhausted: 'ask_human',
      gates: [{ name: 'never', command: 'false' }],
      agents: { builder: { provider: 'script', command: 'cat >/dev/null; date +%N > work.txt' } },
      streams: [{ id: 'stuck', task: 'Never pass' }],
      sandbox: { probe_seconds: 1 },
    });
    const input = await loadObjectiveFile(file, { repository: repo, id });
    const stream = await worker.client.workflow.start(streamWorkflow, {
      taskQueue: worker.taskQueue,
      workflowId: streamWorkflowId(id, 'stuck'),
      args: [
        {
          objective: { id, objective: input.objective, repository: input.repository, objectiveDir: input.objectiveDir },
          stream: input.streams[0]!,
          base: input.baseBranch,
          integrationBranch: integrationBranch(id),
          gates: input.gates,
          agents: input.agents,
          blueprint: input.blueprint.refs['build-review']!,
          maxFixIterations: input.maxFixIterations,
          onExhausted: input.onExhausted,
          parentWorkflowId: objectiveWorkflowId(id), // never started: the stream's feed signals are best effort
          sandbox: input.sandbox,
        },
      ],
    });
    const status = await waitFor(async () => {
      const s = await stream.query(streamStatusQuery).catch(() => undefined);
      return s?.phase === 'blocked' ? s : undefined;
    }, 'the stream to block after its fix iteration', 120_000);
    // No sandbox workflow: the stream answers for its sandbox.
    await expect(worker.client.workflow.getHandle(streamSandboxWorkflowId(streamSandboxId(id, 'stuck'))).describe()).rejects.toThrow();
    expect(await stream.query(sandboxStateQuery)).toMatchObject({ state: 'ready', info: { path: status.sandboxPath } });

    // While blocked, it probes 1 s, then 2 s, then 4 s apart (idleProbeDelayMs): the probe timers double.
    const E = temporal.api.enums.v1.EventType;
    const timersAndProbes = async () => {
      const events = (await stream.fetchHistory()).events ?? [];
      const timers = events.filter((e) => e.eventType === E.EVENT_TYPE_TIMER_STARTED).map((e) => Number(e.timerStartedEventAttributes?.startToFireTimeout?.seconds ?? 0));
      const probes = events.filter((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'probeSandbox').length;
      return { timers: timers.join(','), probes };
    };
    const seen = await waitFor(async () => {
      const t = await timersAndProbes();
      return t.timers.includes('1,2,4') ? t : undefined;
    }, 'the idle probe timers to double', 120_000);
    // One probe after the failed gate step, then one after each of the first two idle timers.
    expect(seen.probes).toBeGreaterThanOrEqual(3);
    expect(existsSync(status.sandboxPath!)).toBe(true);

    // Removed outside Slipway: the next idle probe notices it.
    gitIn(repo, 'worktree', 'remove', '--force', status.sandboxPath!);
    const dead = await waitFor(async () => {
      const s = await stream.query(sandboxStateQuery);
      return s.state === 'failed' ? s : undefined;
    }, 'the idle probe to notice the removed sandbox', 120_000);
    expect(dead.error).toBeTruthy();

    // Guidance resumes the step (in a new run: guidance continues as new): the sandbox is made again from the branch first.
    await stream.executeUpdate(guidanceUpdate, { args: [{ agent: status.blocked!.mailbox, subject: 'go on', body: 'try again' }] });
    const again = await waitFor(async () => {
      const s = await stream.query(streamStatusQuery).catch(() => undefined);
      return s?.phase === 'blocked' && s.ledger.some((e) => e.action === 'recreate_sandbox') ? s : undefined;
    }, 'the stream to recreate its sandbox and block again', 120_000);
    expect(again.ledger.find((e) => e.action === 'recreate_sandbox')).toMatchObject({ kind: 'sandbox_failure', result: 'retrying' });
    expect(await stream.query(sandboxStateQuery)).toMatchObject({ state: 'ready', info: { path: status.sandboxPath } });
    expect(existsSync(status.sandboxPath!)).toBe(true);
    // Same place, same branch: the recreated worktree holds the branch's commits.
    expect(gitIn(status.sandboxPath!, 'rev-parse', 'HEAD')).toBe(gitIn(repo, 'rev-parse', `slipway/${id}/stuck`));

    await stream.cancel();
    await expect(stream.result()).rejects.toThrow();
    expect(await stream.query(sandboxStateQuery)).toMatchObject({ state: 'terminated' });
    expect(existsSync(status.sandboxPath!)).toBe(false);
  });
});
