/**
 * Objectives whose repository is a remote (here a local bare repository, by `file://` URL and by
 * plain path; no network in tests, so https/ssh are covered only by the pure classification in
 * test/remote-repository.test.ts): the worker that prepares the objective clones it under its own
 * SLIPWAY_HOME (docs/adr/0028), works on that clone and pushes the integration branch back,
 * leaving the remote's other refs as they were. Loading the file contacts nothing.
 */
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, realpathSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId, ownerTaskQueue } from '../core/ids';
import { mirrorRoot } from '../lib/remote-repository';
import { objectiveWorkflow } from '../workflows/objective';
import { DEMO_DIR, gitIn, makeDemoRepo, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';

let worker: TestWorker;
const previousHome = process.env.SLIPWAY_HOME;
beforeAll(async () => {
  process.env.SLIPWAY_HOME = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-remote-home-')));
  worker = await startTestWorker();
});
afterAll(async () => {
  await worker?.stop();
  if (previousHome === undefined) delete process.env.SLIPWAY_HOME;
  else process.env.SLIPWAY_HOME = previousHome;
});

function bareRemote(): string {
  const checkout = makeDemoRepo();
  const bare = path.join(realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-remote-'))), 'remote.git');
  execFileSync('git', ['clone', '-q', '--bare', checkout, bare]);
  // Refs Slipway must leave alone.
  gitIn(bare, 'branch', 'other', 'main');
  gitIn(bare, 'tag', 'v1', 'main');
  return bare;
}

const refs = (bare: string) => gitIn(bare, 'for-each-ref', '--format=%(refname) %(objectname)');

describe('objective on a remote repository', () => {
  for (const form of ['file:// URL', 'plain path'] as const) {
    it(`completes on a bare repository given as a ${form} and pushes only the integration branch`, async () => {
      const bare = bareRemote();
      const before = refs(bare);
      const id = form === 'plain path' ? 'remote-path' : 'remote-url';
      const url = form === 'plain path' ? bare : `file://${bare}`;
      const input = await loadObjectiveFile(path.join(DEMO_DIR, 'objective.yaml'), { repository: url, id });
      // The input names the remote; the clone is the worker's to make.
      expect(input.remote).toEqual({ url, protocol: 'file', baseBranch: 'main' });
      expect(existsSync(mirrorRoot(url))).toBe(false);

      const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
      // Downstream worked on Slipway's clone (this worker's home is this process's), never on the remote itself.
      expect(gitIn(mirrorRoot(url), 'rev-parse', `refs/heads/${integrationBranch(id)}`)).toBe(result.integrationHead);

      expect(result.outcome).toBe('completed');
      expect(result.error).toBeUndefined();
      const branch = integrationBranch(id);
      expect(gitIn(bare, 'rev-parse', `refs/heads/${branch}`)).toBe(result.integrationHead);
      expect(gitIn(bare, 'cat-file', '-t', `${branch}:src/clamp.js`)).toBe('blob');
      // Every ref the remote had is unchanged; the integration branch is the only new one.
      const after = refs(bare).split('\n');
      expect(after.filter((l) => !l.startsWith(`refs/heads/${branch} `)).join('\n')).toBe(before);
      expect(gitIn(bare, 'for-each-ref', '--format=%(refname)', 'refs/heads/slipway/')).toBe(`refs/heads/${branch}`);
    });
  }

  it('a remote the worker cannot read ends the objective before anything started, naming it', async () => {
    const nowhere = `file://${tempDir('slipway-remote-nowhere-')}/nowhere.git`;
    const input = await loadObjectiveFile(path.join(DEMO_DIR, 'objective.yaml'), { repository: nowhere, id: 'remote-nowhere' });
    const result = await worker.client.workflow.execute(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId('remote-nowhere'), args: [input] });
    expect(result.outcome).toBe('failed');
    expect(result.error).toMatch(/could not prepare the integration branch: cannot fetch file:\/\/.*nowhere\.git: /);
    expect(result.streams.every((s) => s.phase === 'waiting')).toBe(true);
    // A failed first clone leaves nothing behind.
    expect(existsSync(mirrorRoot(nowhere))).toBe(false);
  });
});

describe('objective on a remote repository, two workers as two hosts', () => {
  const procs: WorkerProcess[] = [];
  afterEach(() => {
    for (const w of procs.splice(0)) w.crash();
  });

  it('the worker that prepares the objective clones the remote under its own home (not the CLI\'s, not the other\'s) and the result lands in the remote', async () => {
    const taskQueue = `remote-${randomUUID().slice(0, 8)}`;
    const homes = [realpathSync(tempDir('slipway-home-a-')), realpathSync(tempDir('slipway-home-b-'))];
    const ids = ['host-a', 'host-b'];
    procs.push(
      ...(await Promise.all(
        homes.map((home, i) => startWorkerProcess({ TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: taskQueue, SLIPWAY_HOME: home, SLIPWAY_WORKER_ID: ids[i] })),
      )),
    );
    const bare = bareRemote();
    const before = refs(bare);
    const id = `remote-hosts-${randomUUID().slice(0, 6)}`;
    // This process plays the CLI's host: its SLIPWAY_HOME is neither worker's.
    const cliHome = process.env.SLIPWAY_HOME!;
    const input = await loadObjectiveFile(path.join(DEMO_DIR, 'objective.yaml'), { repository: bare, id });
    expect(input.remote).toMatchObject({ url: bare, protocol: 'file' });

    const c = new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
    const result = await c.workflow.execute(objectiveWorkflow, { taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    expect(result.error).toBeUndefined();
    expect(result.outcome).toBe('completed');

    // Who prepared it (ActivityTaskStarted's identity ends in the worker id) holds the clone and the merger.
    const history = await c.workflow.getHandle(objectiveWorkflowId(id)).fetchHistory();
    const scheduled = new Map<string, { type: string; queue: string }>();
    const started: { type: string; queue: string; by: string }[] = [];
    for (const e of history.events ?? []) {
      const a = e.activityTaskScheduledEventAttributes;
      if (a) scheduled.set(String(e.eventId), { type: a.activityType!.name!, queue: a.taskQueue!.name! });
      const b = e.activityTaskStartedEventAttributes;
      if (b) started.push({ ...scheduled.get(String(b.scheduledEventId))!, by: b.identity!.split('/').at(-1)! });
    }
    const prepare = started.find((a) => a.type === 'prepareObjective')!;
    const owner = ids.indexOf(prepare.by);
    expect(owner).toBeGreaterThanOrEqual(0);
    const [ownerHome, otherHome] = [homes[owner]!, homes[1 - owner]!];
    expect(gitIn(mirrorRoot(bare, ownerHome), 'config', '--get', 'slipway.remote')).toBe(bare);
    expect(existsSync(mirrorRoot(bare, otherHome))).toBe(false);
    expect(existsSync(mirrorRoot(bare, cliHome))).toBe(false);
    expect(existsSync(path.join(otherHome, 'repositories')) ? readdirSync(path.join(otherHome, 'repositories')) : []).toEqual([]);
    // Every merger activity (merges, push) went to that worker's own queue.
    const merger = started.filter((a) => a !== prepare);
    expect(merger.map((a) => a.type)).toEqual(expect.arrayContaining(['prepareMerger', 'finishObjective']));
    // One stream at a time, or several waiting ones in one batch (ADR 0031).
    expect(merger.some((a) => a.type === 'mergeWithGates' || a.type === 'mergeBatch')).toBe(true);
    for (const a of merger) {
      expect(a.queue, a.type).toBe(ownerTaskQueue(taskQueue, ids[owner]!));
      expect(a.by, a.type).toBe(ids[owner]);
    }

    // The result is in the remote: only the integration branch is new there.
    const branch = integrationBranch(id);
    expect(gitIn(bare, 'rev-parse', `refs/heads/${branch}`)).toBe(result.integrationHead);
    expect(gitIn(bare, 'cat-file', '-t', `${branch}:src/clamp.js`)).toBe('blob');
    expect(refs(bare).split('\n').filter((l) => !l.startsWith(`refs/heads/${branch} `)).join('\n')).toBe(before);
  });
});
