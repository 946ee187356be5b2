/**
 * Recovery and the human loop on the real Temporal server: exhaustion modes, guidance through
 * the CLI, merge-conflict rebuilds, post-merge gate failures, planner and approval.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { trustRepository } from '../config/trust';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import type { ObjectiveResult, ObjectiveStatus } from '../core/types';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { guidanceUpdate, streamStatusQuery } from '../workflows/stream';
import { slipway, waitFor } from './helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective, type Plan } from './helpers/objective';
import { gitIn, makeDemoRepo, pictureCheckout, PROJECT_ROOT } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

const PLANNER = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'planner.mjs');
const DEMO_REVIEWER = path.join(PROJECT_ROOT, 'examples', 'demo', 'agents', 'reviewer.mjs');

let worker: TestWorker;
let cliEnv: NodeJS.ProcessEnv;
beforeAll(async () => {
  worker = await startTestWorker();
  cliEnv = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue };
});
afterAll(async () => {
  await worker?.stop();
});

async function start(spec: Record<string, unknown>, plan: Plan | undefined, id: string) {
  const repo = (spec.repository as string | undefined) ?? makeDemoRepo();
  const file = writeObjective({ repository: repo, ...spec }, plan);
  await trustRepository(repo); // project blueprints written by the test are its own (`slipway trust`)
  const input = await loadObjectiveFile(file, { id });
  const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
  return { repo, dir: path.dirname(file), handle };
}

const status = (id: string) => worker.client.workflow.getHandle(objectiveWorkflowId(id)).query(objectiveStatusQuery);
const builder = { provider: 'script', command: `node ${PLAN_BUILDER}` };
const testGate = [{ name: 'test', command: 'node --test' }];
const failingHelper = (name: string) => helperFiles(name, '(x) => x', 'assert.strictEqual(1, 2)');

describe('exhaustion modes', () => {
  it('ask_human: blocks the stream, lists one escalation, refuses bad guidance, and resumes with good guidance', async () => {
    const id = 'ask-human';
    const { repo, dir, handle } = await start(
      {
        objective: 'one stream needs a human',
        max_fix_iterations: 1,
        gates: testGate,
        agents: { builder },
        streams: [
          { id: 'stuck', task: 'a helper the builder cannot get right alone' },
          { id: 'fine', task: 'an easy helper' },
        ],
      },
      { stuck: [{ files: failingHelper('stuck') }], 'stuck:guided': [{ files: helperFiles('stuck') }], fine: [{ files: helperFiles('fine') }] },
      id,
    );
    const before = pictureCheckout(repo);

    // Blocked: the objective shows `blocked`, the other stream goes on and merges.
    const blocked = await waitFor(async () => {
      const s = await status(id);
      return s.outcome === 'blocked' && s.mergeOrder.includes('fine') ? s : undefined;
    }, 'the stream to block and the other to merge');
    expect(blocked.streams.find((s) => s.id === 'stuck')).toMatchObject({ phase: 'blocked', blocked: { mailbox: 'builder-stuck', step: 'gates', kind: 'quality_gate_failure' } });

    // One escalation per blocked stream, with the attempts tried.
    const mail = await slipway(['mail', '--objective', id, '--json'], cliEnv);
    expect(mail.code).toBe(0);
    const escalations = JSON.parse(mail.stdout);
    expect(escalations).toHaveLength(1);
    expect(escalations[0]).toMatchObject({ mailbox: 'builder-stuck', streamId: 'stuck', kind: 'quality_gate_failure' });
    expect(escalations[0].attempts.map((a: { result: string }) => a.result)).toEqual(['retrying', 'blocked']);
    expect((await slipway(['mail', 'builder-stuck', '--objective', id], cliEnv)).stdout).toContain('slipway mail send builder-stuck');

    // Refusals: unknown agent, a stream that is not blocked, an unknown objective.
    const unknown = await slipway(['mail', 'send', 'builder-ghost', 'Hi', 'Do it', '--objective', id], cliEnv);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown agent "builder-ghost"');
    const notBlocked = await slipway(['mail', 'send', 'builder-fine', 'Hi', 'Do it', '--objective', id], cliEnv);
    expect(notBlocked.code).toBe(2);
    expect(notBlocked.stderr).toMatch(/stream "fine" is not blocked/);
    const noObjective = await slipway(['mail', 'send', 'builder-stuck', 'Hi', 'Do it', '--objective', 'nope'], cliEnv);
    expect(noObjective.code).toBe(2);
    expect(noObjective.stderr).toContain('no objective "nope"');

    // The stream's own update validator refuses a wrong mailbox and an empty body (nothing is applied).
    const stuck = worker.client.workflow.getHandle(streamWorkflowId(id, 'stuck'));
    await expect(stuck.executeUpdate(guidanceUpdate, { args: [{ agent: 'reviewer-stuck', subject: 's', body: 'b' }] })).rejects.toThrow(/Update failed|unknown agent/);
    await expect(stuck.executeUpdate(guidanceUpdate, { args: [{ agent: 'builder-stuck', subject: 's', body: '  ' }] })).rejects.toThrow();
    expect((await stuck.query(streamStatusQuery)).phase).toBe('blocked');

    // Good guidance: accepted, carried into the next attempt, and the run completes.
    const send = await slipway(['mail', 'send', 'builder-stuck', 'Fix the assertion', 'The test expects identity; return x.', '--objective', id], cliEnv);
    expect(send.stderr).toBe('');
    expect(send.code).toBe(0);
    expect(send.stdout).toContain('guidance delivered to builder-stuck');

    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    const ledger = (await worker.client.workflow.getHandle(streamWorkflowId(id, 'stuck')).query(streamStatusQuery)).ledger;
    expect(ledger.map((e) => e.result)).toEqual(['retrying', 'blocked', 'guidance_applied', 'recovered']);
    expect(ledger[2]).toMatchObject({ guidance: 'The test expects identity; return x.', summary: 'Fix the assertion' });
    expect(readFileSync(path.join(dir, 'calls.log'), 'utf8')).toMatch(/^stuck builder 3 quality_gate_failure guided$/m);
    expect(pictureCheckout(repo)).toEqual(before);
  });

  it('escalate: flags the stream as needing attention and lets the others finish (partial)', async () => {
    const id = 'escalate-run';
    const { handle } = await start(
      {
        objective: 'escalation',
        max_fix_iterations: 1,
        on_exhausted: 'escalate',
        gates: testGate,
        agents: { builder },
        streams: [{ id: 'bad', task: 'never passes' }, { id: 'good', task: 'passes' }],
      },
      { bad: [{ files: failingHelper('bad') }], good: [{ files: helperFiles('good') }] },
      id,
    );
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('partial');
    expect(result.needsAttention).toEqual(['bad']);
    expect(result.streams.find((s) => s.id === 'bad')).toMatchObject({ phase: 'escalated', failure: { kind: 'quality_gate_failure' } });
    expect(result.ledger.filter((e) => e.stream === 'bad').map((e) => e.result)).toEqual(['retrying', 'escalated']);
  });

  it('fail: the stream fails for good when its agent keeps crashing (retries from the profile, then fail)', async () => {
    const id = 'fail-run';
    const { handle, dir } = await start(
      {
        objective: 'a crashing agent',
        on_exhausted: 'fail',
        agents: { builder },
        streams: [{ id: 'crash', task: 'the agent exits 1' }],
      },
      { crash: [{ exit: 1 }] },
      id,
    );
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('failed');
    const crash = result.streams.find((s) => s.id === 'crash')!;
    expect(crash.failure?.kind).toBe('agent_runtime_transient');
    // build-review uses self_healing: 6 attempts of the builder activity.
    expect(readFileSync(path.join(dir, 'calls.log'), 'utf8').trim().split('\n')).toHaveLength(6);
    expect(result.ledger.at(-1)).toMatchObject({ kind: 'agent_runtime_transient', result: 'failed', attempt: 6, maxAttempts: 6 });
  }, 120_000);
});

describe('merge queue recovery', () => {
  it('rebuilds a conflicting stream on top of the integration branch and merges it again', async () => {
    const id = 'conflict-rebuild';
    const { repo, dir, handle } = await start(
      {
        objective: 'two streams edit the same line',
        max_parallel_streams: 1,
        agents: { builder },
        streams: [{ id: 'left', task: 'edit README' }, { id: 'right', task: 'edit README too' }],
      },
      {
        left: [{ files: { 'README.md': '# toolkit (left)\n' } }],
        // On the rebuild the builder sees the conflict and keeps both edits.
        right: [{ files: { 'README.md': '# toolkit (right)\n' } }, { files: { 'README.md': '# toolkit (left, right)\n' } }],
      },
      id,
    );
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toEqual(['left', 'right']);
    expect(gitIn(repo, 'show', `${integrationBranch(id)}:README.md`)).toBe('# toolkit (left, right)');
    const right = result.ledger.filter((e) => e.stream === 'right');
    expect(right.map((e) => `${e.kind}:${e.result}`)).toEqual(['merge_conflict:retrying', 'merge_conflict:recovered']);
    expect(right[0].summary).toContain('README.md');
    expect(readFileSync(path.join(dir, 'calls.log'), 'utf8')).toMatch(/^right builder 2 merge_conflict -$/m);
    // One merge commit per stream on the integration branch.
    expect(gitIn(repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(id)).split('\n')).toHaveLength(2);
  });

  it('reverts a merge whose post-merge gates fail and restarts the stream', async () => {
    const id = 'post-merge';
    const { repo, handle } = await start(
      {
        objective: 'post-merge gate',
        agents: { builder },
        post_merge_gates: [{ name: 'no-todo', command: '! grep -rq TODO src' }],
        streams: [{ id: 'todo', task: 'leaves a TODO at first' }],
      },
      {
        todo: [
          { files: { 'src/todo.js': '// TODO: finish\nmodule.exports = {};\n' } },
          { files: { 'src/todo.js': 'module.exports = { done: true };\n' } },
        ],
      },
      id,
    );
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.ledger.map((e) => `${e.kind}:${e.result}`)).toEqual(['post_merge_gate_failure:retrying', 'post_merge_gate_failure:recovered']);
    expect(gitIn(repo, 'show', `${integrationBranch(id)}:src/todo.js`)).not.toContain('TODO');
    // The reverted merge is gone from the integration branch: exactly one merge remains.
    expect(gitIn(repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(id)).split('\n')).toHaveLength(1);
  });
});

describe('planner and approval', () => {
  it('plans the streams, takes a rejection back to the planner, then runs the approved plan', async () => {
    const id = 'planned';
    const { dir, handle } = await start(
      {
        objective: 'add two helpers',
        gates: testGate,
        agents: { builder, planner: { provider: 'script', command: `node ${PLANNER}` }, reviewer: { provider: 'script', command: `node ${DEMO_REVIEWER}` } },
      },
      {
        _plans: [
          { streams: [{ id: 'everything', task: 'do it all at once' }] },
          { streams: [{ id: 'alpha', task: 'helper alpha' }, { id: 'beta', task: 'helper beta', depends_on: ['alpha'] }] },
        ],
        alpha: [{ files: helperFiles('alpha') }],
        beta: [{ files: helperFiles('beta') }],
      },
      id,
    );
    const first = await waitFor(async () => {
      const s = await status(id);
      return s.phase === 'awaiting_approval' ? s : undefined;
    }, 'the first plan');
    expect(first.pendingApproval?.streams.map((s) => s.id)).toEqual(['everything']);

    expect((await slipway(['reject', id], cliEnv)).code).toBe(2); // --reason is required
    const reject = await slipway(['reject', id, '--reason', 'split it into smaller streams'], cliEnv);
    expect(reject.code).toBe(0);

    const second = await waitFor(async () => {
      const s: ObjectiveStatus = await status(id);
      return s.phase === 'awaiting_approval' && s.pendingApproval?.streams.length === 2 ? s : undefined;
    }, 'the second plan');
    expect(second.pendingApproval?.streams.map((s) => s.id)).toEqual(['alpha', 'beta']);
    const approve = await slipway(['approve', id], cliEnv);
    expect(approve.code).toBe(0);
    expect((await slipway(['approve', id], cliEnv)).stderr).toMatch(/not waiting for approval/);

    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toEqual(['alpha', 'beta']);
    const plannerCalls = readFileSync(path.join(dir, 'planner.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
    expect(plannerCalls).toEqual([
      { call: 1, rejectedBecause: null },
      { call: 2, rejectedBecause: 'split it into smaller streams' },
    ]);
    expect(result.ledger.map((e) => `${e.step}:${e.kind}:${e.result}`)).toContain('approve:plan_rejection:retrying');
  });

  it('asks for approval of a plan from the file when require_approval is set', async () => {
    const id = 'approve-file';
    const { handle } = await start(
      { objective: 'approval', require_approval: true, agents: { builder }, streams: [{ id: 'one', task: 'one' }] },
      { one: [{ files: helperFiles('one') }] },
      id,
    );
    await waitFor(async () => (await status(id)).phase === 'awaiting_approval', 'approval phase');
    expect((await slipway(['approve', id], cliEnv)).code).toBe(0);
    expect(((await handle.result()) as ObjectiveResult).outcome).toBe('completed');
  });

  it('a rejected plan from the file goes to the planner, which works in the merger even when only git would have run there (ADR 0033)', async () => {
    const id = 'replan-file';
    const { handle } = await start(
      { objective: 'replan', require_approval: true, agents: { builder, planner: { provider: 'script', command: `node ${PLANNER}` } }, streams: [{ id: 'one', task: 'one' }] },
      { _plans: [{ streams: [{ id: 'two', task: 'two' }] }], two: [{ files: helperFiles('two') }] },
      id,
    );
    await waitFor(async () => (await status(id)).phase === 'awaiting_approval', 'approval of the file\'s plan');
    expect((await slipway(['reject', id, '--reason', 'another stream'], cliEnv)).code).toBe(0);
    const replanned = await waitFor(async () => {
      const s: ObjectiveStatus = await status(id);
      return s.phase === 'awaiting_approval' && s.pendingApproval?.streams[0]?.id === 'two' ? s : s.phase === 'done' ? s : undefined;
    }, 'the planner\'s plan');
    expect(replanned.phase).toBe('awaiting_approval');
    expect((await slipway(['approve', id], cliEnv)).code).toBe(0);
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(result.mergeOrder).toEqual(['two']);
  });
});

describe('blueprints from the project folder', () => {
  const writeBlueprint = (repo: string, name: string, yaml: string) => {
    mkdirSync(path.join(repo, '.slipway', 'blueprints'), { recursive: true });
    writeFileSync(path.join(repo, '.slipway', 'blueprints', `${name}.yaml`), yaml);
  };
  const streamBlueprint = (id: string, retry: string, buildRetry = '') => `
id: ${id}
level: stream
retry: { ${retry}, initial_interval_seconds: 0.05 }
on_exhausted: fail
steps:
  - id: build
    type: agent
    role: builder
    next: ready${buildRetry ? `\n    retry: { ${buildRetry} }` : ''}
  - id: ready
    type: deterministic
    action: signal_merge_ready
`;
  const objectiveBlueprint = (id: string, ref: string) => `
id: ${id}
level: objective
steps:
  - id: execute
    type: blueprint_ref
    ref: ${ref}
    foreach: work_item
    next: merge
  - id: merge
    type: deterministic
    action: merge_queue
`;

  it('uses each retry profile\'s attempt count, and a per-step override, for a crashing agent', async () => {
    const cases = [
      { name: 'strict', retry: 'profile: strict', expected: 2 },
      { name: 'balanced', retry: 'profile: balanced', expected: 4 },
      { name: 'self-healing', retry: 'profile: self_healing', expected: 6 },
      { name: 'override', retry: 'profile: self_healing', buildRetry: 'max_attempts: 3', expected: 3 },
    ];
    const runs = await Promise.all(
      cases.map(async (c) => {
        const repo = makeDemoRepo();
        writeBlueprint(repo, `crash-${c.name}`, streamBlueprint(`crash-${c.name}`, c.retry, c.buildRetry));
        writeBlueprint(repo, `run-${c.name}`, objectiveBlueprint(`run-${c.name}`, `crash-${c.name}`));
        const { handle, dir } = await start(
          { repository: repo, objective: c.name, blueprint: `run-${c.name}`, agents: { builder }, streams: [{ id: 'crash', task: 'exits 1' }] },
          { crash: [{ exit: 1 }] },
          `profile-${c.name}`,
        );
        return { c, dir, result: (await handle.result()) as ObjectiveResult };
      }),
    );
    for (const { c, dir, result } of runs) {
      expect(result.outcome, c.name).toBe('failed');
      expect(readFileSync(path.join(dir, 'calls.log'), 'utf8').trim().split('\n'), c.name).toHaveLength(c.expected);
      expect(result.ledger.at(-1), c.name).toMatchObject({ kind: 'agent_runtime_transient', result: 'failed', attempt: c.expected });
    }
  });

  it('runs a custom project blueprint that overrides build-review, without code changes', async () => {
    const repo = makeDemoRepo();
    // No gates and no review: build, then straight to the merge queue.
    writeBlueprint(repo, 'mine', streamBlueprint('build-review', 'profile: strict'));
    const { handle, dir } = await start(
      { repository: repo, objective: 'custom', gates: [{ name: 'never-run', command: 'exit 1' }], post_merge_gates: [], agents: { builder }, streams: [{ id: 'one', task: 'one' }] },
      { one: [{ files: helperFiles('one') }] },
      'custom-blueprint',
    );
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed'); // the failing gate is not part of this blueprint
    expect(readFileSync(path.join(dir, 'calls.log'), 'utf8').trim().split('\n')).toHaveLength(1);
  });

  it('rejects an objective whose project blueprint is malformed, naming the file and line, before anything starts', async () => {
    const repo = makeDemoRepo();
    writeBlueprint(repo, 'broken', 'id: broken\nlevel: stream\nsteps:\n  - id: build\n    type: agent\n    role: builder\n    next: nowhere\n');
    const file = writeObjective({ repository: repo, objective: 'x', agents: { builder }, streams: [{ id: 'a', task: 'a' }] });
    const run = await slipway(['run', file, '--id', 'bad-blueprint'], cliEnv);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(/broken\.yaml:7:\d+: step build: next: unknown step "nowhere"/);
    await expect(worker.client.workflow.getHandle('objective:bad-blueprint').describe()).rejects.toThrow(/not found/i);
  });
});

describe('sandbox failures', () => {
  it('a sandbox that cannot be created fails its stream as sandbox_failure after retries; the others go on', async () => {
    const repo = makeDemoRepo();
    // One stream at a time, `ok` first. While it runs, a branch below `blocked`'s branch name is
    // made, so `git worktree add -b slipway/<id>/blocked` fails when its turn comes. (Made before
    // the start, the objective would be refused: its id's branches must not exist, ADR 0008.)
    const { handle } = await start(
      { repository: repo, objective: 'one sandbox cannot be made', agents: { builder }, max_parallel_streams: 1, streams: [{ id: 'ok', task: 'y' }, { id: 'blocked', task: 'x' }] },
      { ok: [{ files: helperFiles('ok') }] },
      'sandbox-fail',
    );
    await waitFor(async () => ((await handle.query(objectiveStatusQuery)).streams.find((v) => v.id === 'ok')?.phase ?? 'waiting') !== 'waiting', 'the first stream to start', 60_000);
    gitIn(repo, 'branch', 'slipway/sandbox-fail/blocked/x', 'main');
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('partial');
    expect(result.streams.find((s) => s.id === 'blocked')).toMatchObject({ phase: 'failed', failure: { kind: 'sandbox_failure' } });
    expect(result.ledger.find((e) => e.stream === 'blocked')).toMatchObject({ kind: 'sandbox_failure', result: 'failed' });
  }, 120_000);

  it('an objective whose integration branch cannot be prepared ends failed with the reason, starting no stream', async () => {
    const repo = makeDemoRepo();
    gitIn(repo, 'branch', 'slipway/prep-fail/integration/x');
    const { handle } = await start({ repository: repo, objective: 'x', agents: { builder }, streams: [{ id: 'a', task: 'a' }] }, {}, 'prep-fail');
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('failed');
    expect(result.error).toMatch(/could not prepare the integration branch/);
    expect(result.streams.every((s) => s.phase === 'waiting')).toBe(true);
  }, 120_000);
});
