/**
 * The budget guardrail end to end: the real Temporal test server and worker, real git, and the
 * fake agent speaking Claude Code's output (test/fixtures/agents/fake-agent.mjs: $0.0125 and
 * 1,200 tokens a fresh run). What is asserted is what the agent really did: the fake logs every
 * start, so "the run did not start" is a count of its calls, not a workflow's say-so.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { WorkflowUpdateFailedError } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import { SlipwayCostUsd } from '../core/search-attributes';
import type { ObjectiveResult, ObjectiveStatus } from '../core/types';
import { budgetRaiseUpdate, objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { slipway, waitFor } from './helpers/cli';
import { writeObjective } from './helpers/objective';
import { makeDemoRepo, PROJECT_ROOT } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { trustRepository } from '../config/trust';

const FAKE = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'fake-agent.mjs');
const builder = (extra: Record<string, unknown> = {}) => ({ provider: 'claude-code', command: `node ${FAKE} --format claude`, ...extra });
const RUN_COST = 0.0125;

let worker: TestWorker;
let cliEnv: NodeJS.ProcessEnv;
beforeAll(async () => {
  worker = await startTestWorker();
  cliEnv = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue };
});
afterAll(async () => {
  await worker?.stop();
});

/** Starts an objective whose fake agent follows `plan` (found as fake-plan.json beside the objective file). */
async function start(id: string, spec: Record<string, unknown>, plan: Record<string, unknown>, projectConfig?: string) {
  const repo = makeDemoRepo();
  if (projectConfig !== undefined) {
    mkdirSync(path.join(repo, '.slipway'), { recursive: true });
    writeFileSync(path.join(repo, '.slipway', 'config.yaml'), projectConfig);
    await trustRepository(repo);
  }
  const file = writeObjective({ repository: repo, objective: 'add helpers', ...spec });
  writeFileSync(path.join(path.dirname(file), 'fake-plan.json'), JSON.stringify(plan));
  const input = await loadObjectiveFile(file, { id });
  const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
  const calls = (key: string): number => {
    try {
      return readFileSync(path.join(path.dirname(file), 'fake-calls.jsonl'), 'utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as { key: string; event: string })
        .filter((c) => c.key === key && c.event === 'start').length;
    } catch {
      return 0;
    }
  };
  const status = () => handle.query(objectiveStatusQuery);
  const blocked = (stream: string) => waitFor(async () => (await status()).streams.find((s) => s.id === stream && s.blocked), `stream ${stream} blocked`, 120_000);
  /** The fake agent's log lines after its `start` ones (`turn`, `finished`, ...). */
  const events = () => {
    const log = path.join(path.dirname(file), 'fake-calls.jsonl');
    return existsSync(log) ? readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as { key: string; event: string; call: number; n?: number; pid: number }) : [];
  };
  return { handle, calls, events, dir: path.dirname(file), status, blocked, result: () => handle.result() as Promise<ObjectiveResult> };
}

const helper = (name: string) => ({ [`src/${name}.js`]: `module.exports = { ${name}: (x) => x };\n` });
const sumOfRuns = (s: ObjectiveStatus) => (s.agentRuns ?? []).reduce((sum, r) => sum + (r.costUsd ?? 0), 0);

describe('budget guardrail', () => {
  it('a stream whose budget is spent blocks before its next run (mail shows it), bad raises are refused, a raise lets it finish; spend is the sum of its runs', async () => {
    const id = 'budget-block';
    const run = await start(
      id,
      { agents: { builder: builder({ max_iterations: 3 }) }, streams: [{ id: 'greet', task: 'add greet' }], budget: { stream: { usd: 0.02 } } },
      { 'builder:greet': [{ files: helper('greet'), say: 'wrote greet' }, { say: 'polished' }, { say: 'done' }] },
    );
    const view = await run.blocked('greet');
    expect(view.blocked).toMatchObject({ kind: 'budget_exhausted', mailbox: 'builder-greet', summary: 'stream greet spent $0.0250 of its $0.0200 budget' });
    // Two runs: the first left $0.0075, so the second started; the third was held back.
    expect(run.calls('builder:greet')).toBe(2);

    const mail = await slipway(['mail', '--objective', id, '--json'], cliEnv);
    expect(mail.code, mail.stderr).toBe(0);
    expect(JSON.parse(mail.stdout)).toEqual([expect.objectContaining({ streamId: 'greet', kind: 'budget_exhausted', summary: 'stream greet spent $0.0250 of its $0.0200 budget' })]);
    const mailText = await slipway(['mail', '--objective', id], cliEnv);
    expect(mailText.stdout).toContain(`raise: slipway budget raise ${id} --stream greet --usd N`);

    // Refused by the Update's validator, each with a clear reason; nothing changes.
    const below = await slipway(['budget', 'raise', id, '--stream', 'greet', '--usd', '0.02'], cliEnv);
    expect(below.code).toBe(2);
    expect(below.stderr).toContain('refused: --usd 0.02 is not above what stream greet already spent ($0.0250); give a higher limit');
    const zero = await slipway(['budget', 'raise', id, '--stream', 'greet', '--tokens', '0'], cliEnv);
    expect(zero.code).toBe(2);
    expect(zero.stderr).toContain('refused: --tokens must be a positive whole number, got 0');
    const notNumber = await slipway(['budget', 'raise', id, '--usd', 'lots'], cliEnv);
    expect(notNumber.code).toBe(2);
    expect(notNumber.stderr).toContain('--usd must be a number, got "lots"');
    const unknown = await slipway(['budget', 'raise', id, '--stream', 'nope', '--usd', '5'], cliEnv);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('unknown stream "nope"');
    await expect(run.handle.executeUpdate(budgetRaiseUpdate, { args: [{ stream: 'greet', usd: -1 }] })).rejects.toBeInstanceOf(WorkflowUpdateFailedError);
    expect(run.calls('builder:greet')).toBe(2);
    expect((await run.status()).streams[0].blocked?.kind).toBe('budget_exhausted');

    const raised = await slipway(['budget', 'raise', id, '--stream', 'greet', '--usd', '1'], cliEnv);
    expect(raised.code, raised.stderr).toBe(0);
    expect(raised.stdout).toContain(`budget of stream greet of ${id} is now $1.00`);

    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect(run.calls('builder:greet')).toBe(3);
    expect(result.usage.runs).toBe(3);
    expect(result.usage.costUsd).toBeCloseTo(3 * RUN_COST, 10);
    expect(result.usage.costUsd).toBeCloseTo(sumOfRuns(result), 10);
    expect(result.budget?.streams).toEqual({ greet: { usd: 1 } });
    expect(result.ledger.map((e) => [e.stream, e.kind, e.result])).toEqual([['greet', 'budget_exhausted', 'blocked']]);

    // The spend as a number: the SlipwayCostUsd search attribute, queryable and in `slipway list`.
    const described = await run.handle.describe();
    expect(described.typedSearchAttributes.get(SlipwayCostUsd)).toBeCloseTo(3 * RUN_COST, 10);
    const found = await waitFor(async () => {
      const ids: string[] = [];
      for await (const wf of worker.client.workflow.list({ query: `SlipwayKind = "objective" AND SlipwayCostUsd > 0.03 AND WorkflowId = "${objectiveWorkflowId(id)}"` })) ids.push(wf.workflowId);
      return ids.length > 0 && ids;
    }, 'the objective found by its cost');
    expect(found).toEqual([objectiveWorkflowId(id)]);
    const listed = await waitFor(async () => {
      const rows = JSON.parse((await slipway(['list', '--json', '--limit', '500'], cliEnv)).stdout) as Array<{ objectiveId: string; costUsd?: number }>;
      return rows.find((r) => r.objectiveId === id && r.costUsd !== undefined);
    }, 'the objective listed with its cost');
    expect(listed.costUsd).toBeCloseTo(3 * RUN_COST, 10);
    const text = await slipway(['list', '--limit', '500'], cliEnv);
    expect(text.stdout).toMatch(new RegExp(`${id}\\s+completed\\s+completed\\s+\\$0\\.0375`));
  }, 240_000); // many CLI runs: slow on a loaded machine, no timing asserted

  it('on_exhausted: fail ends the stream as failed with budget_exhausted instead of a next run', async () => {
    const run = await start(
      'budget-fail',
      { agents: { builder: builder({ max_iterations: 3 }) }, streams: [{ id: 'greet', task: 'add greet' }], budget: { stream: { tokens: 1000 }, on_exhausted: 'fail' } },
      { 'builder:greet': [{ files: helper('greet') }, { say: 'more' }] },
    );
    const result = await run.result();
    expect(run.calls('builder:greet')).toBe(1);
    expect(result.outcome).toBe('failed');
    expect(result.streams[0]).toMatchObject({ phase: 'failed', failure: { kind: 'budget_exhausted', summary: 'stream greet spent 1,200 of its 1,000 tokens budget' } });
    expect(result.usage).toMatchObject({ runs: 1, inputTokens: 1000, outputTokens: 200 });
  });

  it("on_exhausted: fail with the objective's limit: the stream's next run is refused by the objective, the stream and the objective fail", async () => {
    const run = await start(
      'budget-objective-fail',
      { agents: { builder: builder({ max_iterations: 3 }) }, streams: [{ id: 'greet', task: 'add greet' }], budget: { objective: { usd: 0.01 }, on_exhausted: 'fail' } },
      { 'builder:greet': [{ files: helper('greet') }, { say: 'more' }] },
    );
    const result = await run.result();
    expect(run.calls('builder:greet')).toBe(1);
    expect(result.outcome).toBe('failed');
    expect(result.streams[0]).toMatchObject({ phase: 'failed', failure: { kind: 'budget_exhausted', summary: 'objective budget-objective-fail spent $0.0125 of its $0.0100 budget' } });
    expect(result.usage.costUsd).toBeCloseTo(sumOfRuns(result), 10);
  });

  it("the objective's limit holds back a stream started after it was spent, until the objective's limit is raised", async () => {
    const run = await start(
      'budget-objective',
      {
        max_parallel_streams: 1,
        agents: { builder: builder({ max_iterations: 2 }) },
        streams: [
          { id: 'first', task: 'add first' },
          { id: 'second', task: 'add second', depends_on: ['first'] },
        ],
        budget: { objective: { usd: 0.02 } },
      },
      { 'builder:first': [{ files: helper('first') }, { say: 'more' }], 'builder:second': [{ files: helper('second') }, { say: 'more' }] },
    );
    const view = await run.blocked('second');
    expect(view.blocked).toMatchObject({ kind: 'budget_exhausted', summary: 'objective budget-objective spent $0.0250 of its $0.0200 budget' });
    expect(run.calls('builder:first')).toBe(2); // a run in flight, and the loop it is part of, may finish
    expect(run.calls('builder:second')).toBe(0);

    const refused = await slipway(['budget', 'raise', 'budget-objective', '--usd', '0.025'], cliEnv);
    expect(refused.stderr).toContain('refused: --usd 0.025 is not above what objective budget-objective already spent ($0.0250)');
    const raised = await slipway(['budget', 'raise', 'budget-objective', '--usd', '0.5'], cliEnv);
    expect(raised.code, raised.stderr).toBe(0);

    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect(run.calls('builder:second')).toBe(2);
    expect(result.usage.costUsd).toBeCloseTo(4 * RUN_COST, 10);
    expect(result.usage.costUsd).toBeCloseTo(sumOfRuns(result), 10);
  });

  it("the objective's limit with two streams running: both block before their next run (the first to ask waits for the other's run in flight), a raise lets both finish", async () => {
    const id = 'budget-two';
    const firstRun = (name: string) => ({ turns: [{ usage: { input: 100, output: 10 } }, { usage: { input: 100, output: 10 } }], files: helper(name) });
    const run = await start(
      id,
      {
        max_parallel_streams: 2,
        agents: { builder: builder({ max_iterations: 3 }) },
        streams: [
          { id: 'left', task: 'add left' },
          { id: 'right', task: 'add right' },
        ],
        budget: { objective: { usd: 0.02 } },
      },
      { 'builder:left': [firstRun('left'), { say: 'more' }, { say: 'done' }], 'builder:right': [firstRun('right'), { say: 'more' }, { say: 'done' }] },
    );
    // Both first runs are going (each waits at its gate after turn 1); then both may end, in any order.
    await waitFor(async () => ['left', 'right'].every((s) => run.events().some((e) => e.key === `builder:${s}` && e.event === 'turn' && e.n === 1)), 'both first runs in flight', 120_000);
    writeFileSync(path.join(run.dir, 'turn-1.go'), '');
    const reason = `objective ${id} spent $0.0250 of its $0.0200 budget`;
    for (const s of ['left', 'right']) expect((await run.blocked(s)).blocked).toMatchObject({ kind: 'budget_exhausted', summary: reason });
    // One run each: whichever ended first was held until the other's cost was known, so neither started a second.
    expect([run.calls('builder:left'), run.calls('builder:right')]).toEqual([1, 1]);

    const mail = JSON.parse((await slipway(['mail', '--objective', id, '--json'], cliEnv)).stdout) as Array<{ streamId: string; kind: string; summary: string }>;
    expect(mail.map((m) => [m.streamId, m.kind, m.summary]).sort()).toEqual([
      ['left', 'budget_exhausted', reason],
      ['right', 'budget_exhausted', reason],
    ]);
    const spentSoFar = await run.status();
    expect(spentSoFar.usage.costUsd).toBeCloseTo(2 * RUN_COST, 10);
    expect(spentSoFar.usage.costUsd).toBeCloseTo(sumOfRuns(spentSoFar), 10);

    const raised = await slipway(['budget', 'raise', id, '--usd', '1'], cliEnv);
    expect(raised.code, raised.stderr).toBe(0);
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect([run.calls('builder:left'), run.calls('builder:right')]).toEqual([3, 3]);
    expect(result.usage.runs).toBe(6);
    expect(result.usage.costUsd).toBeCloseTo(6 * RUN_COST, 10);
    expect(result.usage.costUsd).toBeCloseTo(sumOfRuns(result), 10);
    expect(result.ledger.map((e) => [e.stream, e.kind, e.result]).sort()).toEqual([
      ['left', 'budget_exhausted', 'blocked'],
      ['right', 'budget_exhausted', 'blocked'],
    ]);
  }, 240_000);

  it('a provider that reports no cost gets an estimate from the price table (project override), flagged on the run, the totals and in status', async () => {
    const id = 'budget-estimate';
    const run = await start(
      id,
      {
        agents: {
          builder: { provider: 'codex', command: `node ${FAKE} --format codex`, model: 'house-model' },
          reviewer: builder(),
        },
        streams: [{ id: 'greet', task: 'add greet' }],
      },
      { 'builder:greet': [{ files: helper('greet'), signal: true }], 'reviewer:greet': [{ verdict: { verdict: 'approve', summary: 'fine', findings: [] } }] },
      'prices:\n  house-model: { input: 2, output: 8, cached_input: 0.5 }\n',
    );
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    const [built, reviewed] = result.agentRuns ?? [];
    // Codex's 1,000 input tokens hold 400 cached; 200 out.
    expect(built).toMatchObject({ role: 'builder', provider: 'codex', inputTokens: 1000, cachedTokens: 400, outputTokens: 200, estimated: true });
    expect(built.costUsd).toBeCloseTo((600 * 2 + 400 * 0.5 + 200 * 8) / 1e6, 12);
    expect(reviewed).toMatchObject({ role: 'reviewer', provider: 'claude-code', costUsd: RUN_COST });
    expect(reviewed).not.toHaveProperty('estimated');
    expect(result.usage).toMatchObject({ runs: 2, estimated: true });
    expect(result.usage.costUsd).toBeCloseTo(built.costUsd! + RUN_COST, 12);

    const status = await slipway(['status', id], cliEnv);
    expect(status.code, status.stderr).toBe(0);
    expect(status.stdout).toMatch(/greet\s+merged.*cost=~\$0\.0155 \(estimated\)/);
    expect(status.stdout).toContain('builder (codex house-model): 1,000 in (400 cached) / 200 out tokens, ~$0.0030 (estimated)');
  });

  it('hard_limit: a run in flight is stopped once its reported usage reaches the allowance, its usage so far is the spend, the stream blocks, a raise lets it go on', async () => {
    const id = 'budget-hard';
    const turn = { usage: { input: 800, output: 200, cost: 0.01 } }; // 1,000 tokens a model call
    const run = await start(
      id,
      {
        agents: { builder: { provider: 'opencode', command: `node ${FAKE} --format opencode`, max_iterations: 1 } },
        streams: [{ id: 'greet', task: 'add greet' }],
        budget: { stream: { tokens: 1500 }, hard_limit: true },
      },
      { 'builder:greet': [{ turns: [turn, turn, { ...turn, files: { 'late.txt': 'after turn 2\n' } }] }, { files: helper('greet'), signal: true }] },
    );
    // Turn 2 may follow turn 1 (1,000 < 1,500); turn 3 waits on a gate the test opens only after the stop.
    writeFileSync(path.join(run.dir, 'turn-1.go'), '');
    const view = await run.blocked('greet');
    expect(view.blocked).toMatchObject({ kind: 'budget_exhausted', summary: 'stream greet reached its budget during this run (2,000 of the 1,500 tokens left); the run was stopped (hard_limit)' });
    const first = run.events().filter((e) => e.key === 'builder:greet' && e.call === 1);
    expect(first.filter((e) => e.event === 'turn').map((e) => e.n)).toEqual([1, 2]);
    // The agent is gone: opening the gate to turn 3 now changes nothing.
    const pid = first[0].pid;
    await waitFor(async () => {
      try {
        process.kill(pid, 0);
        return false;
      } catch {
        return true;
      }
    }, 'the stopped agent gone');
    writeFileSync(path.join(run.dir, 'turn-2.go'), '');
    expect(run.events().some((e) => e.call === 1 && (e.event === 'finished' || e.n === 3))).toBe(false);

    const stopped = await run.status();
    expect(stopped.agentRuns).toEqual([expect.objectContaining({ stream: 'greet', role: 'builder', inputTokens: 1600, outputTokens: 400, costUsd: 0.02, result: 'budget_stopped' })]);
    expect(stopped.usage).toMatchObject({ runs: 1, inputTokens: 1600, outputTokens: 400 });
    expect(stopped.usage.costUsd).toBeCloseTo(0.02, 12);

    const raised = await slipway(['budget', 'raise', id, '--stream', 'greet', '--tokens', '100000'], cliEnv);
    expect(raised.code, raised.stderr).toBe(0);
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect(run.calls('builder:greet')).toBe(2);
    expect(run.events().some((e) => e.call === 1 && e.n === 3)).toBe(false);
    expect(result.usage.runs).toBe(2);
    expect(result.usage.inputTokens).toBe((result.agentRuns ?? []).reduce((sum, r) => sum + r.inputTokens, 0));
    expect(result.ledger.map((e) => [e.stream, e.kind, e.result])).toEqual([['greet', 'budget_exhausted', 'blocked']]);
  }, 240_000);

  it('hard_limit stops Claude Code mid-run from its per-message usage (each message counted once), keeping what it spent so far', async () => {
    const id = 'budget-hard-claude';
    const turn = { usage: { input: 800, cached: 300, output: 200 } }; // 1,000 tokens a model call, printed over two lines
    const run = await start(
      id,
      {
        agents: { builder: builder({ max_iterations: 1 }) },
        streams: [{ id: 'greet', task: 'add greet' }],
        budget: { stream: { tokens: 1500 }, hard_limit: true },
      },
      { 'builder:greet': [{ turns: [turn, turn, { ...turn, files: { 'late.txt': 'after turn 2\n' } }] }, { files: helper('greet'), signal: true }] },
    );
    // Turn 2 may follow turn 1 (1,000 < 1,500, though its two lines would say 2,000 if summed);
    // turn 3 waits on a gate the test opens only after the stop.
    writeFileSync(path.join(run.dir, 'turn-1.go'), '');
    const view = await run.blocked('greet');
    expect(view.blocked).toMatchObject({ kind: 'budget_exhausted', summary: 'stream greet reached its budget during this run (2,000 of the 1,500 tokens left); the run was stopped (hard_limit)' });
    const first = run.events().filter((e) => e.key === 'builder:greet' && e.call === 1);
    expect(first.filter((e) => e.event === 'turn').map((e) => e.n)).toEqual([1, 2]);
    const pid = first[0].pid;
    await waitFor(async () => {
      try {
        process.kill(pid, 0);
        return false;
      } catch {
        return true;
      }
    }, 'the stopped agent gone');
    writeFileSync(path.join(run.dir, 'turn-2.go'), '');
    expect(run.events().some((e) => e.call === 1 && (e.event === 'finished' || e.n === 3))).toBe(false);

    // No final result came: the run's usage is its running total, the stream's spend.
    const stopped = await run.status();
    expect(stopped.agentRuns).toEqual([expect.objectContaining({ stream: 'greet', role: 'builder', inputTokens: 1600, outputTokens: 400, result: 'budget_stopped' })]);
    expect(stopped.usage).toMatchObject({ runs: 1, inputTokens: 1600, outputTokens: 400 });

    const raised = await slipway(['budget', 'raise', id, '--stream', 'greet', '--tokens', '100000'], cliEnv);
    expect(raised.code, raised.stderr).toBe(0);
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect(run.calls('builder:greet')).toBe(2);
    expect(result.usage.inputTokens).toBe((result.agentRuns ?? []).reduce((sum, r) => sum + r.inputTokens, 0));
  }, 240_000);

  it('hard_limit with a usd limit and only tokens reported: the price table estimates the cost mid-run; on_exhausted: fail fails the stream', async () => {
    const turn = { usage: { input: 800, output: 200 } }; // no cost reported; at $2 in / $8 out per million: $0.0032 a model call
    const run = await start(
      'budget-hard-usd',
      {
        agents: { builder: { provider: 'opencode', command: `node ${FAKE} --format opencode`, model: 'house/house-model', max_iterations: 1 } },
        streams: [{ id: 'greet', task: 'add greet' }],
        budget: { stream: { usd: 0.005 }, hard_limit: true, on_exhausted: 'fail' },
      },
      { 'builder:greet': [{ turns: [turn, turn, turn] }] },
      'prices:\n  house-model: { input: 2, output: 8 }\n',
    );
    writeFileSync(path.join(run.dir, 'turn-1.go'), '');
    const result = await run.result();
    expect(result.outcome).toBe('failed');
    expect(result.streams[0]).toMatchObject({ phase: 'failed', failure: { kind: 'budget_exhausted', summary: 'stream greet reached its budget during this run ($0.0064 of the $0.0050 left); the run was stopped (hard_limit)' } });
    expect(run.events().filter((e) => e.event === 'turn').map((e) => e.n)).toEqual([1, 2]);
    expect(result.agentRuns).toEqual([expect.objectContaining({ inputTokens: 1600, outputTokens: 400, estimated: true, result: 'budget_stopped' })]);
    expect(result.usage.costUsd).toBeCloseTo(0.0064, 12);
  }, 240_000);
});
