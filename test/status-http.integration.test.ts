/**
 * `slipway status` and `list` over Temporal's HTTP API (no SDK loaded) give the same output as
 * through the SDK (ADR 0024): a server of this file's own (so `list` sees only these objectives),
 * a real worker, objectives completed, blocked (running, answered by a query), terminated, and
 * payloads encrypted with SLIPWAY_PAYLOAD_KEY; the compiled CLI run each way, its loaded modules
 * recorded to prove which path it took.
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult, ObjectiveStatus } from '../core/types';
import { temporalEndpointsFile } from '../lib/settings';
import { startDevServer, type DevServer } from '../workers/dev-server';
import { testPort } from './helpers/ports';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { COMPILED_BIN, ensureBuilt } from './helpers/build';
import { waitFor } from './helpers/cli';
import { writeObjective } from './helpers/objective';
import { makeDemoRepo, PROJECT_ROOT, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

// Every payload this file's worker and CLI runs write or read is encrypted (the worker reads the
// key from the environment when it starts).
process.env.SLIPWAY_PAYLOAD_KEY = randomBytes(32).toString('base64');

const FAKE = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'fake-agent.mjs');
const builder = { provider: 'claude-code', command: `node ${FAKE} --format claude` };
const helper = (name: string) => ({ [`src/${name}.js`]: `module.exports = { ${name}: (x) => x };\n` });

let home: string;
let server: DevServer;
let worker: TestWorker;
let port: number;

beforeAll(async () => {
  home = tempDir('slipway-http-home-');
  port = await testPort();
  const built = ensureBuilt();
  server = await startDevServer({ dataDir: home, port, headless: true, startTimeoutMs: 120_000 });
  worker = await startTestWorker({ address: server.address });
  await built;
}, 600_000);

afterAll(async () => {
  await worker?.stop();
  await server?.stop();
});

async function start(id: string, spec: Record<string, unknown>, plan: Record<string, unknown>) {
  const file = writeObjective({ repository: makeDemoRepo(), objective: 'add helpers', agents: { builder }, ...spec });
  writeFileSync(path.join(path.dirname(file), 'fake-plan.json'), JSON.stringify(plan));
  const input = await loadObjectiveFile(file, { id });
  return worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
}

/**
 * The compiled CLI, with a hook that records the @temporalio modules it loaded. Not spawnSync:
 * this process hosts the worker that answers the CLI's status query.
 */
async function cli(args: string[], env: NodeJS.ProcessEnv) {
  const dir = tempDir('slipway-http-hook-');
  const hook = path.join(dir, 'hook.cjs');
  const out = path.join(dir, 'modules.json');
  writeFileSync(hook, `process.on('exit', () => require('node:fs').writeFileSync(${JSON.stringify(out)}, JSON.stringify(Object.keys(require.cache))));\n`);
  const base = { ...process.env };
  for (const v of ['TEMPORAL_ADDRESS', 'TEMPORAL_HTTP_ADDRESS', 'SLIPWAY_HOME', 'SLIPWAY_TEMPORAL_PORT']) delete base[v];
  const run = await new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = execFile(process.execPath, ['--require', hook, COMPILED_BIN, ...args], { cwd: dir, encoding: 'utf8', env: { ...base, ...env } }, (_e, stdout, stderr) =>
      resolve({ status: child.exitCode, stdout, stderr }),
    );
  });
  const modules = existsSync(out) ? (JSON.parse(readFileSync(out, 'utf8')) as string[]) : [];
  return { code: run.status, stdout: run.stdout, stderr: run.stderr, temporalModules: modules.filter((m) => /[\\/]@temporalio[\\/]/.test(m)).length };
}

describe('status and list over the HTTP API', () => {
  it('the embedded server records its HTTP API beside its data, and removes the record when it stops', () => {
    expect(JSON.parse(readFileSync(temporalEndpointsFile(home), 'utf8'))).toEqual({ address: server.address, httpAddress: server.httpAddress });
  });

  it('give the same output as the SDK path, for completed, blocked, terminated and unknown objectives and the list; only the SDK path loads the SDK', async () => {
    const done = await start('http-done', { streams: [{ id: 'greet', task: 'add greet' }] }, { 'builder:greet': [{ files: helper('greet'), say: 'wrote greet' }] });
    // As in budget.integration.test.ts: two runs spend $0.025 of $0.02, the third is held.
    const blocked = await start(
      'http-blocked',
      { agents: { builder: { ...builder, max_iterations: 3 } }, streams: [{ id: 'sum', task: 'add sum' }], budget: { stream: { usd: 0.02 } } },
      { 'builder:sum': [{ files: helper('sum'), say: 'wrote sum' }, { say: 'polished' }, { say: 'done' }] },
    );
    const stopped = await start('http-stopped', { streams: [{ id: 'idle', task: 'wait' }] }, {});
    // Once its first task ran (it sets the search attributes `list` finds it by).
    await waitFor(() => stopped.query(objectiveStatusQuery), 'objective http-stopped answering', 120_000);
    await stopped.terminate('stopped by the test');
    expect(((await done.result()) as ObjectiveResult).outcome).toBe('completed');
    await waitFor(async () => (await blocked.query(objectiveStatusQuery)).streams.find((s) => s.blocked), 'stream sum blocked on its budget', 180_000);

    const paths = {
      // The embedded server's record (no TEMPORAL_ADDRESS).
      embedded: { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(port) },
      // A server given by address, with its HTTP API.
      address: { TEMPORAL_ADDRESS: server.address, TEMPORAL_HTTP_ADDRESS: server.httpAddress },
      // The SDK: TEMPORAL_ADDRESS alone.
      sdk: { TEMPORAL_ADDRESS: server.address, SLIPWAY_HOME: tempDir('slipway-http-nohome-') },
    };
    // Visibility lags a moment behind the workflows: wait until the list shows the three final-looking.
    await waitFor(async () => {
      const run = await cli(['list', '--json'], paths.sdk);
      const rows = JSON.parse(run.stdout || '[]') as Array<{ objectiveId: string; status: string; costUsd?: number }>;
      const by = (id: string) => rows.find((r) => r.objectiveId === id);
      if (by('http-done')?.status === 'completed' && by('http-stopped')?.status === 'terminated' && by('http-blocked')?.costUsd !== undefined) return true;
      throw new Error(`list: ${run.stdout}${run.stderr}`);
    }, 'the list showing every objective', 120_000);

    const commands = [
      ['list'],
      ['list', '--json'],
      ['list', '--limit', '2'],
      ['status', 'http-done'],
      ['status', 'http-done', '--json'],
      ['status', 'http-blocked'],
      ['status', 'http-blocked', '--json'],
      ['status', 'http-stopped'],
      ['status', 'http-stopped', '--json'],
      ['status', 'nope'],
    ];
    for (const args of commands) {
      const sdk = await cli(args, paths.sdk);
      const embedded = await cli(args, paths.embedded);
      const address = await cli(args, paths.address);
      const what = args.join(' ');
      expect(sdk.temporalModules, what).toBeGreaterThan(0);
      expect(embedded.temporalModules, what).toBe(0);
      expect(address.temporalModules, what).toBe(0);
      for (const http of [embedded, address]) {
        expect({ code: http.code, stdout: http.stdout, stderr: http.stderr }, what).toEqual({ code: sdk.code, stdout: sdk.stdout, stderr: sdk.stderr });
      }
    }

    // What was compared is real content, decrypted.
    const blockedOut = await cli(['status', 'http-blocked', '--json'], paths.embedded);
    const blockedJson = JSON.parse(blockedOut.stdout) as ObjectiveStatus & { workflowStatus: string };
    expect(blockedJson.workflowStatus).toBe('RUNNING');
    expect(blockedJson.streams?.[0]?.blocked?.kind, blockedOut.stdout + blockedOut.stderr).toBe('budget_exhausted');
    expect((await cli(['status', 'http-done'], paths.embedded)).stdout).toContain('completed');
    expect((await cli(['status', 'http-stopped'], paths.embedded)).stdout).toBe('objective http-stopped: workflow terminated: stopped by the test\n');
    const unknown = await cli(['status', 'nope'], paths.embedded);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toBe('slipway: no objective "nope"\n');
    const list = (await cli(['list'], paths.embedded)).stdout;
    for (const id of ['http-done', 'http-blocked', 'http-stopped']) expect(list).toContain(id);

    // Without the key, the payloads cannot be read on either path: the codec is really in use.
    const noKey = await cli(['status', 'http-done', '--json'], { ...paths.embedded, SLIPWAY_PAYLOAD_KEY: '' });
    expect(noKey.code).not.toBe(0);
    expect(noKey.stdout).toBe('');
    expect(noKey.stderr).toContain('binary/encrypted');
  }, 600_000);

  it('a stale record (its HTTP port closed) falls back to the SDK path with the same answer', async () => {
    const staleHome = tempDir('slipway-http-stale-');
    writeFileSync(temporalEndpointsFile(staleHome), JSON.stringify({ address: server.address, httpAddress: `127.0.0.1:${await testPort()}` }));
    const stale = await cli(['status', 'http-done', '--json'], { SLIPWAY_HOME: staleHome, SLIPWAY_TEMPORAL_PORT: String(port) });
    expect(stale.code, stale.stderr).toBe(0);
    expect(stale.temporalModules).toBeGreaterThan(0);
    expect(stale.stdout).toBe((await cli(['status', 'http-done', '--json'], { TEMPORAL_ADDRESS: server.address })).stdout);
  }, 120_000);

  it('a malformed TEMPORAL_HTTP_ADDRESS is bad input naming the variable', async () => {
    const bad = await cli(['list'], { TEMPORAL_ADDRESS: server.address, TEMPORAL_HTTP_ADDRESS: 'http://x:1/some/path' });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('TEMPORAL_HTTP_ADDRESS');
  });

  it('stopping the server removes its record', async () => {
    const dir = tempDir('slipway-http-own-');
    const own = await startDevServer({ dataDir: dir, port: await testPort(), headless: true, startTimeoutMs: 120_000 });
    expect(existsSync(temporalEndpointsFile(dir))).toBe(true);
    await own.stop();
    expect(existsSync(temporalEndpointsFile(dir))).toBe(false);
  }, 180_000);
});
