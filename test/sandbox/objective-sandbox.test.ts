/**
 * Objectives end to end with the `sandbox:` section, on the real Temporal test server:
 * bubblewrap confinement with the network off (a gate proves it; the agent cannot write outside
 * its worktree), project setup in every sandbox, and a setup that keeps failing turning into the
 * stream's `sandbox_failure` with the output. The user's checkout stays untouched throughout.
 */
import { readFileSync, existsSync, promises as fs, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findExecutable } from '../../activities/sandbox/bubblewrap';
import { loadObjectiveFile } from '../../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamWorkflowId } from '../../core/ids';
import type { ObjectiveResult } from '../../core/types';
import { objectiveWorkflow } from '../../workflows/objective';
import { streamStatusQuery } from '../../workflows/stream';
import { writeObjective } from '../helpers/objective';
import { dirtyTheCheckout, gitIn, makeDemoRepo, pictureCheckout, tempDir } from '../helpers/repo';
import { startTestWorker, type TestWorker } from '../helpers/temporal';

const hasBwrap = findExecutable('bwrap') !== undefined;

/**
 * A builder that tries to escape (the user's checkout, $HOME, the objective folder), reports
 * what happened in a file inside its worktree, and writes its helper.
 */
const ESCAPING_AGENT = `
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
const stream = process.env.SLIPWAY_STREAM;
// From a file: the sandbox's environment never carries host paths of the repository (ADR 0006).
const targets = JSON.parse(readFileSync(path.join(process.env.SLIPWAY_OBJECTIVE_DIR, 'escape-targets.json'), 'utf8')).concat([
  path.join(os.homedir(), '.slipway-escape-' + stream),
  path.join(process.env.SLIPWAY_OBJECTIVE_DIR, 'escaped-' + stream),
]);
const report = targets.map((t) => {
  try { writeFileSync(t, 'escaped'); return t + ': WRITTEN'; } catch (e) { return t + ': ' + e.code; }
});
mkdirSync('src', { recursive: true }); mkdirSync('test', { recursive: true });
writeFileSync('escape-report-' + stream + '.txt', report.join('\\n') + '\\n');
writeFileSync('src/' + stream + '.js', 'module.exports = { ' + stream + ': (x) => x };\\n');
writeFileSync('test/' + stream + '.test.js', "const test = require('node:test');\\nconst assert = require('node:assert');\\nconst { " + stream + " } = require('../src/" + stream + "');\\ntest('" + stream + "', () => assert.strictEqual(" + stream + "(2), 2));\\n");
console.log('wrote ' + stream);
`;

let worker: TestWorker;
let home: string;
beforeAll(async () => {
  home = tempDir('slipway-home-');
  process.env.SLIPWAY_HOME = home;
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
  await fs.rm(home, { recursive: true, force: true });
});

async function run(file: string, repo: string, id: string): Promise<ObjectiveResult> {
  const input = await loadObjectiveFile(file, { repository: repo, id });
  return worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
}

describe('objective with sandbox: { confinement: bubblewrap, network: false }', () => {
  it('has bubblewrap (never skipped: a missing tool fails the suite)', () => {
    expect(hasBwrap, 'bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`').toBe(true);
  });
  it('runs agents, gates and setup confined: the network-off gate passes, escapes fail, the work merges, the checkout is untouched', async () => {
    const repo = makeDemoRepo();
    dirtyTheCheckout(repo);
    const before = pictureCheckout(repo);
    const server = net.createServer((socket) => socket.end('hello\n'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as net.AddressInfo).port;
    const escapeTargets = [path.join(repo, 'ESCAPED.txt'), path.join(repo, 'src', 'slug.js')];
    const id = 'confined-run';
    try {
      const file = writeObjective({
        objective: 'two helpers, built inside bubblewrap with the network off',
        repository: repo,
        max_fix_iterations: 0,
        on_exhausted: 'fail',
        sandbox: {
          confinement: 'bubblewrap',
          network: false,
          project_setup: { commands: ['echo "setup ran in $(basename "$PWD")" > .env'], verify: ['grep -q "setup ran" .env'] },
        },
        gates: [
          // Passes only when the sandbox cannot reach a server listening on the host's loopback.
          { name: 'network-off', command: `if bash -c 'exec 3<>/dev/tcp/127.0.0.1/${port}' 2>/dev/null; then echo "network reachable"; exit 1; fi; echo "network off"` },
          { name: 'test', command: 'node --test' },
        ],
        agents: { builder: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agent.mjs"' } },
        streams: [
          { id: 'alpha', task: 'alpha helper' },
          { id: 'beta', task: 'beta helper' },
        ],
      });
      const dir = path.dirname(file);
      writeFileSync(path.join(dir, 'agent.mjs'), ESCAPING_AGENT);
      writeFileSync(path.join(dir, 'escape-targets.json'), JSON.stringify(escapeTargets));

      const result = await run(file, repo, id);

      expect(result.error).toBeUndefined();
      expect(result.outcome).toBe('completed');
      expect([...result.mergeOrder].sort()).toEqual(['alpha', 'beta']);
      const branch = integrationBranch(id);
      for (const stream of ['alpha', 'beta']) {
        // Every escape was refused, or landed in the sandbox's private /tmp or home (the host's
        // files are checked below); the report landed through the worktree.
        const report = gitIn(repo, 'show', `${branch}:escape-report-${stream}.txt`).split('\n');
        expect(report).toHaveLength(4);
        for (const line of report) expect(line).toMatch(/: (EROFS|EACCES|ENOENT|WRITTEN)$/);
        for (const target of escapeTargets) expect(existsSync(target) ? readFileSync(target, 'utf8') : 'absent', target).not.toBe('escaped');
        expect(gitIn(repo, 'cat-file', '-t', `${branch}:src/${stream}.js`)).toBe('blob');
        expect(existsSync(path.join(os.homedir(), `.slipway-escape-${stream}`))).toBe(false);
        expect(existsSync(path.join(dir, `escaped-${stream}`))).toBe(false);
        // The gate ran in the sandbox and saw no network.
        const status = await worker.client.workflow.getHandle(streamWorkflowId(id, stream)).query(streamStatusQuery);
        expect(status.ledger).toEqual([]);
      }
      // Setup ran (confined) in each stream sandbox and the merger; its output is an ignored file, never committed.
      expect(() => gitIn(repo, 'cat-file', '-t', `${branch}:.env`)).toThrow();
      expect(existsSync(path.join(repo, 'ESCAPED.txt'))).toBe(false);
      expect(pictureCheckout(repo)).toEqual(before);
      expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
    } finally {
      server.close();
    }
  });
});

describe('objective with a project setup that keeps failing', () => {
  it("fails the stream as sandbox_failure with setup's output, after retrying setup", async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const id = 'setup-fails';
    const file = writeObjective({
      objective: 'a stream whose sandbox never gets ready',
      repository: repo,
      sandbox: {
        project_setup: {
          commands: ['echo "installing" >> .setup.log'],
          // The merger's setup passes; the stream's never does.
          verify: ['test "$(basename "$PWD")" = _merge || { echo "toolchain missing in $(basename "$PWD") after $(wc -l < .setup.log) runs"; exit 4; }'],
          attempts: 2,
        },
      },
      agents: { builder: { provider: 'script', command: 'true' } },
      streams: [{ id: 'doomed', task: 'never starts' }],
    });
    await fs.writeFile(path.join(repo, '.git', 'info', 'exclude'), '.setup.log\n', { flag: 'a' });
    const result = await run(file, repo, id);
    expect(result.outcome).toBe('failed');
    const doomed = result.streams.find((s) => s.id === 'doomed')!;
    expect(doomed.failure?.kind).toBe('sandbox_failure');
    expect(doomed.failure?.summary).toMatch(/^sandbox could not be created/);
    expect(doomed.iterations).toBe(0);
    // The activity failed once (not retried by Temporal: setup itself was retried), with setup's output.
    // The stream ran the create itself (ADR 0032).
    const history = await worker.client.workflow.getHandle(streamWorkflowId('setup-fails', 'doomed')).fetchHistory();
    const failures = (history.events ?? []).filter((e) => e.activityTaskFailedEventAttributes);
    expect(failures).toHaveLength(1);
    const cause = failures[0].activityTaskFailedEventAttributes!.failure!;
    expect(cause.applicationFailureInfo?.type).toBe('sandbox_failure');
    expect(cause.applicationFailureInfo?.nonRetryable).toBe(true);
    expect(cause.message).toContain('project setup failed after 2 attempts');
    expect(cause.message).toContain('toolchain missing in doomed after 2 runs');
    expect(pictureCheckout(repo)).toEqual(before);
  });
});

describe('objective with sandbox: { warm_pool }', () => {
  it('fills the pool for the base commit in the background, and the next objective claims from it', async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const spec = (id: string) =>
      writeObjective({
        objective: `warm ${id}`,
        repository: repo,
        sandbox: { warm_pool: 2, project_setup: { commands: ['echo ok > .env'], verify: ['test -f .env'] } },
        agents: { builder: { provider: 'script', command: `echo "module.exports = 1;" > ${id}.js` } },
        streams: [{ id: 'one', task: 'x' }],
      });
    const ready = async () => (await fs.readdir(path.join(repo, '.slipway/pool')).catch(() => [] as string[])).filter((n) => n.endsWith('.ready'));
    expect((await run(spec('first'), repo, 'warm-first')).outcome).toBe('completed');
    const deadline = Date.now() + 60_000;
    while ((await ready()).length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
    const entries = await ready();
    expect(entries).toHaveLength(2);
    // The second objective starts at the same base: its stream takes one of those entries.
    const second = await run(spec('second'), repo, 'warm-second');
    expect(second.outcome).toBe('completed');
    // (A refill may finish between the two claims, so the stream may take a new entry.)
    expect((await ready()).filter((e) => entries.includes(e)).length).toBeLessThan(2);
    // The stream takes a pool entry; the merger, where only git runs (no gates, no planner), is
    // made lean and never from the pool (ADR 0018, lazy merger).
    const created = (branch: string) => gitIn(repo, 'reflog', 'show', '--format=%gs', branch).split('\n').pop();
    expect(created('slipway/warm-second/one')).toMatch(/^branch: Created from [0-9a-f]{40} \(warm pool\)$/);
    expect(created(integrationBranch('warm-second'))).not.toMatch(/warm pool/);
    expect(pictureCheckout(repo)).toEqual(before);
  });
});
