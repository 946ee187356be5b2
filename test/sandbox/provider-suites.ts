/**
 * The scaffolding every sandbox provider's integration tests share, beside the contract suite
 * (contract.ts): an objective end to end on the provider (`describeProviderObjective`), and a
 * service sandbox's lifecycle on it (`describeProviderLifecycle`). A provider's test file says
 * only what differs: its `sandbox:` section, how to see its sandboxes from outside, its set-up.
 */
import { randomUUID } from 'node:crypto';
import { cpSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import type { ProviderFor } from '../../activities/service/providers';
import { loadObjectiveFile } from '../../config/objective-file';
import { integrationBranch, objectiveWorkflowId } from '../../core/ids';
import type { ObjectiveResult } from '../../core/types';
import { objectiveWorkflow } from '../../workflows/objective';
import { waitFor } from '../helpers/cli';
import { DEMO_DIR, gitIn, makeDemoRepo, pictureCheckout, tempDir } from '../helpers/repo';
import { startTestWorker, type TestWorker } from '../helpers/temporal';
import { startServiceHarness, type ServiceHarness } from '../service/harness';

/** The demo objective (three helpers, one fixed after a gate failure) in a folder of its own, with this `sandbox:` section. */
export function demoObjectiveFile(repo: string, label: string, sandbox: Record<string, unknown>, extra: Record<string, unknown> = {}): string {
  const dir = tempDir(`slipway-${label}-objective-`);
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
      sandbox,
      ...extra,
    }),
  );
  return file;
}

export interface ProviderObjectiveOptions {
  /** The objective file's `sandbox:` section. */
  sandbox: Record<string, unknown>;
  /** The provider's sandboxes of an objective, seen from outside Slipway (containers, remote sandboxes). */
  sandboxesOf: (objectiveId: string) => string[];
  /** What "a sandbox" is called in the test's name ("containers", "Daytona sandboxes"). */
  noun: string;
  /** Before the worker starts (a fake to start); its environment is set for the worker and restored after. */
  before?: () => Promise<Record<string, string> | void>;
  after?: () => Promise<void>;
  /** A secret (an API key) that must be in neither the workflow input nor its history. */
  secret?: () => string;
}

/**
 * An objective end to end on a provider: every stream builds, runs its gates and is reviewed in
 * the provider's sandboxes, a gate failure is fixed, all three merge, the sandboxes are gone and
 * the user's checkout is untouched. Real Temporal, real git.
 */
export function describeProviderObjective(name: string, opts: ProviderObjectiveOptions): void {
  describe(`objectives on ${name}`, () => {
    let worker: TestWorker;
    const saved: Record<string, string | undefined> = {};
    beforeAll(async () => {
      const env = (await opts.before?.()) ?? {};
      for (const [k, v] of Object.entries(env)) {
        saved[k] = process.env[k];
        process.env[k] = v;
      }
      worker = await startTestWorker();
    });
    afterAll(async () => {
      await worker?.stop();
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      await opts.after?.();
    });

    it(`builds three streams in ${opts.noun}, fixes a gate failure, merges all, removes the ${opts.noun} and leaves the checkout untouched`, async () => {
      const repo = makeDemoRepo();
      const before = pictureCheckout(repo);
      const id = `${name.split(' ')[0]}-${randomUUID().slice(0, 6)}`;
      const input = await loadObjectiveFile(demoObjectiveFile(repo, name.split(' ')[0], opts.sandbox), { id });
      expect(input.sandbox?.provider).toBe(opts.sandbox.provider);
      if (opts.secret) expect(JSON.stringify(input)).not.toContain(opts.secret());
      const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
      // While it runs, its streams live in the provider's sandboxes (labelled with the objective).
      await waitFor(async () => opts.sandboxesOf(id).length > 0, `a stream's sandbox on ${name}`);
      const result = (await handle.result()) as ObjectiveResult;

      expect(result.outcome).toBe('completed');
      expect([...result.mergeOrder].sort()).toEqual(['clamp', 'greet', 'sum']);
      expect(result.streams.find((s) => s.id === 'clamp')!.iterations).toBe(2);
      const branch = integrationBranch(id);
      for (const helper of ['greet', 'sum', 'clamp']) expect(gitIn(repo, 'cat-file', '-t', `${branch}:src/${helper}.js`)).toBe('blob');
      expect(gitIn(repo, 'show', `${branch}:src/clamp.js`)).toContain('Math.min(Math.max(value, low), high)');
      // The streams' work came back by bundle: no stream worktree was ever registered.
      expect(gitIn(repo, 'worktree', 'list', '--porcelain').match(/^worktree /gm)).toHaveLength(1);
      expect(gitIn(repo, 'branch', '--list', `slipway/${id}/*`).split('\n')).toHaveLength(4);
      expect(opts.sandboxesOf(id)).toEqual([]);
      expect(pictureCheckout(repo)).toEqual(before);
      if (opts.secret) expect(JSON.stringify(await handle.fetchHistory())).not.toContain(opts.secret());
      gitIn(repo, 'fsck', '--strict', '--no-dangling');
    }, 300_000);
  });
}

export interface ProviderLifecycleOptions {
  /** The profile's provider. */
  provider: 'local' | 'podman' | 'docker' | 'daytona' | 'kubernetes';
  providerFor: () => ProviderFor;
  before?: () => Promise<void>;
  after?: () => Promise<void>;
  /** The profile's `resources` (limits), where the provider enforces them. */
  resources?: Record<string, number>;
  /** Provider-specific checks once the sandbox is ready (labels, ...). */
  onReady?: (root: string) => Promise<void>;
  /** The provider's own view of a service sandbox (by its root): running, stopped, or gone. */
  state: (root: string) => Promise<'running' | 'stopped' | 'gone'>;
  /** Extra lines the first exec prints after `hello from <id>` and the branch, with the expected output. */
  firstExec?: { script: string; expected: string };
  /** A secret (an API key) no command in the sandbox may see. */
  secret?: () => string;
  /** Host settings for the suite's harness (watchIntervalMs: 0 turns the probe pass off). */
  harness?: Parameters<typeof startServiceHarness>[0];
  /** More tests in the same suite, with the same harness. */
  more?: (harness: () => ServiceHarness, root: (id: string) => Promise<string>) => void;
}

/**
 * A service sandbox's lifecycle on a provider: create -> ready (cold boot) -> exec and files ->
 * idle suspend -> woken by exec with its files -> DELETE, with the billing rows of each step.
 * Real Postgres, real Temporal, real HTTP.
 */
export function describeProviderLifecycle(name: string, opts: ProviderLifecycleOptions): void {
  describe(`service sandboxes on ${name}`, () => {
    let h: ServiceHarness;
    beforeAll(async () => {
      await opts.before?.();
      h = await startServiceHarness({ ...opts.harness, providerFor: opts.providerFor() });
    });
    afterAll(async () => {
      await h?.stop();
      await opts.after?.();
    });
    const sh = (script: string) => ({ command: 'sh', args: ['-c', script] });
    const root = async (id: string) => (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [id])).rows[0]!.root;

    it('create, exec and files, idle suspend and wake by exec, DELETE removes it; billing rows closed', async () => {
      const a = await h.account({ limit: 2 });
      await a.profile({ name: `${opts.provider}-small`, provider: opts.provider, idleTimeoutSeconds: 1.5, ...(opts.resources ? { resources: opts.resources } : {}) });
      const { id } = await a.api.create({ profile: `${opts.provider}-small` });
      expect(await a.api.get(id, 60)).toMatchObject({ status: 'ready', provisioning_kind: 'cold_boot' });
      const dir = await root(id);
      expect(await opts.state(dir)).toBe('running');
      await opts.onReady?.(dir);

      const run = await a.api.exec(id, sh(`echo hello from $SLIPWAY_SANDBOX_ID; git rev-parse --abbrev-ref HEAD${opts.firstExec ? `; ${opts.firstExec.script}` : ''}`));
      expect(run).toMatchObject({ exit_code: 0, timed_out: false });
      expect(run.stdout).toBe(`hello from ${id}\nslipway/sandboxes/${id}\n${opts.firstExec?.expected ?? ''}`);
      if (opts.secret) expect((await a.api.exec(id, sh('env'))).stdout).not.toContain(opts.secret());
      await a.api.exec(id, sh('printf "draft\\n" > notes.txt'));

      // Idle: the sandbox stops, its files stay; compute closes, storage opens.
      await h.waitFor(a.api, id, ['suspended'], 30_000);
      expect(await opts.state(dir)).toBe('stopped');
      expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
        ['compute', 1, 'idle_offload'],
        ['snapshot_storage', 1, null],
      ]);

      // The next call wakes it, with its files in place.
      expect((await a.api.exec(id, sh('cat notes.txt'))).stdout).toBe('draft\n');
      expect(await opts.state(dir)).toBe('running');
      expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
        ['compute', 1, 'idle_offload'],
        ['snapshot_storage', 1, 'restored'],
        ['compute', 2, null],
      ]);

      await a.api.destroy(id);
      const done = await h.waitFor(a.api, id, ['terminated'], 30_000);
      expect(done.end_reason).toBe('explicit_delete');
      expect(await opts.state(dir)).toBe('gone');
      expect((await h.sessions(id)).every((s) => s.end_reason !== null)).toBe(true);
    });

    it("terminates at the deadline: the provider's sandbox is removed and the compute row closed with reason deadline", async () => {
      const a = await h.account();
      await a.profile({ name: `${opts.provider}-short`, provider: opts.provider, ...(opts.resources ? { resources: opts.resources } : {}) });
      // Long enough for the slowest provider's cold create on a busy machine to be ready first.
      const { id } = await a.api.create({ profile: `${opts.provider}-short`, deadline_minutes: 0.5 });
      expect(await a.api.get(id, 60)).toMatchObject({ status: 'ready' });
      const dir = await root(id);
      expect(await opts.state(dir)).toBe('running');
      const done = await h.waitFor(a.api, id, ['terminated'], 120_000);
      expect(done.end_reason).toBe('deadline');
      expect(await opts.state(dir)).toBe('gone');
      expect((await h.sessions(id)).map((s) => [s.kind, s.end_reason])).toEqual([['compute', 'deadline']]);
    });

    opts.more?.(() => h, root);
  });
}
