/**
 * Objectives end to end with container sandboxes (`sandbox: { provider: podman }`, ADR 0012):
 * every stream builds, runs its gates and is reviewed in a podman container started from a git
 * bundle, its work comes back as a bundle, and the merge queue merges it as for local sandboxes.
 * Then a worker killed with SIGKILL mid-run: a new worker finds the containers again and the
 * objective ends as an undisturbed run does. Real Temporal, real git, real podman.
 */
import { execFileSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { Client, Connection } from '@temporalio/client';
import { engineEnv } from '../activities/sandbox/container';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { objectiveStatusQuery, objectiveWorkflow } from '../workflows/objective';
import { waitFor } from './helpers/cli';
import { gitIn, makeDemoRepo, pictureCheckout } from './helpers/repo';
import { startWorkerProcess, type WorkerProcess } from './helpers/worker-process';
import { demoObjectiveFile, describeProviderObjective } from './sandbox/provider-suites';

const containersOf = (objectiveId: string) =>
  execFileSync('podman', ['ps', '-a', '--filter', `label=slipway.group=${objectiveId}`, '--format', '{{.Names}}'], { env: engineEnv(), encoding: 'utf8' }).split('\n').filter(Boolean);

const SANDBOX = { provider: 'podman', network: false, limits: { memory_mb: 512, processes: 256 } };

describeProviderObjective('podman', { sandbox: SANDBOX, sandboxesOf: containersOf, noun: 'containers' });

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
    const file = demoObjectiveFile(repo, 'podman', SANDBOX, {
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
