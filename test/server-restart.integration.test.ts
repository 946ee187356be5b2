/**
 * The embedded Temporal server stopped and started again (same SQLite file, same port) in the
 * middle of a run, or killed (SIGKILL): the worker reconnects, in-flight work resumes, the
 * objective completes with one merge per stream.
 */
import { randomUUID } from 'node:crypto';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { startDevServer, type DevServer } from '../workers/dev-server';
import { testPort } from './helpers/ports';
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
  /**
   * Two streams whose builders take 3 s; while one builds, the server goes down (`stop`: SIGTERM;
   * `kill`: SIGKILL, nothing flushed) and comes back on the same SQLite file and port.
   */
  const runThroughRestart = async (id: string, down: (s: DevServer, dataDir: string) => Promise<void>) => {
    const dataDir = tempDir('slipway-restart-server-');
    const port = await testPort();
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
    const connect = async () => new Client({ connection: await Connection.connect({ address: server!.address }) });
    let client = await connect();
    await client.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [await loadObjectiveFile(file, { id })] });
    await waitFor(async () => {
      const s = await client.workflow.getHandle(objectiveWorkflowId(id)).query(objectiveStatusQuery);
      return s.streams.some((x) => x.phase === 'building');
    }, 'a builder to run');

    await down(server, dataDir);
    server = await startDevServer({ dataDir, port, headless: true, startTimeoutMs: 120_000 });
    client = await connect();

    const result = (await client.workflow.getHandle(objectiveWorkflowId(id)).result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(streams);
    // One merge per stream: nothing the server had acknowledged was lost and done again.
    expect(gitIn(repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(id)).split('\n')).toHaveLength(2);
    worker.crash();
    await server.stop();
  };

  it('resumes in-flight work after the server comes back with the same database', async () => {
    await runThroughRestart('server-restart', (s) => s.stop());
  }, 300_000);

  it('loses nothing when the server is killed (SIGKILL) in the middle of a run, with SQLite in WAL mode (ADR 0035)', async () => {
    await runThroughRestart('server-kill', async (s, dataDir) => {
      const exited = new Promise((resolve) => s.process.once('exit', resolve));
      s.process.kill('SIGKILL');
      await exited;
      // Commits of the killed server are in the write-ahead log, not yet in the database file.
      expect(existsSync(path.join(dataDir, 'temporal.sqlite-wal'))).toBe(true);
    });
  }, 300_000);
});
