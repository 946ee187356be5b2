/**
 * The library API (index.ts, `import { ... } from 'slipway'`) against the real Temporal test
 * server and a real worker: the example in examples/library/ run as a program, validation of an
 * objective given as an object, following and steering objectives (approval, guidance), and the
 * sandbox service's typed client against the real service.
 */
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { WorkflowNotFoundError } from '@temporalio/client';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { connect, ObjectiveFileError, sandboxes, type FeedEvent, type Slipway } from '../index';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import { waitFor } from './helpers/cli';
import { gitIn, makeDemoRepo, PROJECT_ROOT, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { startServiceHarness } from './service/harness';

const FAKE = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'fake-agent.mjs');

let worker: TestWorker;
let slipway: Slipway;
beforeAll(async () => {
  worker = await startTestWorker();
  slipway = await connect({ address: inject('temporalAddress'), taskQueue: worker.taskQueue });
});
afterAll(async () => {
  await slipway?.close();
  await worker?.stop();
});

function run(command: string, args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { cwd: PROJECT_ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describe('library API', () => {
  it('examples/library/hello.ts runs: starts an objective from an object, prints its feed, ends completed', async () => {
    const repo = makeDemoRepo();
    const id = 'library-example';
    const out = await run(process.execPath, ['--import', 'tsx', path.join('examples', 'library', 'hello.ts'), repo], {
      TEMPORAL_ADDRESS: inject('temporalAddress'),
      SLIPWAY_TASK_QUEUE: worker.taskQueue,
      EXAMPLE_OBJECTIVE_ID: id,
    });
    expect(out.code, out.stderr).toBe(0);
    expect(out.stdout).toContain(`started ${id}\n`);
    expect(out.stdout).toMatch(/^\[hello\] building/m);
    expect(out.stdout).toContain(`outcome: completed; merged: hello into ${integrationBranch(id)}`);
    expect(gitIn(repo, 'show', `${integrationBranch(id)}:hello.txt`)).toBe('hello from slipway');
  });

  it('an invalid objective object is refused with the objective file\'s messages, naming each field, and nothing starts', async () => {
    const repo = makeDemoRepo();
    const error = await slipway
      .startObjective({
        id: 'library-invalid',
        objective: 'x',
        repository: repo,
        agents: { builder: { provider: 'script', command: 'true' } },
        streams: [{ id: 'Bad Id', task: 'x' }],
        budget: { stream: { usd: 0 } },
        colour: 'blue',
      } as never)
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ObjectiveFileError);
    const problems = (error as ObjectiveFileError).problems;
    expect(problems.map((p) => p.field)).toEqual(expect.arrayContaining(['streams[0].id', 'budget.stream.usd', 'colour']));
    for (const p of problems) expect(p).not.toHaveProperty('line'); // no file, no line
    expect((error as Error).message).toContain('objective: streams[0].id: "Bad Id" must be lowercase letters');
    expect((error as Error).message).toContain('objective: budget.stream.usd: must be greater than 0, got 0');
    expect((error as Error).message).toContain('objective: colour: unknown key "colour"');
    await expect(worker.client.workflow.getHandle(objectiveWorkflowId('library-invalid')).describe()).rejects.toBeInstanceOf(WorkflowNotFoundError);
  });

  it('relative paths resolve against dir; approve() lets a plan go on; events() ends with the objective; status and result agree', async () => {
    const repo = makeDemoRepo();
    const objective = await slipway.startObjective(
      {
        id: 'library-approve',
        objective: 'say hello',
        repository: path.basename(repo),
        require_approval: true,
        agents: { builder: { provider: 'script', command: 'echo hi > hi.txt' } },
        streams: [{ id: 'hi', task: 'write hi.txt' }],
      },
      { dir: path.dirname(repo) },
    );
    const events: FeedEvent[] = [];
    const following = (async () => {
      for await (const e of objective.events({ intervalMs: 200 })) events.push(e);
    })();
    await waitFor(async () => (await objective.status()).phase === 'awaiting_approval', 'awaiting approval');
    await objective.approve();
    await following; // the iterator ends by itself when the objective does
    const result = await objective.result();
    expect(result.outcome).toBe('completed');
    expect(events.map((e) => e.seq)).toEqual([...events.map((e) => e.seq)].sort((a, b) => a - b));
    expect(new Set(events.map((e) => e.seq)).size).toBe(events.length);
    expect(events.map((e) => e.text)).toEqual(expect.arrayContaining(['plan approved', expect.stringMatching(/^done: outcome \*\*completed\*\*/)]));
    expect(slipway.objective('library-approve').id).toBe('library-approve');
    await expect(objective.approve()).rejects.toThrow(/already completed/);
  });

  it('guide() on a stream blocked by its budget lets the step go on past the limit (mail send, as a call)', async () => {
    const repo = makeDemoRepo();
    const dir = tempDir('slipway-library-');
    writeFileSync(path.join(dir, 'fake-plan.json'), JSON.stringify({ 'builder:greet': [{ files: { 'src/greet.js': 'module.exports = {};\n' } }, { say: 'more' }] }));
    const objective = await slipway.startObjective(
      {
        id: 'library-guide',
        objective: 'greet',
        repository: repo,
        agents: { builder: { provider: 'claude-code', command: `node ${FAKE} --format claude`, max_iterations: 2 } },
        streams: [{ id: 'greet', task: 'add greet' }],
        budget: { stream: { usd: 0.01 } },
      },
      { dir },
    );
    const blocked = await waitFor(async () => (await objective.status()).streams.find((s) => s.blocked)?.blocked, 'the budget block');
    expect(blocked.kind).toBe('budget_exhausted');
    expect((await objective.status()).agentRuns).toHaveLength(1);
    const ack = await objective.guide('greet', { agent: 'builder-greet', subject: 'finish this step', body: 'one more run is fine' });
    expect(ack).toEqual({ streamId: 'greet', resumesAt: 'build' });
    const result = await objective.result();
    expect(result.outcome).toBe('completed');
    expect(result.agentRuns).toHaveLength(2);
    expect(result.ledger.map((e) => e.result)).toEqual(['blocked', 'guidance_applied']);
  });

  it('sandboxes(): the typed client creates, execs in and destroys a service sandbox', async () => {
    const h = await startServiceHarness();
    try {
      const account = await h.account();
      await account.profile({ name: 'linux' });
      expect(() => sandboxes({ url: h.url, token: '' })).toThrow(/needs a token/);
      const api = sandboxes({ url: h.url, token: account.token });
      const created = await api.create({ profile: 'linux' });
      expect((await api.get(created.id, 60)).status).toBe('ready');
      const out = await api.exec(created.id, { command: 'sh', args: ['-c', 'echo hello; exit 3'] });
      expect(out).toMatchObject({ exit_code: 3, stdout: 'hello\n' });
      await api.destroy(created.id);
      expect((await h.waitFor(api, created.id, ['terminated'])).status).toBe('terminated');
    } finally {
      await h.stop();
    }
  });
});
