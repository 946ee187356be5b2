/**
 * `slipway attach` on the real Temporal server with the fake agent: a blocked stream, a human
 * who fixes it by hand in a terminal in its sandbox (driven through a real terminal, util-linux
 * script(1)), exit, `--resume`, and the stream finishes with the human's work merged.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { trustRepository } from '../config/trust';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { streamStatusQuery } from '../workflows/stream';
import { BIN, slipway, waitFor } from './helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

let worker: TestWorker;
let cliEnv: NodeJS.ProcessEnv;
beforeAll(async () => {
  worker = await startTestWorker();
  cliEnv = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue };
});
afterAll(async () => {
  await worker?.stop();
});

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

describe('slipway attach', () => {
  it('a human fixes a blocked stream by hand in its sandbox; --resume hands it back and the fix is merged', async () => {
    const id = 'attach-fix';
    const repo = makeDemoRepo();
    const file = writeObjective(
      {
        repository: repo,
        objective: 'one stream needs a human hand',
        max_fix_iterations: 1,
        gates: [{ name: 'test', command: 'node --test' }],
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: [{ id: 'stuck', task: 'a helper whose test the builder gets wrong' }],
      },
      // The builder writes a failing test every time; guided, it does nothing (the human's fix stands).
      { stuck: [{ files: helperFiles('stuck', '(x) => x', 'assert.strictEqual(1, 2)') }], 'stuck:guided': [{ files: {} }] },
    );
    await trustRepository(repo);
    const input = await loadObjectiveFile(file, { id });
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    await waitFor(async () => (await handle.query(objectiveStatusQuery)).streams.find((s) => s.id === 'stuck' && s.phase === 'blocked'), 'the stream to block', 180_000);

    // Refused up front: an unknown stream, --resume of a stream that is not blocked is checked too.
    const unknown = await slipway(['attach', id, 'ghost'], cliEnv);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain('no stream "ghost"');

    const base = { ...process.env };
    delete base.TEMPORAL_ADDRESS;
    const child = spawn('script', ['-qfec', [process.execPath, BIN, 'attach', id, 'stuck', '--resume', '-m', 'Fix the assertion by hand'].map(quote).join(' '), '/dev/null'], {
      env: { ...base, ...cliEnv, TERM: 'xterm' },
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let screen = '';
    child.stdout.on('data', (d: Buffer) => (screen += d.toString()));
    child.stderr.on('data', (d: Buffer) => (screen += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    const type = (keys: string) => child.stdin.write(keys);
    expect(await waitFor(async () => (type('echo ready-$((2+3))\r'), screen.includes('ready-5')), 'the shell in the sandbox', 60_000)).toBe(true);
    // The human's work: fix the test and add a note, through the terminal session.
    type(`sed -i 's/assert.strictEqual(1, 2)/assert.strictEqual(stuck(2), 2)/' test/stuck.test.js && printf 'fixed by hand\\n' > HUMAN.md && echo done-$((3+4))\r`);
    expect(await waitFor(async () => screen.includes('done-7'), 'the edit', 30_000)).toBe(true);
    type('exit\r');
    expect(await exited, screen).toBe(0);
    expect(screen).toMatch(/committed [0-9a-f]{12} on slipway\/attach-fix\/stuck/);
    expect(screen).toContain('stream stuck resumes at step');

    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    const integration = integrationBranch(id);
    expect(gitIn(repo, 'show', `${integration}:HUMAN.md`)).toBe('fixed by hand');
    expect(gitIn(repo, 'show', `${integration}:test/stuck.test.js`)).toContain('assert.strictEqual(stuck(2), 2)');
    // The human's commit carries their message; the ledger records the hand-over as guidance.
    expect(gitIn(repo, 'log', '--format=%s', integration)).toContain('Fix the assertion by hand');
    const ledger = (await worker.client.workflow.getHandle(streamWorkflowId(id, 'stuck')).query(streamStatusQuery)).ledger;
    expect(ledger.find((e) => e.result === 'guidance_applied')).toMatchObject({ summary: 'slipway attach' });
    expect(ledger.find((e) => e.result === 'guidance_applied')?.guidance).toContain('Fix the assertion by hand');
  }, 300_000);
});
