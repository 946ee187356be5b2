/**
 * `slipway dev` when its Temporal server dies: the server is restarted on the same SQLite file
 * (workflows kept, the worker reconnects), and when it cannot be, `dev` exits saying why.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { afterAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import type { ObjectiveInput, ObjectiveResult } from '../core/types';
import { testPort } from './helpers/ports';
import { BIN, waitFor } from './helpers/cli';
import { DEMO_DIR, makeDemoRepo, PROJECT_ROOT, tempDir } from './helpers/repo';

let dev: ChildProcess | undefined;
afterAll(() => {
  if (dev && dev.exitCode === null) dev.kill('SIGKILL');
});

/** The `temporal server start-dev` process that `slipway dev` started. */
function serverPid(parent: number): number | undefined {
  const out = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(parent)], { encoding: 'utf8' });
  const line = out.split('\n').find((l) => l.includes('start-dev'));
  return line ? Number(line.trim().split(/\s+/)[0]) : undefined;
}

describe('slipway dev supervises its Temporal server', () => {
  it('restarts a killed server with the same data, the worker carries on; a server that cannot restart ends dev with the reason', async () => {
    const home = tempDir('slipway-dev-home-');
    const port = await testPort();
    const taskQueue = `dev-restart-${port}`;
    const env: NodeJS.ProcessEnv = { ...process.env, SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(port), SLIPWAY_UI_PORT: String(await testPort()), SLIPWAY_TASK_QUEUE: taskQueue };
    delete env.TEMPORAL_ADDRESS;
    let output = '';
    dev = spawn(process.execPath, [BIN, 'dev'], { cwd: PROJECT_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    dev.stdout!.on('data', (c) => (output += c));
    dev.stderr!.on('data', (c) => (output += c));
    const exited = new Promise<number | null>((resolve) => dev!.once('exit', (code) => resolve(code)));
    await waitFor(async () => output.includes('worker polling') || (dev!.exitCode !== null && Promise.reject(new Error(output))), '`slipway dev` to poll', 120_000);

    // An objective that ends quickly: its base branch is gone when the workflow prepares it.
    const repo = makeDemoRepo();
    const objective = async (id: string): Promise<ObjectiveInput> => ({ ...(await loadObjectiveFile(path.join(DEMO_DIR, 'objective.yaml'), { repository: repo, id })), baseBranch: 'gone' });
    const run = async (id: string) => {
      const connection = await Connection.connect({ address: `127.0.0.1:${port}` });
      try {
        const client = new Client({ connection });
        const handle = await client.workflow.start('objectiveWorkflow', { taskQueue, workflowId: objectiveWorkflowId(id), args: [await objective(id)] });
        return (await handle.result()) as ObjectiveResult;
      } finally {
        await connection.close();
      }
    };
    expect((await run('before-kill')).outcome).toBe('failed');

    const first = serverPid(dev.pid!);
    expect(first).toBeDefined();
    process.kill(first!, 'SIGKILL');
    await waitFor(async () => output.includes('Temporal dev server restarted'), 'the server to be restarted', 120_000);
    expect(output).toContain('the Temporal dev server was killed by SIGKILL; restarting it (1/5)');
    expect(serverPid(dev.pid!)).not.toBe(first);

    // The SQLite file kept the run from before, and the worker reconnected to run a new one.
    const connection = await Connection.connect({ address: `127.0.0.1:${port}` });
    try {
      const before = await new Client({ connection }).workflow.getHandle(objectiveWorkflowId('before-kill')).describe();
      expect(before.status.name).toBe('COMPLETED');
    } finally {
      await connection.close();
    }
    expect((await run('after-restart')).error).toMatch(/could not prepare the integration branch/);

    // A server that cannot come back (its database is no longer one) ends `dev`, saying so.
    const db = path.join(home, 'temporal.sqlite');
    for (const f of [db, `${db}-wal`, `${db}-shm`]) await fs.rm(f, { force: true });
    await fs.writeFile(db, 'not a database, on purpose\n'.repeat(200));
    process.kill(serverPid(dev.pid!)!, 'SIGKILL');
    expect(await exited).toBe(1);
    expect(output).toMatch(/could not be restarted/);
    expect(output).toMatch(/slipway dev stopped: the Temporal dev server was killed by SIGKILL and could not be restarted/);
  }, 300_000);
});
