/**
 * Rediscovery: a worker SIGKILLed while it creates a stream's sandbox (in the middle of project
 * setup). The sandbox workflow's retried create, on a new worker process, finds the half-made
 * worktree through `git worktree list` and Slipway's record, and makes it again in place: one
 * worktree, one branch, created once. Live sandboxes listed by the provider match their sandbox
 * workflows.
 */
import { randomUUID } from 'node:crypto';
import { promises as fs, readFileSync } from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { afterAll, afterEach, describe, expect, inject, it } from 'vitest';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { loadObjectiveFile } from '../../config/objective-file';
import { integrationBranch, objectiveWorkflowId, streamSandboxId, streamWorkflowId } from '../../core/ids';
import type { ObjectiveResult } from '../../core/types';
import { objectiveWorkflow } from '../../workflows/objective';
import { sandboxStateQuery } from '../../workflows/sandbox';
import { waitFor } from '../helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective } from '../helpers/objective';
import { gitIn, makeDemoRepo, pictureCheckout, tempDir } from '../helpers/repo';
import { startWorkerProcess, type WorkerProcess } from '../helpers/worker-process';

const workers: WorkerProcess[] = [];
const cleanup: string[] = [];
afterEach(() => {
  for (const w of workers.splice(0)) w.crash();
});
afterAll(async () => {
  for (const dir of cleanup) await fs.rm(dir, { recursive: true, force: true });
});

const lines = (file: string) => {
  try {
    return readFileSync(file, 'utf8').split('\n').filter(Boolean);
  } catch {
    return [];
  }
};

describe('rediscovery after a worker is killed', () => {
  it('mid-create (during project setup): the retried create re-makes the same worktree on the same branch, nothing twice', async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const home = tempDir('slipway-home-');
    const marks = tempDir('slipway-marks-');
    cleanup.push(home, marks);
    const setupLog = path.join(marks, 'setup.log');
    const id = 'killed-mid-create';
    const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `rediscover-${randomUUID().slice(0, 8)}`, SLIPWAY_HOME: home };
    const file = writeObjective(
      {
        objective: 'one stream whose sandbox setup is slow',
        repository: repo,
        gates: [{ name: 'test', command: 'node --test' }],
        sandbox: { project_setup: { commands: [`echo "start $(basename "$PWD")" >> ${setupLog}`, 'sleep 2', `echo "done $(basename "$PWD")" >> ${setupLog}`] } },
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: [{ id: 'one', task: 'helper one' }],
      },
      { one: [{ files: helperFiles('one') }] },
    );
    const client = new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
    workers.push(await startWorkerProcess(env));
    const handle = await client.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });

    // Kill the worker, and everything it started, while the stream's setup sleeps.
    await waitFor(async () => lines(setupLog).includes('start one'), "the stream's setup to start", 60_000, 50);
    workers[0].crash();
    const root = path.join(repo, '.slipway/worktrees', id, 'one');
    const record = JSON.parse(await fs.readFile(path.join(repo, '.slipway/sandboxes', id, 'one.json'), 'utf8'));
    expect(record.state).toBe('creating');
    expect(lines(setupLog)).not.toContain('done one');

    // A new worker: the create is retried (after the heartbeat timeout) and finds the half-made sandbox.
    workers.push(await startWorkerProcess(env));
    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect(lines(setupLog).filter((l) => l === 'start one')).toHaveLength(2);
    expect(lines(setupLog).filter((l) => l === 'done one')).toHaveLength(1);

    // One branch per stream, created once (its reflog starts with a single creation), no stray worktrees.
    expect(gitIn(repo, 'branch', '--list', '--format=%(refname:short)', `slipway/${id}/*`).split('\n').sort()).toEqual([integrationBranch(id), `slipway/${id}/one`]);
    const reflog = gitIn(repo, 'reflog', 'show', '--format=%gs', `slipway/${id}/one`).split('\n');
    expect(reflog.filter((l) => /^branch: Created/.test(l))).toHaveLength(1);
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
    expect(await fs.readdir(path.join(repo, '.slipway/worktrees')).catch(() => [])).toEqual([]);
    expect(root).toContain(id);
    expect(pictureCheckout(repo)).toEqual(before);
  });

  it('a new process finds live sandboxes through git worktree list, and each matches the sandbox its stream holds', async () => {
    const repo = makeDemoRepo();
    const home = tempDir('slipway-home-');
    cleanup.push(home);
    const id = 'rediscover-live';
    const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `rediscover-${randomUUID().slice(0, 8)}`, SLIPWAY_HOME: home };
    const file = writeObjective(
      {
        objective: 'two streams that take a while',
        repository: repo,
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: [{ id: 'a', task: 'a' }, { id: 'b', task: 'b' }],
      },
      { a: [{ files: helperFiles('a'), sleep_ms: 12_000 }], b: [{ files: helperFiles('b'), sleep_ms: 12_000 }] },
    );
    const client = new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
    workers.push(await startWorkerProcess(env));
    const handle = await client.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });
    // Both streams hold their worktrees (ready; they own their sandboxes, ADR 0032) before the worker is killed: a worktree
    // is listed as soon as git adds it, while its create is still running.
    await waitFor(async () => {
      const states = await Promise.all(['a', 'b'].map((stream) => client.workflow.getHandle(streamWorkflowId(id, stream)).query(sandboxStateQuery).catch(() => undefined)));
      return states.every((st) => st?.state === 'ready') ? true : undefined;
    }, 'both sandboxes ready', 60_000);
    const fresh = new LocalSandboxProvider();
    const live = (await fresh.list(repo)).filter((s) => s.sandboxId === streamSandboxId(id, 'a') || s.sandboxId === streamSandboxId(id, 'b'));
    expect(live).toHaveLength(2);
    workers[0].crash();
    // A new worker answers for the streams; the worktrees it finds are their sandboxes.
    workers.push(await startWorkerProcess(env));
    for (const s of live) {
      const stream = path.basename(s.root);
      expect(s.sandboxId).toBe(streamSandboxId(id, stream));
      expect(s.branch).toBe(`slipway/${id}/${stream}`);
      const state = await client.workflow.getHandle(streamWorkflowId(id, stream)).query(sandboxStateQuery);
      expect(state.state).toBe('ready');
      expect(state.info?.path).toBe(s.root);
      expect(state.info?.branch).toBe(s.branch);
    }
    expect(((await handle.result()) as ObjectiveResult).outcome).toBe('completed');
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
  });
});
