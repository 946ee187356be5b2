/**
 * Objectives end to end with container sandboxes (`sandbox: { provider: podman }`, ADR 0012):
 * every stream builds, runs its gates and is reviewed in a podman container started from a git
 * bundle, its work comes back as a bundle, and the merge queue merges it as for local sandboxes.
 * Then a worker killed with SIGKILL mid-run: a new worker finds the containers again and the
 * objective ends as an undisturbed run does. Real Temporal, real git, real podman.
 */
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { cpSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { stringify } from 'yaml';
import { engineEnv } from '../activities/sandbox/container';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { waitFor } from './helpers/cli';
import { DEMO_DIR, gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';

const containersOf = (objectiveId: string) =>
  execFileSync('podman', ['ps', '-a', '--filter', `label=slipway.group=${objectiveId}`, '--format', '{{.Names}}'], { env: engineEnv(), encoding: 'utf8' }).split('\n').filter(Boolean);

/** The demo objective (three helpers, one fixed after a gate failure) in a folder of its own, on podman. */
function podmanObjective(repo: string, extra: Record<string, unknown> = {}): string {
  const dir = tempDir('slipway-podman-objective-');
  cpSync(path.join(DEMO_DIR, 'agents'), path.join(dir, 'agents'), { recursive: true });
  const file = path.join(dir, 'objective.yaml');
  writeFileSync(
    file,
    stringify({
      objective: 'Add greet, sum and clamp helpers to the toolkit, each with a test',
      repository: repo,
      base_branch: 'main',
      max_parallel_streams: 3,
      max_fix_iterations: 2,
      gates: [{ name: 'test', command: 'node --test', timeout_seconds: 120 }],
      agents: {
        builder: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/builder.mjs"' },
        reviewer: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/reviewer.mjs"' },
      },
      streams: [
        { id: 'greet', task: 'Add greet(name) returning "Hello, <name>!"' },
        { id: 'sum', task: 'Add sum(values) adding up an array of numbers' },
        { id: 'clamp', task: 'Add clamp(value, low, high) keeping a number within bounds' },
      ],
      sandbox: { provider: 'podman', network: false, limits: { memory_mb: 512, processes: 256 } },
      ...extra,
    }),
  );
  return file;
}

describe('objectives on podman', () => {
  let worker: TestWorker;
  beforeAll(async () => {
    worker = await startTestWorker();
  });
  afterAll(async () => {
    await worker?.stop();
  });

  it('builds three streams in containers, fixes a gate failure, merges all, removes the containers and leaves the checkout untouched', async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const id = `podman-${randomUUID().slice(0, 6)}`;
    const input = await loadObjectiveFile(podmanObjective(repo), { id });
    expect(input.sandbox?.provider).toBe('podman');
    const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
    // While it runs, its streams live in containers (labelled with the objective).
    await waitFor(async () => containersOf(id).length > 0, 'a stream container');
    const result = (await handle.result()) as ObjectiveResult;

    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(['clamp', 'greet', 'sum']);
    expect(result.streams.find((s) => s.id === 'clamp')!.iterations).toBe(2);
    const branch = integrationBranch(id);
    for (const name of ['greet', 'sum', 'clamp']) expect(gitIn(repo, 'cat-file', '-t', `${branch}:src/${name}.js`)).toBe('blob');
    expect(gitIn(repo, 'show', `${branch}:src/clamp.js`)).toContain('Math.min(Math.max(value, low), high)');
    // The streams' work came back by bundle: no stream worktree was ever registered.
    expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
    expect(gitIn(repo, 'branch', '--list', `slipway/${id}/*`).split('\n')).toHaveLength(4);
    expect(containersOf(id)).toEqual([]);
    expect(pictureCheckout(repo)).toEqual(before);
    gitIn(repo, 'fsck', '--strict', '--no-dangling');
  }, 300_000);
});

describe('a worker killed mid-run with podman sandboxes', () => {
  const workers: WorkerProcess[] = [];
  afterEach(() => {
    for (const w of workers.splice(0)) w.crash();
  });

  it('a new worker picks the containers up and the objective completes without duplicate merges', async () => {
    const env = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: `podman-restart-${randomUUID().slice(0, 8)}` };
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const id = `podman-kill-${randomUUID().slice(0, 6)}`;
    const file = podmanObjective(repo, {
      agents: {
        builder: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/slow-builder.mjs"' },
        reviewer: { provider: 'script', command: 'node "$SLIPWAY_OBJECTIVE_DIR/agents/reviewer.mjs"' },
      },
    });
    // A slower builder, so the kill lands while builders run inside the containers. The worker's
    // death does not end a command inside a container at once (the next worker's first exec
    // there does): a builder that finished meanwhile left its commit, and the retried run, finding
    // nothing to do, succeeds, as an idempotent agent does.
    const agents = path.join(path.dirname(file), 'agents');
    writeFileSync(
      path.join(agents, 'slow-builder.mjs'),
      [
        "import { execFileSync, spawnSync } from 'node:child_process';",
        "import { readFileSync } from 'node:fs';",
        'await new Promise((r) => setTimeout(r, 1500));',
        "const run = spawnSync(process.execPath, [new URL('./builder.mjs', import.meta.url).pathname], { input: readFileSync(0), stdio: ['pipe', 'inherit', 'inherit'] });",
        "const clean = execFileSync('git', ['status', '--porcelain'], { encoding: 'utf8' }).trim() === '';",
        "const last = execFileSync('git', ['log', '-1', '--format=%s'], { encoding: 'utf8' });",
        'process.exit(run.status === 0 || (clean && last.startsWith(`${process.env.SLIPWAY_STREAM}:`)) ? 0 : 1);',
        '',
      ].join('\n'),
    );
    const input = await loadObjectiveFile(file, { id });
    const c = new Client({ connection: await Connection.connect({ address: inject('temporalAddress') }) });
    workers.push(await startWorkerProcess(env));
    const handle = await c.workflow.start(objectiveWorkflow, { taskQueue: env.SLIPWAY_TASK_QUEUE, workflowId: objectiveWorkflowId(id), args: [input] });
    await waitFor(async () => {
      const s = await handle.query(objectiveStatusQuery);
      return s.streams.some((x) => x.phase === 'building') ? s : undefined;
    }, 'a builder to be running', 120_000);
    const before_kill = containersOf(id);
    expect(before_kill.length).toBeGreaterThan(0);
    workers.at(-1)!.crash();
    workers.push(await startWorkerProcess(env));

    const result = (await handle.result()) as ObjectiveResult;
    expect(result.outcome).toBe('completed');
    expect([...result.mergeOrder].sort()).toEqual(['clamp', 'greet', 'sum']);
    const merges = gitIn(repo, 'log', '--first-parent', '--merges', '--format=%s', integrationBranch(id)).split('\n');
    expect(merges).toHaveLength(3);
    expect(new Set(merges.map((m) => m.match(/merge stream (\S+)/)![1]))).toEqual(new Set(['clamp', 'greet', 'sum']));
    expect(containersOf(id)).toEqual([]);
    expect(pictureCheckout(repo)).toEqual(before);
  }, 300_000);
});
