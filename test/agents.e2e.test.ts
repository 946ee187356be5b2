/**
 * Real agent providers end to end: the objective, stream and sandbox workflows on the real
 * Temporal test server, real git repositories, and each provider's own command line pointed at a
 * fake agent (test/fixtures/agents/fake-agent.mjs) that prints that agent's real output format and
 * really edits and commits files. Covers the iteration loop and completion signal, structured
 * review verdicts (and invalid answers), session resume in fix loops, rate-limit waits, idle
 * timeouts, crashes retried, lingering processes killed after the grace period, prompt templates
 * with arguments and sandbox commands, `.slipway/config.yaml` defaults, usage per run in
 * `slipway status`, and that no secret reaches any workflow history.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { trustRepository } from '../config/trust';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import type { AgentProviderKind } from '../core/objective-schema';
import type { ObjectiveResult, ObjectiveStatus } from '../core/types';
import { objectiveStatusQuery, objectiveWorkflow, planDecisionUpdate } from '../workflows/objective';
import { slipway, waitFor } from './helpers/cli';
import { alive } from './helpers/processes';
import { writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo, PROJECT_ROOT, tempDir } from './helpers/repo';
import { historyText as sharedHistoryText, startTestWorker, type TestWorker } from './helpers/temporal';
import { NativeConnection } from '@temporalio/worker';
import { createSlipwayWorkers } from '../workers/worker';

// Copilot has no format in fake-agent.mjs: its real CLI runs in test/real-agents.e2e.test.ts.
type RealProvider = Exclude<AgentProviderKind, 'script' | 'copilot'>;
const PROVIDERS: RealProvider[] = ['claude-code', 'codex', 'opencode', 'pi'];
const FAKE = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'fake-agent.mjs');
const FORMAT: Record<RealProvider, string> = { 'claude-code': 'claude', codex: 'codex', opencode: 'opencode', pi: 'pi' };
/** How each real CLI is told to resume a session (what the fake must receive). */
const RESUME_ARGS: Record<RealProvider, (session: string) => string[]> = {
  'claude-code': (s) => ['--resume', s],
  codex: (s) => ['resume', s],
  opencode: (s) => ['--session', s],
  pi: (s) => ['--session', s],
};
const fakeAgent = (provider: RealProvider, extra: Record<string, unknown> = {}) => ({ provider, command: `node ${FAKE} --format ${FORMAT[provider]}`, ...extra });

// Secrets: two in the worker's environment, two in the repositories' .slipway/.env (one whose
// name does not look secret). The fake echoes them; none may reach workflow history.
const SECRETS = {
  ANTHROPIC_API_KEY: `sk-test-${randomBytes(12).toString('hex')}`,
  OPENAI_API_KEY: `sk-test-openai-${randomBytes(12).toString('hex')}`,
  SLIPWAY_E2E_TOKEN: `tok-e2e-${randomBytes(12).toString('hex')}`,
  DATABASE_URL: `postgres://app:pw-${randomBytes(8).toString('hex')}@db.internal/app`,
};
const ECHO = ['ANTHROPIC_API_KEY', 'SLIPWAY_E2E_TOKEN', 'DATABASE_URL'];
const sha = (v: string) => createHash('sha256').update(v).digest('hex');

let worker: TestWorker;
let cliEnv: NodeJS.ProcessEnv;
const savedEnv: Record<string, string | undefined> = {};
/** Every objective started here, for the history check at the end. */
const started: Array<{ id: string; streams: string[] }> = [];

beforeAll(async () => {
  for (const name of ['ANTHROPIC_API_KEY', 'OPENAI_API_KEY'] as const) {
    savedEnv[name] = process.env[name];
    process.env[name] = SECRETS[name];
  }
  worker = await startTestWorker({ agentConcurrency: 4 });
  cliEnv = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue };
});
afterAll(async () => {
  await worker?.stop();
  for (const [name, value] of Object.entries(savedEnv)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

interface FakeCall {
  event: string;
  key: string;
  call: number;
  role: string;
  stream: string;
  argv: string[];
  resumed: string | null;
  session: string;
  prompt: string;
  branch: string;
  pid: number;
  at: number;
  env: Record<string, string | null>;
  lingerPid?: number | null;
}

interface Run {
  id: string;
  repo: string;
  handle: Awaited<ReturnType<TestWorker['client']['workflow']['start']>>;
  /** The fake's calls for a key (`builder:greet`, `reviewer:greet`, `planner`), start lines only. */
  calls(key: string): FakeCall[];
  events(key: string, event: string): FakeCall[];
  result(): Promise<ObjectiveResult>;
}

interface RepoFiles {
  [relativePath: string]: string;
}

/**
 * Starts an objective on a fresh demo repository. The fake's plan lives outside the objective's
 * folder and is found only through `FAKE_AGENT_PLAN` in `.slipway/.env`: the run proves the
 * file's values reach the agent process.
 */
async function start(id: string, spec: Record<string, unknown>, plan: Record<string, unknown>, repoFiles: RepoFiles = {}, streams = ['greet']): Promise<Run> {
  const repo = makeDemoRepo();
  const planFile = path.join(tempDir('slipway-fake-plan-'), 'fake-plan.json');
  writeFileSync(planFile, JSON.stringify(plan, null, 2));
  mkdirSync(path.join(repo, '.slipway'), { recursive: true });
  writeFileSync(
    path.join(repo, '.slipway', '.env'),
    `# credentials for the agents\nSLIPWAY_E2E_TOKEN=${SECRETS.SLIPWAY_E2E_TOKEN}\nexport DATABASE_URL="${SECRETS.DATABASE_URL}"\nFAKE_AGENT_PLAN=${planFile}\n`,
  );
  for (const [rel, content] of Object.entries(repoFiles)) {
    mkdirSync(path.dirname(path.join(repo, rel)), { recursive: true });
    writeFileSync(path.join(repo, rel), content);
  }
  await trustRepository(repo); // its .slipway/config.yaml and blueprints are the test's own (`slipway trust`)
  const file = writeObjective({ repository: repo, ...spec });
  const input = await loadObjectiveFile(file, { id });
  const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
  started.push({ id, streams });
  const lines = (): FakeCall[] => {
    try {
      return readFileSync(path.join(path.dirname(planFile), 'fake-calls.jsonl'), 'utf8').trim().split('\n').filter(Boolean).map((l) => JSON.parse(l));
    } catch {
      return [];
    }
  };
  return {
    id,
    repo,
    handle,
    calls: (key) => lines().filter((c) => c.key === key && c.event === 'start'),
    events: (key, event) => lines().filter((c) => c.key === key && c.event === event),
    result: () => handle.result() as Promise<ObjectiveResult>,
  };
}

const historyText = (workflowId: string) => sharedHistoryText(worker.client, workflowId);

/** No gates, no review, two fast attempts per activity: for the process-control tests. */
const FAST_BUILD_ONLY = `
id: build-review
level: stream
retry: { profile: strict, initial_interval_seconds: 0.05 }
on_exhausted: fail
steps:
  - id: build
    type: agent
    role: builder
    next: ready
  - id: ready
    type: deterministic
    action: signal_merge_ready
`;

const GREET_WRONG = "module.exports = { greet: (name) => 'Hi ' + name };\n";
const GREET = 'module.exports = { greet: (name) => `Hello, ${name}!` };\n';
const GREET_DOC = `/** Greets someone by name. */\n${GREET}`;
const GREET_TEST = "const test = require('node:test');\nconst assert = require('node:assert');\nconst { greet } = require('../src/greet');\ntest('greet', () => assert.strictEqual(greet('Ada'), 'Hello, Ada!'));\n";

describe('each provider through the real workflows', () => {
  it.concurrent.each(PROVIDERS)(
    '%s: waits out a rate limit, stops iterating at the completion signal, resumes its session in the gate and review fix loops, records usage per run',
    async (provider) => {
      const id = `loop-${provider}`;
      const run = await start(
        id,
        {
          objective: 'add a greet helper',
          gates: [{ name: 'test', command: 'node --test' }],
          agents: {
            builder: fakeAgent(provider, { max_iterations: 3, completion_grace_seconds: 2 }),
            reviewer: fakeAgent(provider),
          },
          streams: [{ id: 'greet', task: 'Add greet(name) returning "Hello, <name>!"' }],
        },
        {
          'builder:greet': [
            { rateLimit: { resetInSeconds: 2 } },
            { files: { 'src/greet.js': GREET_WRONG }, echoEnv: ECHO, say: 'Wrote a first greet.' },
            { files: { 'test/greet.test.js': GREET_TEST }, signal: true },
            { files: { 'src/greet.js': GREET }, signal: true },
            { files: { 'src/greet.js': GREET_DOC }, signal: true },
          ],
          'reviewer:greet': [
            { verdict: { verdict: 'reject', summary: 'greet is undocumented', findings: ['add a doc comment to src/greet.js'] } },
            { verdict: { verdict: 'approve', summary: 'looks good', findings: [] } },
          ],
        },
      );
      const result = await run.result();
      expect(result.outcome).toBe('completed');
      expect(gitIn(run.repo, 'show', `${integrationBranch(id)}:src/greet.js`)).toBe(GREET_DOC.trim());

      const builder = run.calls('builder:greet');
      expect(builder).toHaveLength(5);
      // 1. Rate limited; the stream waited for the reset (2 s ahead) on a durable timer.
      expect(run.events('builder:greet', 'rate_limited')).toHaveLength(1);
      expect(builder[1].at - builder[0].at).toBeGreaterThanOrEqual(1_000);
      // 2-3. The first build: runs 1 and 2 of at most 3, fresh sessions; the signal on run 2 ends the loop.
      expect(builder[1].resumed).toBeNull();
      expect(builder[2].resumed).toBeNull();
      expect(builder[1].prompt).toContain('This is run 1 of at most 3');
      expect(builder[2].prompt).toContain('This is run 2 of at most 3');
      // 4. The gate failed: the builder resumes its last session, with the gate output in the prompt.
      expect(builder[3].resumed).toBe(builder[2].session);
      expect(builder[3].argv.join(' ')).toContain(RESUME_ARGS[provider](builder[2].session).join(' '));
      expect(builder[3].prompt).toMatch(/quality_gate_failure/);
      expect(builder[3].prompt).toContain("'Hello, Ada!'");
      // 5. The reviewer rejected: the builder resumes again, with the findings in the prompt.
      expect(builder[4].resumed).toBe(builder[3].session);
      expect(builder[4].argv.join(' ')).toContain(RESUME_ARGS[provider](builder[3].session).join(' '));
      expect(builder[4].prompt).toContain('add a doc comment to src/greet.js');
      // The .slipway/.env values and the worker's key reached the agent process.
      expect(builder[1].env).toEqual({ ANTHROPIC_API_KEY: sha(SECRETS.ANTHROPIC_API_KEY), SLIPWAY_E2E_TOKEN: sha(SECRETS.SLIPWAY_E2E_TOKEN), DATABASE_URL: sha(SECRETS.DATABASE_URL) });

      const reviewer = run.calls('reviewer:greet');
      expect(reviewer).toHaveLength(2);
      expect(reviewer.map((c) => c.resumed)).toEqual([null, null]);

      // The ledger tells the story.
      expect(result.ledger.map((e) => `${e.kind}:${e.result}`)).toEqual([
        'provider_rate_limit:waiting',
        'quality_gate_failure:retrying',
        'quality_gate_failure:recovered',
        'review_rejection:retrying',
        'review_rejection:recovered',
      ]);

      // Usage per run (the rate-limited run reported none), summed per stream and objective.
      const runs = result.agentRuns ?? [];
      expect(runs.map((r) => `${r.role}:${r.agentIteration}/${r.maxIterations}:${r.result}`)).toEqual([
        'builder:1/3:finished',
        'builder:2/3:signalled', // the signal ends the loop before run 3; then the gate fails
        'builder:1/3:signalled', // the gate fix; then the review
        'reviewer:1/1:finished', // reject
        'builder:1/3:signalled', // the review fix
        'reviewer:1/1:finished', // approve
      ]);
      expect(runs.filter((r) => r.role === 'builder').map((r) => r.sessionId)).toEqual(builder.slice(1).map((c) => c.session));
      for (const r of runs) expect(r).toMatchObject({ provider, stream: 'greet', inputTokens: 1000, cachedTokens: 400, outputTokens: 200, ended: 'exited' });
      const costPerRun = provider === 'codex' ? undefined : 0.0125; // codex reports no cost
      for (const r of runs) expect(r.costUsd).toBe(costPerRun);
      expect(result.usage).toMatchObject({ inputTokens: 6000, outputTokens: 1200, cachedTokens: 2400, runs: 6 });
      expect(result.usage.costUsd).toBeCloseTo(costPerRun ? 6 * costPerRun : 0, 10);
      expect(result.streams[0].usage).toEqual(result.usage);
    },
    150_000,
  );
});

describe('structured output', () => {
  it('asks the reviewer again after an unusable answer (resuming its session, saying why), and fails the step when the retries run out', async () => {
    const [retried, exhausted] = await Promise.all([
      start(
        'review-retry',
        {
          objective: 'review retry',
          agents: { builder: fakeAgent('claude-code'), reviewer: fakeAgent('claude-code') },
          streams: [{ id: 'greet', task: 'Add greet' }],
        },
        { 'builder:greet': [{ files: { 'src/greet.js': GREET } }], 'reviewer:greet': [{ invalidAnswer: true }, { verdict: { verdict: 'approve' } }] },
      ),
      start(
        'review-unusable',
        {
          objective: 'review never usable',
          on_exhausted: 'fail',
          agents: { builder: fakeAgent('opencode'), reviewer: fakeAgent('opencode', { max_output_retries: 1 }) },
          streams: [{ id: 'greet', task: 'Add greet' }],
        },
        { 'builder:greet': [{ files: { 'src/greet.js': GREET } }], 'reviewer:greet': [{ invalidAnswer: true }] },
      ),
    ]);

    const ok = await retried.result();
    expect(ok.outcome).toBe('completed');
    const reviews = retried.calls('reviewer:greet');
    expect(reviews).toHaveLength(2);
    expect(reviews[1].resumed).toBe(reviews[0].session);
    expect(reviews[1].argv).toEqual(expect.arrayContaining(['--resume', reviews[0].session]));
    expect(reviews[1].prompt).toMatch(/Your previous answer could not be used: <review> does not hold valid JSON/);
    expect(ok.agentRuns?.filter((r) => r.role === 'reviewer').map((r) => r.result)).toEqual(['invalid_output', 'finished']);

    const failed = await exhausted.result();
    expect(failed.outcome).toBe('failed');
    expect(exhausted.calls('reviewer:greet')).toHaveLength(2);
    expect(failed.streams[0].failure).toMatchObject({ kind: 'agent_runtime_transient', summary: expect.stringMatching(/the reviewer gave no usable answer in 2 tries \(max_output_retries: 1\)/) });
  }, 120_000);

  it('the planner waits out a rate limit, is asked again after an invalid plan, and its usage counts for the objective', async () => {
    const id = 'planner-codex';
    const run = await start(
      id,
      {
        objective: 'add a greet helper, planned',
        agents: { builder: fakeAgent('codex'), planner: fakeAgent('codex') },
      },
      {
        planner: [{ rateLimit: { resetInSeconds: 1 } }, { invalidAnswer: true }, { plan: { streams: [{ id: 'greet', task: 'Add greet' }] } }],
        'builder:greet': [{ files: { 'src/greet.js': GREET } }],
      },
    );
    await waitFor(async () => ((await run.handle.query(objectiveStatusQuery)) as ObjectiveStatus).phase === 'awaiting_approval', 'the plan');
    await run.handle.executeUpdate(planDecisionUpdate, { args: [{ approve: true }] });
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    const planner = run.calls('planner');
    expect(planner).toHaveLength(3);
    expect(planner[2].argv.join(' ')).toContain(`resume ${planner[1].session} -`);
    expect(planner[2].prompt).toMatch(/could not be used: <plan> is invalid: streams\.0\.id/);
    expect(result.ledger[0]).toMatchObject({ step: 'plan', kind: 'provider_rate_limit', result: 'waiting' });
    expect(result.agentRuns?.map((r) => `${r.role}:${r.stream ?? '-'}:${r.result}`)).toEqual(['planner:-:invalid_output', 'planner:-:finished', 'builder:greet:finished']);
    expect(result.usage).toMatchObject({ runs: 3, inputTokens: 3000 });
  }, 120_000);
});

describe('process control', () => {
  it('kills an agent that goes silent past idle_timeout_minutes (agent_runtime_transient), and the retry succeeds', async () => {
    const id = 'idle-claude';
    const run = await start(
      id,
      { objective: 'idle', agents: { builder: fakeAgent('claude-code', { idle_timeout_minutes: 0.05 }) }, streams: [{ id: 'greet', task: 'Add greet' }] },
      { 'builder:greet': [{ silentMs: 120_000 }, { files: { 'src/greet.js': GREET } }] },
      { '.slipway/blueprints/build-review.yaml': FAST_BUILD_ONLY },
    );
    const started = Date.now();
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect(Date.now() - started).toBeLessThan(60_000);
    const calls = run.calls('builder:greet');
    expect(calls).toHaveLength(2);
    expect(alive(calls[0].pid)).toBe(false);
    expect(await historyText(streamWorkflowId(id, 'greet'))).toMatch(/builder agent \(claude-code\) printed nothing for 3 s \(idle_timeout_minutes\) and was killed/);
  }, 90_000);

  it('idle means no progress: an agent that only prints retry lines (codex "Reconnecting...") is killed after idle_timeout_minutes, and the retry succeeds', async () => {
    const id = 'reconnect-codex';
    const run = await start(
      id,
      { objective: 'reconnect', agents: { builder: fakeAgent('codex', { idle_timeout_minutes: 0.05 }) }, streams: [{ id: 'greet', task: 'Add greet' }] },
      { 'builder:greet': [{ reconnectMs: 120_000 }, { files: { 'src/greet.js': GREET } }] },
      { '.slipway/blueprints/build-review.yaml': FAST_BUILD_ONLY },
    );
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    const calls = run.calls('builder:greet');
    expect(calls).toHaveLength(2);
    expect(alive(calls[0].pid)).toBe(false);
    expect(await historyText(streamWorkflowId(id, 'greet'))).toMatch(/builder agent \(codex\) made no progress \(only \d+ retry lines\) for 3 s \(idle_timeout_minutes\) and was killed/);
  }, 90_000);

  it('a worker that dies in the middle of an iteration loop: the run in flight is killed, and the next worker resumes at that run, not at run 1', async () => {
    const id = 'worker-loss';
    // Workers of our own on one task queue, so a second worker can take over from the first.
    const taskQueue = `${worker.taskQueue}-loss`;
    const startWorkers = async () => {
      const connection = await NativeConnection.connect({ address: inject('temporalAddress') });
      const workers = await createSlipwayWorkers({ connection, taskQueue, workflowBundle: { codePath: inject('workflowBundlePath') }, agentConcurrency: 1, shutdownGraceMs: 500 });
      const running = workers.run();
      return async () => {
        workers.shutdown();
        await running;
        await connection.close();
      };
    };
    const stopFirst = await startWorkers();
    const repo = makeDemoRepo();
    const planFile = path.join(tempDir('slipway-fake-plan-'), 'fake-plan.json');
    writeFileSync(
      planFile,
      JSON.stringify({ 'builder:greet': [{ files: { 'src/greet.js': GREET_WRONG } }, { silentMs: 300_000 }, { files: { 'src/greet.js': GREET }, signal: true }] }),
    );
    mkdirSync(path.join(repo, '.slipway', 'blueprints'), { recursive: true });
    writeFileSync(path.join(repo, '.slipway', '.env'), `FAKE_AGENT_PLAN=${planFile}\n`);
    writeFileSync(path.join(repo, '.slipway', 'blueprints', 'build-review.yaml'), FAST_BUILD_ONLY);
    const file = writeObjective({ repository: repo, objective: 'survive a worker', agents: { builder: fakeAgent('claude-code', { max_iterations: 3 }) }, streams: [{ id: 'greet', task: 'Add greet' }] });
    await trustRepository(repo);
    const input = await loadObjectiveFile(file, { id });
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    started.push({ id, streams: ['greet'] });
    const calls = (): FakeCall[] =>
      readFileSync(path.join(path.dirname(planFile), 'fake-calls.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l)).filter((c: FakeCall) => c.event === 'start');

    // Run 2 is in flight (silent) when the worker goes away.
    await waitFor(async () => calls().length === 2, 'run 2 of the builder', 60_000).catch(() => undefined);
    expect(calls()).toHaveLength(2);
    await stopFirst();
    expect(alive(calls()[1].pid)).toBe(false); // cancelled with its worker: the process group is gone

    const stopSecond = await startWorkers();
    try {
      const result = (await handle.result()) as ObjectiveResult;
      expect(result.outcome).toBe('completed');
      const all = calls();
      expect(all).toHaveLength(3);
      expect(all.map((c) => /This is run (\d) of at most 3/.exec(c.prompt)?.[1])).toEqual(['1', '2', '2']);
      expect(result.agentRuns?.map((r) => `${r.agentIteration}:${r.result}`)).toEqual(['1:finished', '2:signalled']);
      expect(gitIn(repo, 'show', `${integrationBranch(id)}:src/greet.js`)).toBe(GREET.trim());
    } finally {
      await stopSecond();
    }
  }, 120_000);

  it('retries a crashed agent (agent_runtime_transient) with the stderr in the failure, secrets redacted', async () => {
    const id = 'crash-codex';
    const run = await start(
      id,
      { objective: 'crash', agents: { builder: fakeAgent('codex') }, streams: [{ id: 'greet', task: 'Add greet' }] },
      { 'builder:greet': [{ crash: { exitCode: 3, stderr: 'Error: stream disconnected before completion' }, echoEnv: ECHO }, { files: { 'src/greet.js': GREET } }] },
      { '.slipway/blueprints/build-review.yaml': FAST_BUILD_ONLY },
    );
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    expect(run.calls('builder:greet')).toHaveLength(2);
    expect(run.events('builder:greet', 'crashed')).toHaveLength(1);
    const history = await historyText(streamWorkflowId(id, 'greet'));
    expect(history).toMatch(/builder agent \(codex\) exited with 3/);
    expect(history).toContain('request failed with ANTHROPIC_API_KEY=[redacted]');
  }, 90_000);

  it('ends an agent the grace period after its completion signal: a lingering child (pi) and a leader that never exits (opencode)', async () => {
    const [linger, hang] = await Promise.all([
      start(
        'linger-pi',
        { objective: 'linger', agents: { builder: fakeAgent('pi', { completion_grace_seconds: 0.5 }) }, streams: [{ id: 'greet', task: 'Add greet' }] },
        { 'builder:greet': [{ files: { 'src/greet.js': GREET }, signal: true, lingerMs: 300_000 }] },
        { '.slipway/blueprints/build-review.yaml': FAST_BUILD_ONLY },
      ),
      start(
        'hang-opencode',
        { objective: 'hang', agents: { builder: fakeAgent('opencode', { completion_grace_seconds: 0.5 }) }, streams: [{ id: 'greet', task: 'Add greet' }] },
        { 'builder:greet': [{ files: { 'src/greet.js': GREET }, signal: true, hangMs: 300_000 }] },
        { '.slipway/blueprints/build-review.yaml': FAST_BUILD_ONLY },
      ),
    ]);
    const t0 = Date.now();
    const [lingered, hung] = await Promise.all([linger.result(), hang.result()]);
    expect(Date.now() - t0).toBeLessThan(60_000);
    expect(lingered.outcome).toBe('completed');
    expect(hung.outcome).toBe('completed');

    const lingering = linger.events('builder:greet', 'finished')[0].lingerPid!;
    expect(lingering).toBeGreaterThan(0);
    expect(alive(lingering)).toBe(false);
    expect(lingered.agentRuns?.[0]).toMatchObject({ result: 'signalled', inputTokens: 1000, costUsd: 0.0125 });

    expect(alive(hang.calls('builder:greet')[0].pid)).toBe(false);
    expect(hung.agentRuns?.[0]).toMatchObject({ result: 'signalled', ended: 'grace_killed', inputTokens: 1000 });
    expect(gitIn(hang.repo, 'show', `${integrationBranch('hang-opencode')}:src/greet.js`)).toBe(GREET.trim());
  }, 90_000);
});

describe('prompt templates and project config', () => {
  const TEMPLATE = [
    'Ticket {{TICKET}}: {{TASK}}',
    'Objective {{OBJECTIVE_ID}}: {{OBJECTIVE}} (stream {{STREAM}})',
    'You are on branch !`git rev-parse --abbrev-ref HEAD`, merging into {{TARGET_BRANCH}}.',
    'Run {{ITERATION}} of {{MAX_ITERATIONS}}. Helpers so far: !`ls src | sort | tr "\\n" " "`',
    'The task, through the shell: !`printf "%s" {{TASK}}`',
    'When everything is done, print <promise>COMPLETE</promise>.',
    '',
  ].join('\n');

  it('renders {{KEY}} arguments and !`command` expansions inside the sandbox before each run, with agent defaults from .slipway/config.yaml', async () => {
    const id = 'template-opencode';
    const task = `Add greet(name) — it's "friendly" $(touch injected) \`touch injected2\``;
    const config = [
      'agents:',
      '  builder:',
      '    provider: opencode',
      `    command: node ${FAKE} --format opencode`,
      '    model: anthropic/claude-sonnet-4-5',
      '    prompt_file: prompts/build.md', // relative to .slipway/
      '    args: { TICKET: SLIP-42 }',
      '',
    ].join('\n');
    const run = await start(
      id,
      { objective: 'greet people', agents: { builder: { max_iterations: 2 } }, streams: [{ id: 'greet', task }] },
      { 'builder:greet': [{ files: { 'src/greet.js': GREET } }, { files: { 'test/greet.test.js': GREET_TEST }, signal: true }] },
      { '.slipway/config.yaml': config, '.slipway/prompts/build.md': TEMPLATE, '.slipway/blueprints/build-review.yaml': FAST_BUILD_ONLY },
    );
    const result = await run.result();
    expect(result.outcome).toBe('completed');
    const calls = run.calls('builder:greet');
    expect(calls).toHaveLength(2);
    const branch = `slipway/${id}/greet`;
    expect(calls[0].prompt).toBe(
      [
        `Ticket SLIP-42: ${task}`,
        `Objective ${id}: greet people (stream greet)`,
        `You are on branch ${branch}, merging into ${integrationBranch(id)}.`,
        'Run 1 of 2. Helpers so far: slug.js ',
        `The task, through the shell: ${task}`,
        'When everything is done, print <promise>COMPLETE</promise>.',
        '',
      ].join('\n'),
    );
    // Expanded again before run 2: it sees the file run 1 committed.
    expect(calls[1].prompt).toContain('Run 2 of 2. Helpers so far: greet.js slug.js ');
    expect(calls[0].argv).toEqual(expect.arrayContaining(['--model', 'anthropic/claude-sonnet-4-5']));
    expect(calls[0].branch).toBe(branch);
    // Values are quoted for the shell: nothing in the task ran.
    expect(gitIn(run.repo, 'ls-tree', '-r', '--name-only', integrationBranch(id))).not.toMatch(/injected/);
  }, 90_000);

  it('slipway run refuses a template with a key that has no value and an unused argument, naming the files and lines, before anything starts', async () => {
    const repo = makeDemoRepo();
    mkdirSync(path.join(repo, '.slipway', 'prompts'), { recursive: true });
    writeFileSync(path.join(repo, '.slipway', 'prompts', 'build.md'), 'Task: {{TASK}}\nTicket: {{TIKET}}\n');
    writeFileSync(path.join(repo, '.slipway', 'config.yaml'), 'agents:\n  reviewer:\n    provider: codex\n    permission_mode: yolo\n');
    const file = writeObjective({
      repository: repo,
      objective: 'x',
      agents: { builder: { ...fakeAgent('claude-code'), prompt_file: path.join(repo, '.slipway', 'prompts', 'build.md'), args: { TICKET: 'SLIP-1', UNUSED: 'x' } } },
      streams: [{ id: 'a', task: 'a' }],
    });
    const cli = await slipway(['run', file, '--id', 'bad-template'], cliEnv);
    expect(cli.code).toBe(2);
    expect(cli.stderr).toMatch(/build\.md:2:9: \{\{TIKET\}\} has no value; give it in "args", or use a built-in: SOURCE_BRANCH, /);
    expect(cli.stderr).toMatch(/objective\.yaml:\d+:\d+: agents\.builder\.args\.UNUSED: unknown key "UNUSED": the prompt never uses \{\{UNUSED\}\}/);
    expect(cli.stderr).toMatch(/config\.yaml:4:22: agents\.reviewer\.permission_mode: codex does not know permission_mode "yolo"/);
    await expect(worker.client.workflow.getHandle(objectiveWorkflowId('bad-template')).describe()).rejects.toThrow(/not found/i);
  }, 60_000);
});

describe('usage and secrets', () => {
  it('slipway status shows tokens and cost per stream, per agent run and in total (text and JSON)', async () => {
    const id = 'loop-claude-code'; // finished above
    const json = await slipway(['status', id, '--json'], cliEnv);
    expect(json.code).toBe(0);
    const doc = JSON.parse(json.stdout);
    expect(doc.usage).toMatchObject({ inputTokens: 6000, outputTokens: 1200, cachedTokens: 2400, runs: 6 });
    expect(doc.usage.costUsd).toBeCloseTo(0.075, 10);
    expect(doc.agentRuns).toHaveLength(6);
    expect(doc.agentRuns[0]).toMatchObject({ role: 'builder', provider: 'claude-code', inputTokens: 1000, costUsd: 0.0125, stream: 'greet' });
    const text = await slipway(['status', id], cliEnv);
    expect(text.stdout).toMatch(/greet\s+merged\s+iterations=\d+\s+tokens=6,000\/1,200 cost=\$0\.0750/);
    expect(text.stdout).toMatch(/^ {6}builder run 2\/3 \(claude-code\): 1,000 in \(400 cached\) \/ 200 out tokens, \$0\.0125, [\d.]+ s, completion signal$/m);
    expect(text.stdout).toContain('agent usage: 6,000 in (2,400 cached) / 1,200 out tokens, $0.0750 over 6 agent runs');
  });

  it('no secret value (worker environment or .slipway/.env) appears in any workflow history of these runs', async () => {
    expect(started.length).toBeGreaterThanOrEqual(10);
    const ids = started.flatMap(({ id, streams }) => [
      objectiveWorkflowId(id),
      // Each stream runs its sandbox's activities itself (ADR 0032).
      ...streams.map((s) => streamWorkflowId(id, s)),
    ]);
    let redactedSeen = 0;
    for (const workflowId of ids) {
      const text = await historyText(workflowId);
      for (const [name, value] of Object.entries(SECRETS)) {
        expect(text.includes(value), `${name} found in the history of ${workflowId}`).toBe(false);
        expect(text.includes(Buffer.from(value).toString('base64')), `${name} (base64) found in the history of ${workflowId}`).toBe(false);
      }
      if (text.includes('[redacted]')) redactedSeen += 1;
    }
    // The check can see payloads: agent output that echoed the secrets is there, redacted.
    expect(redactedSeen).toBeGreaterThanOrEqual(4);
    expect(await historyText(streamWorkflowId('loop-pi', 'greet'))).toContain('debug: SLIPWAY_E2E_TOKEN=[redacted]');
  }, 120_000);
});
