/**
 * A stream's Daytona sandbox deleted outside Slipway while its agent runs (issue 14): the step
 * fails, the stream's probe after it says the sandbox was deleted, and the stream recreates it
 * from its branch and runs the step again; the objective completes. Against the fake Daytona, real
 * SDK, real Temporal, real git.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import type { WorkflowHandle } from '@temporalio/client';
import type { temporal } from '@temporalio/proto';
import { integrationBranch, objectiveWorkflowId, streamSandboxId, streamSandboxWorkflowId, streamWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';
import { sandboxStateQuery } from '../workflows/sandbox';
import { waitFor } from './helpers/cli';
import { FakeDaytona } from './helpers/fake-daytona';
import { gitIn, makeDemoRepo } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { demoObjectiveFile } from './sandbox/provider-suites';

/** The activity types a workflow scheduled, in every run of its id (it may have continued as new), latest run first. */
async function activityTypes(handle: WorkflowHandle): Promise<string[]> {
  const types: string[] = [];
  let runId: string | undefined = (await handle.describe()).runId;
  while (runId) {
    const events: temporal.api.history.v1.IHistoryEvent[] = (await handle.client.getHandle(handle.workflowId, runId).fetchHistory()).events ?? [];
    for (const e of events) {
      const name = e.activityTaskScheduledEventAttributes?.activityType?.name;
      if (name) types.push(name);
    }
    runId = events[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId || undefined;
  }
  return types;
}

describe('a stream sandbox deleted in Daytona mid-run', () => {
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

  it('is noticed by the probe, recreated from the branch, and the objective completes', async () => {
    const repo = makeDemoRepo();
    const id = `probe-${randomUUID().slice(0, 6)}`;
    const file = demoObjectiveFile(repo, 'probe', { provider: 'daytona', probe_seconds: 1 }, {
      streams: [{ id: 'greet', task: 'Add greet(name) returning "Hello, <name>!"' }],
      agents: {
        // The first run says it started and waits (the test deletes its sandbox); runs after `go` build.
        builder: { provider: 'script', command: 'test -f "$SLIPWAY_OBJECTIVE_DIR/go" || { touch "$SLIPWAY_OBJECTIVE_DIR/running"; sleep 600; }; node "$SLIPWAY_OBJECTIVE_DIR/agents/builder.mjs"' },
        reviewer: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/reviewer.mjs"' },
      },
    });
    const dir = path.dirname(file);
    const input = await loadObjectiveFile(file, { id });
    expect(input.sandbox?.probeSeconds).toBe(1);
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });

    // The stream's sandbox exists in Daytona and its agent runs: delete it there, as someone outside Slipway would.
    const [daytonaId] = await waitFor(async () => {
      const ours = [...fake.sandboxes.entries()].filter(([, s]) => s.labels['slipway.group'] === id && s.state === 'started').map(([k]) => k);
      return ours.length > 0 && existsSync(path.join(dir, 'running')) ? ours : undefined;
    }, 'the stream sandbox with its agent running', 120_000);
    writeFileSync(path.join(dir, 'go'), '');
    fake.setState(daytonaId!, 'destroyed');

    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toEqual(['greet']);
    expect(gitIn(repo, 'show', `${integrationBranch(id)}:src/greet.js`)).toContain('Hello, ${name}!');
    // The recreated sandbox is gone too, with the first.
    expect(fake.sandboxes.has(daytonaId!)).toBe(false);
    expect([...fake.sandboxes.values()].filter((s) => s.labels['slipway.group'] === id)).toEqual([]);

    // The stream probed its sandbox after the failed step and recorded the recreate (ADR 0032: no sandbox workflow).
    await expect(worker.client.workflow.getHandle(streamSandboxWorkflowId(streamSandboxId(id, 'greet'))).describe()).rejects.toThrow();
    const stream = worker.client.workflow.getHandle(streamWorkflowId(id, 'greet'));
    const activities = await activityTypes(stream);
    expect(activities).toContain('probeSandbox');
    expect(activities.filter((t) => t === 'createSandbox')).toHaveLength(2);
    expect(activities.filter((t) => t === 'destroySandbox')).toHaveLength(2);
    const recreate = result.ledger.find((e) => e.stream === 'greet' && e.action === 'recreate_sandbox');
    expect(recreate).toMatchObject({ kind: 'sandbox_failure', result: 'retrying' });
    expect(recreate!.summary).toContain('sandbox_deleted');
    expect(await stream.query(sandboxStateQuery)).toMatchObject({ state: 'terminated' });
  }, 300_000);
});
