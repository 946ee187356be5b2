/**
 * Objectives end to end on the real Temporal test server, real git repositories and real
 * script agents: parallel streams, the fix loop, partial outcomes, and the user's checkout
 * left exactly as it was.
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import { decodeArrayFromPayloads } from '@temporalio/common/lib/internal-non-workflow';
import type { ObjectiveResult, StreamInput } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';
import { streamStatusQuery } from '../workflows/stream';
import { DEMO_BUILDER, DEMO_REVIEWER, PLAN_BUILDER, helperFiles, writeObjective } from './helpers/objective';
import { DEMO_DIR, dirtyTheCheckout, gitIn, makeDemoRepo, pictureCheckout } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

let worker: TestWorker;
beforeAll(async () => {
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
});

async function runObjective(file: string, repo: string, id: string): Promise<ObjectiveResult> {
  const input = await loadObjectiveFile(file, { repository: repo, id });
  return worker.client.workflow.execute(objectiveWorkflow, {
    taskQueue: worker.taskQueue,
    workflowId: objectiveWorkflowId(id),
    args: [input],
  });
}

/** Stream ids in the order their merge commits landed on the integration branch (oldest first). */
function mergedStreamsInGitOrder(repo: string, id: string): string[] {
  const subjects = gitIn(repo, 'log', '--first-parent', '--reverse', '--format=%s', integrationBranch(id));
  return [...subjects.matchAll(/^slipway: merge stream (\S+) into/gm)].map((m) => m[1]);
}

describe('objective workflow', () => {
  it('builds three streams in parallel, fixes a gate failure, merges all in order, and leaves the checkout untouched', async () => {
    const repo = makeDemoRepo();
    dirtyTheCheckout(repo);
    const before = pictureCheckout(repo);
    const id = 'demo-three';

    const result = await runObjective(path.join(DEMO_DIR, 'objective.yaml'), repo, id);

    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(['clamp', 'greet', 'sum']);
    expect(mergedStreamsInGitOrder(repo, id)).toEqual(result.mergeOrder);
    const clamp = result.streams.find((s) => s.id === 'clamp')!;
    expect(clamp.iterations).toBe(2); // failed its gate once, fixed on the second iteration
    for (const s of result.streams.filter((s) => s.id !== 'clamp')) expect(s.iterations).toBe(1);

    // The integration branch holds all three helpers, and the fixed clamp.
    const branch = integrationBranch(id);
    for (const name of ['greet', 'sum', 'clamp']) {
      expect(gitIn(repo, 'cat-file', '-t', `${branch}:src/${name}.js`)).toBe('blob');
    }
    expect(gitIn(repo, 'show', `${branch}:src/clamp.js`)).toContain('Math.min(Math.max(value, low), high)');
    expect(result.integrationHead).toBe(gitIn(repo, 'rev-parse', branch));

    // The gate failure went round the fix loop with the gate output attached.
    const clampStatus = await worker.client.workflow.getHandle(streamWorkflowId(id, 'clamp')).query(streamStatusQuery);
    expect(clampStatus.ledger.map((e) => [e.step, e.kind, e.result, e.attempt])).toEqual([
      ['gates', 'quality_gate_failure', 'retrying', 1],
      ['gates', 'quality_gate_failure', 'recovered', 1],
    ]);

    // The agent runs and the passing gates committed the work themselves (ADR 0034): no stream
    // ran a commitWork, and each merge brought in the head of the stream's branch.
    for (const s of ['clamp', 'greet', 'sum']) {
      const events = (await worker.client.workflow.getHandle(streamWorkflowId(id, s)).fetchHistory()).events ?? [];
      const activities = events.flatMap((e) => e.activityTaskScheduledEventAttributes?.activityType?.name ?? []);
      expect(activities, s).toContain('runAgent');
      expect(activities, s).not.toContain('commitWork');
      const merge = gitIn(repo, 'log', '--first-parent', '--format=%H', '--grep', `merge stream ${s} into`, branch);
      expect(gitIn(repo, 'rev-parse', `${merge}^2`), s).toBe(gitIn(repo, 'rev-parse', `slipway/${id}/${s}`));
    }

    // Worktrees are gone, branches stay, the user's checkout is byte-for-byte the same.
    expect(existsSync(path.join(repo, '.slipway', 'worktrees', id))).toBe(false);
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
    expect(gitIn(repo, 'branch', '--list', `slipway/${id}/*`).split('\n')).toHaveLength(4);
    expect(pictureCheckout(repo)).toEqual(before);
    expect(gitIn(repo, 'check-ignore', '.slipway/worktrees/x')).toBe('.slipway/worktrees/x');
  });

  it('ends partial when one stream keeps failing its gate, keeping the merged work of the others', async () => {
    const repo = makeDemoRepo();
    dirtyTheCheckout(repo);
    const before = pictureCheckout(repo);
    const id = 'partial-run';
    const file = writeObjective(
      {
        objective: 'two good helpers and one that never passes',
        repository: repo,
        max_fix_iterations: 1,
        on_exhausted: 'fail',
        gates: [{ name: 'test', command: 'node --test' }],
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: [
          { id: 'one', task: 'helper one' },
          { id: 'two', task: 'helper two' },
          { id: 'broken', task: 'a helper whose test always fails' },
        ],
      },
      {
        one: [{ files: helperFiles('one') }],
        two: [{ files: helperFiles('two') }],
        broken: [{ files: helperFiles('broken', '(x) => x', 'assert.strictEqual(1, 2)') }],
      },
    );

    const result = await runObjective(file, repo, id);

    expect(result.outcome).toBe('partial');
    expect([...result.mergeOrder].sort()).toEqual(['one', 'two']);
    const broken = result.streams.find((s) => s.id === 'broken')!;
    expect(broken.phase).toBe('failed');
    expect(broken.iterations).toBe(2); // first try plus one fix iteration
    expect(broken.failure?.kind).toBe('quality_gate_failure');
    expect(broken.failure?.summary).toMatch(/fix loop exhausted after 2 iterations/);
    expect(mergedStreamsInGitOrder(repo, id)).toEqual(result.mergeOrder);
    expect(() => gitIn(repo, 'cat-file', '-t', `${integrationBranch(id)}:src/broken.js`)).toThrow();
    expect(pictureCheckout(repo)).toEqual(before);
  });

  it('never reports a stream merged whose work changed nothing: no_changes, no merge commit, objective partial', async () => {
    const repo = makeDemoRepo();
    const id = 'no-change-run';
    const file = writeObjective(
      {
        objective: 'one real helper and one stream whose builder changes nothing',
        repository: repo,
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: [
          { id: 'real', task: 'helper real' },
          { id: 'idle', task: 'a task the builder decides needs no change' },
        ],
      },
      { real: [{ files: helperFiles('real') }], idle: [{ files: {} }] },
    );

    const result = await runObjective(file, repo, id);

    expect(result.outcome).toBe('partial');
    expect(result.mergeOrder).toEqual(['real']);
    const idle = result.streams.find((s) => s.id === 'idle')!;
    expect(idle.phase).toBe('no_changes');
    expect(idle.failure?.summary).toMatch(/brings no change|changes nothing/);
    expect(mergedStreamsInGitOrder(repo, id)).toEqual(['real']);
  });

  it("starts a dependent stream from its dependency's merge commit once that merged", async () => {
    const repo = makeDemoRepo();
    const id = 'deps-run';
    const file = writeObjective(
      {
        objective: 'a helper and a second one that uses it',
        repository: repo,
        gates: [{ name: 'test', command: 'node --test' }],
        agents: {
          builder: { provider: 'script', command: `node ${PLAN_BUILDER}` },
          reviewer: { provider: 'script', command: `node ${DEMO_REVIEWER}` },
        },
        streams: [
          { id: 'double', task: 'uses base', depends_on: ['base'] },
          { id: 'base', task: 'the base helper' },
        ],
      },
      {
        base: [{ files: helperFiles('base', '(x) => x + 1', 'assert.strictEqual(base(1), 2)') }],
        // Only passes when src/base.js is present, i.e. when built on top of the merged dependency.
        double: [{ files: helperFiles('double', "(x) => require('./base').base(x) * 2", 'assert.strictEqual(double(1), 4)') }],
      },
    );
    const result = await runObjective(file, repo, id);
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toEqual(['base', 'double']);
    expect(result.streams.find((s) => s.id === 'double')!.iterations).toBe(1);
    // A commit, not a branch name an activity would resolve later (maybe mid-merge of another stream).
    const started = (await worker.client.workflow.getHandle(streamWorkflowId(id, 'double')).fetchHistory()).events![0].workflowExecutionStartedEventAttributes!;
    const [streamInput] = await decodeArrayFromPayloads(worker.client.options.loadedDataConverter, started.input?.payloads);
    const baseMerge = result.streams.find((s) => s.id === 'base')!.mergeCommit!;
    expect(baseMerge).toMatch(/^[0-9a-f]{40}$/);
    expect((streamInput as StreamInput).base).toBe(baseMerge);
  });

  it('sends a rejected review back to the builder with the findings', async () => {
    const repo = makeDemoRepo();
    const id = 'review-loop';
    const file = writeObjective(
      {
        objective: 'review loop',
        repository: repo,
        agents: {
          builder: { provider: 'script', command: `node ${PLAN_BUILDER}` },
          reviewer: { provider: 'script', command: `node ${DEMO_REVIEWER}` },
        },
        streams: [{ id: 'half', task: 'forgets the test at first' }],
      },
      {
        half: [
          { files: { 'src/half.js': 'module.exports = { half: (x) => x / 2 };\n' } },
          { files: helperFiles('half', '(x) => x / 2') },
        ],
      },
    );
    const result = await runObjective(file, repo, id);
    expect(result.outcome).toBe('completed');
    const status = await worker.client.workflow.getHandle(streamWorkflowId(id, 'half')).query(streamStatusQuery);
    expect(status.ledger.map((e) => `${e.kind}:${e.result}`)).toEqual(['review_rejection:retrying', 'review_rejection:recovered']);
    expect(status.iteration).toBe(2);
  });
});
