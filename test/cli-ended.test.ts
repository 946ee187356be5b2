/**
 * `slipway status` and `slipway watch` on objectives that have ended, with no worker running:
 * why a failed one failed, and the feed from the history instead of a query nobody answers.
 */
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import { SlipwayKind, SlipwayObjective } from '../core/search-attributes';
import type { ObjectiveInput, ObjectiveResult } from '../core/types';
import { slipway } from './helpers/cli';
import { DEMO_DIR, makeDemoRepo } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

let worker: TestWorker;
let serverEnv: NodeJS.ProcessEnv;
const suffix = randomUUID().slice(0, 6);
const ids = { completed: `ended-ok-${suffix}`, failed: `ended-failed-${suffix}`, terminated: `ended-term-${suffix}` };

async function start(input: ObjectiveInput, taskQueue: string) {
  return worker.client.workflow.start('objectiveWorkflow', {
    taskQueue,
    workflowId: objectiveWorkflowId(input.id),
    args: [input],
    typedSearchAttributes: [
      { key: SlipwayKind, value: 'objective' },
      { key: SlipwayObjective, value: input.id },
    ],
  });
}

beforeAll(async () => {
  worker = await startTestWorker();
  serverEnv = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue };
  const repo = makeDemoRepo();
  const demo = path.join(DEMO_DIR, 'objective.yaml');
  const ok = await loadObjectiveFile(demo, { repository: repo, id: ids.completed });
  const completed = await start({ ...ok, streams: ok.streams.filter((s) => s.id === 'greet') }, worker.taskQueue);
  // The base branch is gone by the time the workflow prepares it: the objective fails with a reason.
  const failed = await start({ ...(await loadObjectiveFile(demo, { repository: repo, id: ids.failed })), baseBranch: 'gone-since-load' }, worker.taskQueue);
  expect(((await completed.result()) as ObjectiveResult).outcome).toBe('completed');
  expect(((await failed.result()) as ObjectiveResult).outcome).toBe('failed');
  // No worker ever polls this queue; the run is terminated by hand.
  const terminated = await start(await loadObjectiveFile(demo, { repository: repo, id: ids.terminated }), `nobody-${suffix}`);
  await terminated.terminate('stopped by the test');
  // From here on no worker runs: a query would wait for ever.
  await worker.stop();
}, 180_000);

afterAll(async () => {
  await worker?.stop().catch(() => undefined);
});

describe('slipway status on ended objectives', () => {
  it('shows why a failed objective failed, in text and --json', async () => {
    const json = await slipway(['status', ids.failed, '--json'], serverEnv);
    expect(json.code).toBe(0);
    const doc = JSON.parse(json.stdout);
    expect(doc).toMatchObject({ objectiveId: ids.failed, workflowStatus: 'COMPLETED', outcome: 'failed' });
    expect(doc.error).toMatch(/^could not prepare the integration branch: .*gone-since-load/);

    const text = await slipway(['status', ids.failed], serverEnv);
    expect(text.stdout.split('\n').slice(0, 2)).toEqual([`objective ${ids.failed}: failed`, `error: ${doc.error}`]);
  });

  it('shows the reason of a terminated workflow', async () => {
    const json = await slipway(['status', ids.terminated, '--json'], serverEnv);
    expect(JSON.parse(json.stdout)).toMatchObject({ workflowStatus: 'TERMINATED', error: 'workflow terminated: stopped by the test' });
    const text = await slipway(['status', ids.terminated], serverEnv);
    expect(text.stdout).toBe(`objective ${ids.terminated}: workflow terminated: stopped by the test\n`);
  });

  it('a completed objective has no error', async () => {
    const doc = JSON.parse((await slipway(['status', ids.completed, '--json'], serverEnv)).stdout);
    expect(doc).toMatchObject({ outcome: 'completed' });
    expect(doc).not.toHaveProperty('error');
  });
});

describe('slipway watch on ended objectives, no worker running', () => {
  it('prints the feed from the history and the outcome, and exits', async () => {
    const all = await slipway(['watch', '--objective', ids.completed], serverEnv);
    expect(all.code).toBe(0);
    const out = all.stdout.trim().split('\n');
    expect(out).toContainEqual(expect.stringMatching(/^\d\d:\d\d:\d\d \[objective\] running$/));
    expect(out).toContainEqual(expect.stringMatching(/^\d\d:\d\d:\d\d \[greet\] .*merged/));
    expect(out.at(-1)).toBe(`objective ${ids.completed}: completed`);
    expect(all.stderr).not.toContain('no worker answers');

    const filtered = await slipway(['watch', '--objective', ids.completed, '--stream', 'greet'], serverEnv);
    const lines = filtered.stdout.trim().split('\n');
    expect(lines.slice(0, -1).length).toBeGreaterThan(0);
    expect(lines.slice(0, -1).every((l) => / \[greet\] /.test(l))).toBe(true);
  });

  it('says why a failed objective failed, exit 1', async () => {
    const run = await slipway(['watch', '--objective', ids.failed], serverEnv);
    expect(run.code).toBe(1);
    const out = run.stdout.trim().split('\n');
    expect(out.at(-2)).toBe(`objective ${ids.failed}: failed`);
    expect(out.at(-1)).toMatch(/^error: could not prepare the integration branch: /);
  });

  it('a terminated objective ends the watch with the reason, exit 1', async () => {
    const run = await slipway(['watch', '--objective', ids.terminated], serverEnv);
    expect(run.code).toBe(1);
    expect(run.stdout.trim().split('\n').at(-1)).toBe(`objective ${ids.terminated}: workflow terminated: stopped by the test`);
  });
});
