/**
 * The embedded Temporal server stopped and started again (same SQLite file, same port) in the
 * middle of a run: the worker reconnects, in-flight work resumes, the objective completes.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, describe, expect, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { freePort, startDevServer, type DevServer } from '../workers/dev-server';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { waitFor } from './helpers/cli';
import { PLAN_BUILDER, helperFiles, writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo, tempDir } from './helpers/repo';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';

let server: DevServer | undefined;
let worker: WorkerProcess | undefined;
afterAll(async () => {
  worker?.crash();
  await server?.stop();
});

describe('embedded server restart', () => {
  it('resumes in-flight work after the server comes back with the same database', async () => {
    const dataDir = tempDir('slipway-restart-server-');
    const port = await freePort();
    server = await startDevServer({ dataDir, port, headless: true, startTimeoutMs: 120_000 });
    const env = { TEMPORAL_ADDRESS: server.address, SLIPWAY_TASK_QUEUE: `srv-${randomUUID().slice(0, 8)}` };
    worker = await startWorkerProcess(env);

    const repo = makeDemoRepo();
    const streams = ['one', 'two'];
    const file = writeObjective(
      {
        objective: 'survive a server restart',
        repository: repo,
        gates: [{ name: 'test', command: 'node --test' }],
        agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
        streams: streams.map((id) => ({ id, task: id })),
      },
      Object.fromEntries(streams.map((id) => [id, [{ files: helperFiles(id), sleep_ms: 3000 }]])),
    );
    const id = 'server-restart';
    const connect = async () => new Client({ connection: await Connection.connect({ address: server!.address }) });
    let client = await connect();
    await client.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });
    await waitFor(async () => {
      const s = await client.workflow.getHandle(objectiveWorkflowId(id)).query(objectiveStatusQuery);
      return s.streams.some((x) => x.phase === 'building');
    }, 'a builder to run');

    await server.stop();
    server = await startDevServer({ dataDir, port, headless: true, startTimeoutMs: 120_000 });
    client = await connect();

    const result = (await client.workflow.getHandle(objectiveWorkflowId(id)).result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(streams);
    expect(gitIn(repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(id)).split('\n')).toHaveLength(2);
  }, 300_000);
});
