/**
 * CLI start-up and worker start, side by side in one run (ADR 0016):
 *   npx tsx bench/cli.ts [--quick] [--json]
 * - `slipway --help`, `slipway run --help`, and `slipway list` / `slipway status <id>` against a
 *   running server, each paired with the `temporal` CLI doing the nearest thing (`temporal
 *   --help`, `temporal workflow list`, `temporal workflow describe`), run alternately so drift in
 *   the machine's speed hits both; medians of wall time and the ratio slipway/temporal.
 * - Worker start (both workers created, ready to poll) with the package's prebuilt workflow
 *   bundle against bundling the workflows at start, as every worker did before.
 * Runs the compiled package: `npm run build` first.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const root = path.join(__dirname, '..');
const dist = path.join(root, 'dist');
if (!existsSync(path.join(dist, 'cli', 'main.js'))) {
  console.error('bench/cli.ts runs the compiled package: run `npm run build` first');
  process.exit(1);
}
// The compiled modules, so the bench measures what users run.
const { freePort, startDevServer } = require(path.join(dist, 'workers', 'dev-server.js')) as typeof import('../workers/dev-server');
const { findTemporalBinary } = require(path.join(dist, 'workers', 'temporal-binary.js')) as typeof import('../workers/temporal-binary');
const { bundleWorkflows, createSlipwayWorkers, prebuiltWorkflowBundle } = require(path.join(dist, 'workers', 'worker.js')) as typeof import('../workers/worker');
const { registerSearchAttributes } = require(path.join(dist, 'workers', 'temporal.js')) as typeof import('../workers/temporal');

const quick = process.argv.includes('--quick');
const json = process.argv.includes('--json');
const runs = quick ? 5 : 15;
const bin = path.join(root, 'bin', 'slipway.cjs');

function wallMs(cmd: string, args: string[], env: NodeJS.ProcessEnv): number {
  const t0 = performance.now();
  const r = spawnSync(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'], encoding: 'utf8' });
  const ms = performance.now() - t0;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return ms;
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

(async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-bench-cli-'));
  const port = await freePort();
  const server = await startDevServer({ dataDir: dir, port, headless: true, startTimeoutMs: 120_000 });
  const results: Array<{ name: string; slipwayMs: number; temporalMs: number; ratio: number }> = [];
  let worker: { prebuiltMs: number; bundledMs: number } | undefined;
  try {
    const temporal = findTemporalBinary();
    // The HTTP path of `status`/`list` (ADR 0024), and the SDK path (no HTTP address known).
    const env = { ...process.env, TEMPORAL_ADDRESS: server.address, TEMPORAL_HTTP_ADDRESS: server.httpAddress, SLIPWAY_HOME: dir };
    const sdkEnv = { ...process.env, TEMPORAL_ADDRESS: server.address, SLIPWAY_HOME: dir };
    await registerSearchAttributes(server.address, 'default');
    // A closed objective for `status` to show (no worker needed: started, then terminated).
    const { Client, Connection } = require('@temporalio/client') as typeof import('@temporalio/client');
    const connection = await Connection.connect({ address: server.address });
    const client = new Client({ connection });
    const handle = await client.workflow.start('objectiveWorkflow', { taskQueue: 'bench-nobody', workflowId: 'objective:bench', args: [{}] });
    await handle.terminate('bench');
    const pairs: Array<[string, string[], string[], NodeJS.ProcessEnv]> = [
      ['--help', ['--help'], ['--help'], env],
      ['run --help', ['run', '--help'], ['workflow', 'start', '--help'], env],
      ['list (server running)', ['list'], ['workflow', 'list', '--address', server.address], env],
      ['status <id> (server running)', ['status', 'bench'], ['workflow', 'describe', '--workflow-id', 'objective:bench', '--address', server.address], env],
      ['list, SDK path', ['list'], ['workflow', 'list', '--address', server.address], sdkEnv],
      ['status <id>, SDK path', ['status', 'bench'], ['workflow', 'describe', '--workflow-id', 'objective:bench', '--address', server.address], sdkEnv],
    ];
    for (const [name, slipwayArgs, temporalArgs, slipwayEnv] of pairs) {
      wallMs(process.execPath, [bin, ...slipwayArgs], slipwayEnv); // warm-up, both
      wallMs(temporal, temporalArgs, env);
      const a: number[] = [];
      const b: number[] = [];
      const ratios: number[] = [];
      for (let i = 0; i < runs; i++) {
        a.push(wallMs(process.execPath, [bin, ...slipwayArgs], slipwayEnv));
        b.push(wallMs(temporal, temporalArgs, env));
        ratios.push(a[i] / b[i]);
      }
      results.push({ name, slipwayMs: median(a), temporalMs: median(b), ratio: median(ratios) });
    }
    await connection.close();

    // Worker start: the package's bundle against bundling now; alternated.
    const { NativeConnection, Runtime } = require('@temporalio/worker') as typeof import('@temporalio/worker');
    Runtime.install({ logger: new (require('@temporalio/worker').DefaultLogger)('ERROR') });
    const nativeConnection = await NativeConnection.connect({ address: server.address });
    const prebuilt = prebuiltWorkflowBundle();
    if (!prebuilt) throw new Error('dist/workflow-bundle.js is missing: run `npm run build`');
    const startOnce = async (bundleNow: boolean) => {
      const t0 = performance.now();
      const workers = await createSlipwayWorkers({
        connection: nativeConnection,
        taskQueue: `bench-${Math.random().toString(36).slice(2, 8)}`,
        workflowBundle: bundleNow ? await bundleWorkflows() : prebuilt,
      });
      const ms = performance.now() - t0;
      const run = workers.run();
      workers.shutdown();
      await run;
      return ms;
    };
    const pre: number[] = [];
    const bundled: number[] = [];
    for (let i = 0; i < (quick ? 2 : 4); i++) {
      pre.push(await startOnce(false));
      bundled.push(await startOnce(true));
    }
    worker = { prebuiltMs: median(pre), bundledMs: median(bundled) };
    await nativeConnection.close();
  } finally {
    await server.stop();
  }
  if (json) {
    process.stdout.write(`${JSON.stringify({ runs, cli: results, workerStart: worker })}\n`);
    return;
  }
  console.log(`wall time, median of ${runs} alternated runs (this machine, ${os.cpus().length} cores, load ${os.loadavg()[0].toFixed(1)})`);
  for (const r of results) {
    console.log(`  slipway ${r.name.padEnd(30)} ${r.slipwayMs.toFixed(0).padStart(5)} ms   temporal ${r.temporalMs.toFixed(0).padStart(5)} ms   ratio ${r.ratio.toFixed(2)}`);
  }
  if (worker) console.log(`worker start: prebuilt bundle ${worker.prebuiltMs.toFixed(0)} ms, bundled at start ${worker.bundledMs.toFixed(0)} ms`);
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
