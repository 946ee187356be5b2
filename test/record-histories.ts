/**
 * Records the golden workflow histories of a release for the replay test (test/replay.test.ts):
 *   npx tsx test/record-histories.ts
 * It runs scenarios on a throwaway dev server and writes test/histories/<version>/<scenario>/*.json,
 * <version> being package.json's. A release's goldens are never overwritten (ADR 0007): it refuses
 * when the folder exists. Bump the version first; older releases' goldens keep replaying.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { historyToJSON } from '@temporalio/common/lib/proto-utils';
import { NativeConnection } from '@temporalio/worker';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import { startDevServer } from '../workers/dev-server';
import { testPort } from './helpers/ports';
import { installRuntimeLogging } from '../workers/logging';
import { createSlipwayWorkers } from '../workers/worker';
import { objectiveWorkflow } from '../workflows/objective';
import { PLAN_BUILDER, helperFiles, writeObjective } from './helpers/objective';
import { DEMO_DIR, makeDemoRepo, tempDir } from './helpers/repo';

const VERSION = (JSON.parse(readFileSync(path.join(__dirname, '..', 'package.json'), 'utf8')) as { version: string }).version;
const OUT = path.join(__dirname, 'histories', VERSION);

async function main() {
  if (existsSync(OUT)) throw new Error(`${OUT} exists: release ${VERSION}'s golden histories are never re-recorded (ADR 0007); bump the version in package.json first`);
  installRuntimeLogging();
  const server = await startDevServer({ dataDir: tempDir('slipway-record-'), port: await testPort(), headless: true });
  const native = await NativeConnection.connect({ address: server.address });
  const workers = await createSlipwayWorkers({ connection: native, taskQueue: 'record', shutdownGraceMs: 1_000 });
  const running = workers.run();
  const client = new Client({ connection: await Connection.connect({ address: server.address }) });
  try {
    const scenarios: Array<{ name: string; file: string; repo: string }> = [];
    const demoRepo = makeDemoRepo();
    scenarios.push({ name: 'demo-fix-loop', file: path.join(DEMO_DIR, 'objective.yaml'), repo: demoRepo });
    const conflictRepo = makeDemoRepo();
    scenarios.push({
      name: 'conflict-rebuild-and-partial',
      repo: conflictRepo,
      file: writeObjective(
        {
          objective: 'conflict rebuild and a failing stream',
          repository: conflictRepo,
          max_parallel_streams: 1,
          max_fix_iterations: 1,
          on_exhausted: 'fail',
          gates: [{ name: 'test', command: 'node --test' }],
          agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
          streams: [{ id: 'left', task: 'l' }, { id: 'right', task: 'r' }, { id: 'broken', task: 'b' }],
        },
        {
          left: [{ files: { 'README.md': '# left\n' } }],
          right: [{ files: { 'README.md': '# right\n' } }, { files: { 'README.md': '# left and right\n' } }],
          broken: [{ files: helperFiles('broken', '(x) => x', 'assert.strictEqual(1, 2)') }],
        },
      ),
    });
    // Since 0.2.0: streams in parallel with no gates (the stream owns its sandbox, merges in
    // batches by git's plumbing, no merger worktree: ADR 0031-0034).
    const parallelRepo = makeDemoRepo();
    scenarios.push({
      name: 'parallel-batch-without-gates',
      repo: parallelRepo,
      file: writeObjective(
        {
          objective: 'four streams merged without gates',
          repository: parallelRepo,
          max_parallel_streams: 4,
          agents: { builder: { provider: 'script', command: `node ${PLAN_BUILDER}` } },
          streams: ['a', 'b', 'c', 'd'].map((id) => ({ id, task: id })),
        },
        Object.fromEntries(['a', 'b', 'c', 'd'].map((id) => [id, [{ files: { [`${id}.txt`]: `${id}\n` } }]])),
      ),
    });
    for (const scenario of scenarios) {
      const input = await loadObjectiveFile(scenario.file, { repository: scenario.repo, id: scenario.name });
      const result = await client.workflow.execute(objectiveWorkflow, { taskQueue: 'record', workflowId: objectiveWorkflowId(scenario.name), args: [input] });
      const dir = path.join(OUT, scenario.name);
      mkdirSync(dir, { recursive: true });
      await new Promise((r) => setTimeout(r, 1_500)); // visibility is eventually consistent
      for await (const wf of client.workflow.list({ query: `SlipwayObjective = "${scenario.name}"` })) {
        const history = await client.workflow.getHandle(wf.workflowId, wf.runId).fetchHistory();
        // One file per run: a workflow that continued as new has several.
        writeFileSync(path.join(dir, `${wf.workflowId.replace(/[^a-zA-Z0-9._-]/g, '_')}.${wf.runId}.json`), historyToJSON(history));
      }
      console.log(`${scenario.name}: ${result.outcome}`);
    }
  } finally {
    workers.shutdown();
    await running;
    await native.close();
    await server.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
