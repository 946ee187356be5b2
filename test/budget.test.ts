/**
 * The budget guardrail without a server: the `budget:` section of the objective file and of
 * `.slipway/config.yaml` (merge, errors naming file, line and field), and the pure checks the
 * workflows use (core/budget.ts): when a limit is spent, and which raises the Update refuses.
 */
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile, ObjectiveFileError } from '../config/objective-file';
import { trustRepository } from '../config/trust';
import { allowanceUsed, budgetExhausted, objectiveLease, raisedLimit, raiseProblems, runAllowance, streamBudgetBlock, streamBudgetOf } from '../core/budget';
import { emptyTotals, type TokenTotals } from '../core/types';
import { estimateCostUsd, MODEL_PRICES, priceFor } from '../core/prices';
import { addRunUsage, addTotals, formatUsage } from '../core/usage';

const lines = (...ls: string[]) => `${ls.join('\n')}\n`;
const HEAD = ['objective: x', 'repository: ./repo', 'agents:', '  builder: { provider: script, command: ./b.sh }', 'streams:', '  - id: a', '    task: do a'];

let root: string;
let counter = 0;
beforeAll(async () => {
  root = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-budget-')));
  process.env.SLIPWAY_HOME = path.join(root, 'home');
});
afterAll(async () => {
  if (root) await fs.rm(root, { recursive: true, force: true });
});

async function project(objective: string, config?: string): Promise<{ file: string; repo: string }> {
  const dir = path.join(root, `p${++counter}`);
  const repo = path.join(dir, 'repo');
  await fs.mkdir(repo, { recursive: true });
  const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: repo, stdio: 'pipe' });
  git('init', '-q', '-b', 'main');
  await fs.writeFile(path.join(repo, 'README.md'), '# r\n');
  git('add', '.');
  git('commit', '-q', '-m', 'init');
  if (config !== undefined) {
    await fs.mkdir(path.join(repo, '.slipway'), { recursive: true });
    await fs.writeFile(path.join(repo, '.slipway', 'config.yaml'), config);
  }
  const file = path.join(dir, 'objective.yaml');
  await fs.writeFile(file, objective);
  await trustRepository(repo);
  return { file, repo };
}

async function problems(file: string): Promise<string[]> {
  try {
    await loadObjectiveFile(file);
  } catch (e) {
    expect(e).toBeInstanceOf(ObjectiveFileError);
    return (e as Error).message.split('\n');
  }
  throw new Error(`expected ${file} to be rejected`);
}

const spent = (over: Partial<TokenTotals>): TokenTotals => ({ ...emptyTotals(), ...over });

describe('budget: in the objective file and .slipway/config.yaml', () => {
  it('no budget anywhere: the input has none', async () => {
    const { file } = await project(lines(...HEAD));
    expect((await loadObjectiveFile(file)).budget).toBeUndefined();
  });

  it('the objective file alone: limits resolved, on_exhausted defaults to block', async () => {
    const { file } = await project(lines(...HEAD, 'budget:', '  objective: { usd: 5 }', '  stream: { usd: 1.5, tokens: 200000 }'));
    expect((await loadObjectiveFile(file)).budget).toEqual({ objective: { usd: 5 }, stream: { usd: 1.5, tokens: 200000 }, onExhausted: 'block' });
  });

  it("the file's fields win one by one over the config's", async () => {
    const { file } = await project(lines(...HEAD, 'budget:', '  stream: { tokens: 1000 }'), lines('budget:', '  objective: { usd: 20 }', '  stream: { usd: 2 }', '  on_exhausted: fail'));
    expect((await loadObjectiveFile(file)).budget).toEqual({ objective: { usd: 20 }, stream: { tokens: 1000 }, onExhausted: 'fail' });
  });

  it('the config alone gives every objective of the repository its budget', async () => {
    const { file } = await project(lines(...HEAD), lines('budget:', '  objective: { tokens: 5000000 }'));
    expect((await loadObjectiveFile(file)).budget).toEqual({ objective: { tokens: 5000000 }, onExhausted: 'block' });
  });

  it('invalid budgets in the objective file are refused naming line and field, nothing started', async () => {
    const { file } = await project(lines(...HEAD, 'budget:', '  objective: { usd: -1 }', '  stream: {}', '  on_exhausted: later', '  weekly: 3'));
    const msgs = await problems(file);
    expect(msgs).toEqual(
      expect.arrayContaining([
        expect.stringMatching(new RegExp(`^${file}:9:\\d+: budget\\.objective\\.usd: .*(greater than 0|positive|>0)`, 'i')),
        `${file}:10:11: budget.stream: give "usd", "tokens" or both`,
        expect.stringMatching(new RegExp(`^${file}:11:\\d+: budget\\.on_exhausted: .*"block".*"fail"`)),
        expect.stringMatching(new RegExp(`^${file}:12:\\d+: budget\\.weekly: unknown key "weekly"`)),
      ]),
    );
  });

  it('hard_limit: carried when true, absent by default and when false; the config can set it', async () => {
    const { file } = await project(lines(...HEAD, 'budget:', '  stream: { tokens: 1000 }', '  hard_limit: true'));
    expect((await loadObjectiveFile(file)).budget).toEqual({ stream: { tokens: 1000 }, onExhausted: 'block', hardLimit: true });
    const { file: off } = await project(lines(...HEAD, 'budget:', '  stream: { tokens: 1000 }', '  hard_limit: false'), lines('budget:', '  hard_limit: true'));
    expect((await loadObjectiveFile(off)).budget).toEqual({ stream: { tokens: 1000 }, onExhausted: 'block' });
    const { file: fromConfig } = await project(lines(...HEAD, 'budget:', '  stream: { usd: 1 }'), lines('budget:', '  hard_limit: true'));
    expect((await loadObjectiveFile(fromConfig)).budget).toEqual({ stream: { usd: 1 }, onExhausted: 'block', hardLimit: true });
  });

  it('a hard_limit that is not true or false is refused naming file, line and field', async () => {
    const { file } = await project(lines(...HEAD, 'budget:', '  stream: { usd: 1 }', '  hard_limit: yes please'));
    expect(await problems(file)).toEqual([`${file}:10:15: budget.hard_limit: expected true or false, got "yes please"`]);
    const { file: obj, repo } = await project(lines(...HEAD), lines('budget:', '  hard_limit: 1'));
    const config = path.join(repo, '.slipway', 'config.yaml');
    expect(await problems(obj)).toEqual([`${config}:2:15: budget.hard_limit: expected true or false, got 1`]);
  });

  it('a fractional token limit is refused', async () => {
    const { file } = await project(lines(...HEAD, 'budget:', '  stream: { tokens: 10.5 }'));
    expect(await problems(file)).toEqual([expect.stringMatching(new RegExp(`^${file}:9:\\d+: budget\\.stream\\.tokens: `))]);
  });

  it('an invalid budget in .slipway/config.yaml is refused naming that file, line and field', async () => {
    const { file, repo } = await project(lines(...HEAD), lines('budget:', '  objective: { usd: "ten" }'));
    const config = path.join(repo, '.slipway', 'config.yaml');
    expect(await problems(file)).toEqual([expect.stringMatching(new RegExp(`^${config}:2:\\d+: budget\\.objective\\.usd: `))]);
  });
});

describe('budget checks (core/budget.ts)', () => {
  it.each([
    { name: 'below the usd limit', limit: { usd: 1 }, spent: spent({ costUsd: 0.99 }), reason: undefined },
    { name: 'at the usd limit: no new run', limit: { usd: 1 }, spent: spent({ costUsd: 1 }), reason: 'stream a spent $1.00 of its $1.00 budget' },
    { name: 'tokens count input (with cached) plus output', limit: { tokens: 1000 }, spent: spent({ inputTokens: 800, cachedTokens: 700, outputTokens: 200 }), reason: 'stream a spent 1,000 of its 1,000 tokens budget' },
    { name: 'either figure spent is enough', limit: { usd: 10, tokens: 100 }, spent: spent({ inputTokens: 150, costUsd: 0.01 }), reason: 'stream a spent 150 of its 100 tokens budget' },
    { name: 'no limit: never spent', limit: undefined, spent: spent({ costUsd: 1e6 }), reason: undefined },
  ])('$name', ({ limit, spent: s, reason }) => {
    expect(budgetExhausted(limit, s, 'stream a')).toBe(reason);
  });

  it("a stream is held by its own limit first, then by the objective's", () => {
    expect(streamBudgetBlock(undefined, 'a', spent({ costUsd: 9 }))).toBeUndefined();
    expect(streamBudgetBlock({ limit: { usd: 1 }, onExhausted: 'block' }, 'a', spent({ costUsd: 0.5 }))).toBeUndefined();
    expect(streamBudgetBlock({ limit: { usd: 1 }, onExhausted: 'block', objectiveExhausted: 'objective o spent $5.00 of its $5.00 budget' }, 'a', spent({ costUsd: 0.5 }))).toBe('objective o spent $5.00 of its $5.00 budget');
    expect(streamBudgetBlock({ limit: { usd: 1 }, onExhausted: 'block', objectiveExhausted: 'x' }, 'a', spent({ costUsd: 2 }))).toBe('stream a spent $2.00 of its $1.00 budget');
  });

  it("a stream starts with its own raised limit, else the objective's stream limit", () => {
    const budget = { stream: { usd: 1 }, onExhausted: 'fail' as const, streams: { b: { usd: 3 } }, objectiveExhausted: 'spent' };
    expect(streamBudgetOf(budget, 'a')).toEqual({ limit: { usd: 1 }, onExhausted: 'fail', objectiveExhausted: 'spent' });
    expect(streamBudgetOf(budget, 'b')).toEqual({ limit: { usd: 3 }, onExhausted: 'fail', objectiveExhausted: 'spent' });
    expect(streamBudgetOf({ onExhausted: 'block' }, 'a')).toEqual({ onExhausted: 'block' });
  });

  it.each([
    { name: 'nothing given', raise: {}, problems: ['give --usd, --tokens or both'] },
    { name: 'zero', raise: { usd: 0 }, problems: ['--usd must be a positive number, got 0'] },
    { name: 'negative tokens', raise: { tokens: -5 }, problems: ['--tokens must be a positive whole number, got -5'] },
    { name: 'not a number', raise: { usd: Number.NaN }, problems: ['--usd must be a positive number, got NaN'] },
    { name: 'below what is spent', raise: { usd: 0.5 }, problems: ['--usd 0.5 is not above what stream a already spent ($0.7500); give a higher limit'] },
    { name: 'equal to what is spent', raise: { tokens: 3000 }, problems: ['--tokens 3000 is not above what stream a already spent (3,000 tokens); give a higher limit'] },
    { name: 'the other figure still spent', raise: { usd: 2 }, limit: { usd: 0.5, tokens: 1000 }, problems: ['stream a spent 3,000 of its 1,000 tokens budget after this raise too; raise that figure as well'] },
    { name: 'a valid raise', raise: { usd: 2 }, problems: [] },
    { name: 'both figures', raise: { usd: 2, tokens: 10000 }, limit: { usd: 0.5, tokens: 1000 }, problems: [] },
  ])('raise: $name', ({ raise, limit, problems: expected }) => {
    expect(raiseProblems(raise, { limit: limit ?? { usd: 0.5 }, spent: spent({ costUsd: 0.75, inputTokens: 2000, outputTokens: 1000 }), whose: 'stream a' })).toEqual(expected);
  });

  it.each([
    { name: 'no hard limit: no allowance', budget: { limit: { usd: 1 }, onExhausted: 'block' as const }, spent: spent({}), allowance: undefined },
    { name: 'hard limit without a stream limit: none', budget: { onExhausted: 'block' as const, hardLimit: true as const }, spent: spent({}), allowance: undefined },
    { name: 'usd: the limit less the spend', budget: { limit: { usd: 1 }, onExhausted: 'block' as const, hardLimit: true as const }, spent: spent({ costUsd: 0.25 }), allowance: { usd: 0.75, whose: 'stream a' } },
    { name: 'tokens: input (with cached) plus output', budget: { limit: { tokens: 5000 }, onExhausted: 'block' as const, hardLimit: true as const }, spent: spent({ inputTokens: 1500, cachedTokens: 1000, outputTokens: 500 }), allowance: { tokens: 3000, whose: 'stream a' } },
    { name: 'both figures', budget: { limit: { usd: 2, tokens: 100 }, onExhausted: 'fail' as const, hardLimit: true as const }, spent: spent({ costUsd: 0.5, inputTokens: 40 }), allowance: { usd: 1.5, tokens: 60, whose: 'stream a' } },
    { name: 'already over (a guidance waiver): nothing left, not negative', budget: { limit: { usd: 1, tokens: 10 }, onExhausted: 'block' as const, hardLimit: true as const }, spent: spent({ costUsd: 3, outputTokens: 20 }), allowance: { usd: 0, tokens: 0, whose: 'stream a' } },
  ])('run allowance: $name', ({ budget, spent: s, allowance }) => {
    expect(runAllowance(budget, 'a', s)).toEqual(allowance);
  });

  it.each([
    { name: 'below the tokens left', allowance: { tokens: 1000, whose: 'stream a' }, used: { inputTokens: 600, outputTokens: 399 }, reason: undefined },
    { name: 'at the tokens left: stopped', allowance: { tokens: 1000, whose: 'stream a' }, used: { inputTokens: 600, outputTokens: 400 }, reason: 'stream a reached its budget during this run (1,000 of the 1,000 tokens left); the run was stopped (hard_limit)' },
    { name: 'at the usd left: stopped', allowance: { usd: 0.5, whose: 'stream a' }, used: { inputTokens: 1, outputTokens: 1, costUsd: 0.5 }, reason: 'stream a reached its budget during this run ($0.5000 of the $0.5000 left); the run was stopped (hard_limit)' },
    { name: 'cost unknown (no price): a usd allowance cannot stop it', allowance: { usd: 0.5, whose: 'stream a' }, used: { inputTokens: 1e9, outputTokens: 1e9 }, reason: undefined },
    { name: 'no allowance', allowance: undefined, used: { inputTokens: 1e9, outputTokens: 0, costUsd: 1e9 }, reason: undefined },
  ])('allowance used: $name', ({ allowance, used, reason }) => {
    expect(allowanceUsed(allowance, used)).toBe(reason);
  });

  it('a raise replaces the figures it gives and keeps the others', () => {
    expect(raisedLimit({ usd: 1, tokens: 100 }, { usd: 2 })).toEqual({ usd: 2, tokens: 100 });
    expect(raisedLimit(undefined, { tokens: 5 })).toEqual({ tokens: 5 });
  });
});

describe('model prices (core/prices.ts) and estimated costs', () => {
  it('estimates a run at input, cached-input and output prices per million (input includes cached)', () => {
    expect(estimateCostUsd({ inputTokens: 1000, cachedTokens: 400, outputTokens: 200 }, { input: 2, output: 8, cached_input: 0.5 })).toBeCloseTo((600 * 2 + 400 * 0.5 + 200 * 8) / 1e6, 12);
    // No cached price: cached tokens cost the input price.
    expect(estimateCostUsd({ inputTokens: 1000, cachedTokens: 400, outputTokens: 0 }, { input: 2, output: 8 })).toBeCloseTo(0.002, 12);
  });

  it('finds a price by model, override first, and by the model part of provider/model', () => {
    expect(priceFor('gpt-5.1-codex')).toBe(MODEL_PRICES['gpt-5.1-codex']);
    expect(priceFor('anthropic/claude-sonnet-4-5')).toBe(MODEL_PRICES['claude-sonnet-4-5']);
    expect(priceFor('gpt-5.1-codex', { 'gpt-5.1-codex': { input: 9, output: 9 } })).toEqual({ input: 9, output: 9 });
    expect(priceFor('my-model', { 'my-model': { input: 1, output: 2 } })).toEqual({ input: 1, output: 2 });
    expect(priceFor('unknown-model')).toBeUndefined();
    expect(priceFor(undefined)).toBeUndefined();
  });

  it('totals with an estimated run are marked, and the text says so', () => {
    const totals = emptyTotals();
    addRunUsage(totals, { inputTokens: 10, outputTokens: 5, cachedTokens: 0, costUsd: 0.5 });
    expect(totals.estimated).toBeUndefined();
    expect(formatUsage(totals)).toBe('10 in / 5 out tokens, $0.5000');
    addRunUsage(totals, { inputTokens: 10, outputTokens: 5, cachedTokens: 0, costUsd: 0.25, estimated: true });
    expect(totals.estimated).toBe(true);
    expect(formatUsage(totals)).toBe('20 in / 10 out tokens, ~$0.7500 (estimated)');
    expect(addTotals(emptyTotals(), totals).estimated).toBe(true);
    expect(addTotals(emptyTotals(), emptyTotals())).not.toHaveProperty('estimated');
  });

  it('a run whose agent reports no token counts (Copilot) says usage unknown, and totals count such runs apart', () => {
    const run = { inputTokens: 0, outputTokens: 0, cachedTokens: 0, usageUnknown: true };
    expect(formatUsage(run)).toBe('usage unknown (the agent reports no token counts)');
    const totals = emptyTotals();
    addRunUsage(totals, { inputTokens: 10, outputTokens: 5, cachedTokens: 0, costUsd: 0.5 });
    addRunUsage(totals, run);
    addRunUsage(totals, run);
    expect(totals).toMatchObject({ runs: 3, inputTokens: 10, usageUnknownRuns: 2 });
    expect(formatUsage(totals)).toBe('10 in / 5 out tokens, $0.5000; usage unknown for 2 runs (no token counts)');
    expect(addTotals(totals, totals).usageUnknownRuns).toBe(4);
    expect(addTotals(emptyTotals(), emptyTotals())).not.toHaveProperty('usageUnknownRuns');
  });

  it("the loader gives each agent its model's price: .slipway/config.yaml prices over the table", async () => {
    const { file } = await project(
      lines('objective: x', 'repository: ./repo', 'agents:', '  builder: { provider: codex, model: my-model }', '  reviewer: { provider: codex, model: gpt-5.1-codex }', '  scout: { provider: codex }', 'streams:', '  - id: a', '    task: do a'),
      lines('prices:', '  my-model: { input: 2, output: 8, cached_input: 0.5 }'),
    );
    const input = await loadObjectiveFile(file);
    expect(input.agents.builder?.price).toEqual({ input: 2, output: 8, cached_input: 0.5 });
    expect(input.agents.reviewer?.price).toEqual(MODEL_PRICES['gpt-5.1-codex']);
    expect(input.agents.scout?.price).toBeUndefined(); // no model: no price, no estimate
  });

  it('invalid prices are refused naming the config file, line and field; price is not an agent field', async () => {
    const { file, repo } = await project(lines(...HEAD), lines('prices:', '  my-model: { input: -1, output: 8 }', '  other: { input: 1 }'));
    const config = path.join(repo, '.slipway', 'config.yaml');
    const msgs = await problems(file);
    expect(msgs).toEqual(
      expect.arrayContaining([
        expect.stringMatching(new RegExp(`^${config}:2:\\d+: prices\\.my-model\\.input: `)),
        expect.stringMatching(new RegExp(`^${config}:3:\\d+: prices\\.other\\.output: `)),
      ]),
    );
    const { file: withPrice } = await project(lines('objective: x', 'repository: ./repo', 'agents:', '  builder: { provider: script, command: ./b.sh, price: { input: 1, output: 1 } }', 'streams:', '  - id: a', '    task: do a'));
    expect((await problems(withPrice)).join('\n')).toContain('agents.builder.price: unknown key "price"');
  });
});

describe("the objective's answer before a stream's agent run (objectiveLease)", () => {
  const O = 'objective o';
  // Rows: limit, spent so far (every finished run), other streams' runs in flight, answer.
  const rows: Array<[string, Parameters<typeof objectiveLease>[0], Partial<TokenTotals>, number, ReturnType<typeof objectiveLease>]> = [
    ['no objective limit: always', undefined, { costUsd: 9, runs: 3 }, 2, { type: 'grant' }],
    ['nothing run yet: nothing to expect, it starts', { usd: 1 }, {}, 3, { type: 'grant' }],
    ['nothing else in flight and below the limit: it starts (and may overshoot, as a soft limit does)', { usd: 1 }, { costUsd: 0.99, runs: 9 }, 0, { type: 'grant' }],
    ['at the limit: refused, whatever is in flight', { usd: 1 }, { costUsd: 1, runs: 4 }, 0, { type: 'exhausted', reason: 'objective o spent $1.00 of its $1.00 budget' }],
    ['above it', { usd: 1 }, { costUsd: 1.2, runs: 4 }, 2, { type: 'exhausted', reason: 'objective o spent $1.20 of its $1.00 budget' }],
    ['one run in flight at the average cost leaves some: it starts', { usd: 1 }, { costUsd: 0.5, runs: 2 }, 1, { type: 'grant' }],
    ['one run in flight at the average cost takes the rest: it waits for that run', { usd: 1 }, { costUsd: 0.5, runs: 1 }, 1, { type: 'wait' }],
    ['two in flight would take the rest: waits', { usd: 1 }, { costUsd: 0.66, runs: 3 }, 2, { type: 'wait' }],
    ['one of those two in flight leaves some: starts', { usd: 1 }, { costUsd: 0.66, runs: 3 }, 1, { type: 'grant' }],
    ['tokens: input plus output, same rule', { tokens: 12_000 }, { inputTokens: 4000, outputTokens: 1000, runs: 1 }, 1, { type: 'grant' }],
    ['tokens: the expected run takes the rest', { tokens: 12_000 }, { inputTokens: 4000, outputTokens: 1000, runs: 1 }, 2, { type: 'wait' }],
    ['tokens spent', { tokens: 10_000 }, { inputTokens: 9000, outputTokens: 1000, runs: 2 }, 0, { type: 'exhausted', reason: 'objective o spent 10,000 of its 10,000 tokens budget' }],
    ['both figures: either one short makes it wait', { usd: 100, tokens: 10_000 }, { costUsd: 1, inputTokens: 5000, outputTokens: 1000, runs: 1 }, 1, { type: 'wait' }],
    ['both figures with room: starts', { usd: 100, tokens: 100_000 }, { costUsd: 1, inputTokens: 5000, outputTokens: 1000, runs: 1 }, 1, { type: 'grant' }],
  ];
  it.each(rows)('%s', (_name, limit, s, inFlight, answer) => {
    expect(objectiveLease(limit, O, spent(s), inFlight)).toEqual(answer);
  });
});
