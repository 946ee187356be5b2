/**
 * The `slipway` CLI end to end, as a user runs it: a real process, the embedded server or the
 * shared test server, real repositories.
 */
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { holdPort, testPort } from './helpers/ports';
import { DEMO_DIR, gitIn, makeDemoRepo, pictureCheckout, tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';
import { slipway } from './helpers/cli';
import { startWorkerProcess } from './helpers/worker-process';

let worker: TestWorker;
let serverEnv: NodeJS.ProcessEnv;
beforeAll(async () => {
  worker = await startTestWorker();
  serverEnv = { TEMPORAL_ADDRESS: inject('temporalAddress'), SLIPWAY_TASK_QUEUE: worker.taskQueue };
});
afterAll(async () => {
  await worker?.stop();
});

describe('slipway run on the embedded server', () => {
  it('starts the embedded Temporal itself, runs the demo objective and prints a JSON result', async () => {
    const repo = makeDemoRepo();
    const before = pictureCheckout(repo);
    const home = tempDir('slipway-home-');
    const env = { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await testPort()), SLIPWAY_UI_PORT: String(await testPort()) };

    const run = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', repo, '--id', 'cli-demo', '--json'], env);

    expect(run.stderr).toContain('started the embedded Temporal server');
    expect(run.code).toBe(0);
    const result = JSON.parse(run.stdout.trim());
    expect(result).toMatchObject({ objectiveId: 'cli-demo', outcome: 'completed', integrationBranch: 'slipway/cli-demo/integration' });
    expect([...result.mergeOrder].sort()).toEqual(['clamp', 'greet', 'sum']);
    expect(result.integrationHead).toBe(gitIn(repo, 'rev-parse', 'slipway/cli-demo/integration'));
    expect(existsSync(path.join(home, 'temporal.sqlite'))).toBe(true); // durable state in the Slipway data folder
    expect(pictureCheckout(repo)).toEqual(before);
  });

  it('says which port is taken and which setting moves it when the Web UI port is in use, and starts nothing', async () => {
    const { port: uiPort, close } = await holdPort();
    try {
      const repo = makeDemoRepo();
      const home = tempDir('slipway-home-');
      const run = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', repo, '--id', 'cli-ui-taken', '--json'], { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await testPort()), SLIPWAY_UI_PORT: String(uiPort) });
      expect(run.code).toBe(1);
      expect(run.stderr).toContain(`can't set UI port ${uiPort}`);
      expect(run.stderr).toContain('(set SLIPWAY_UI_PORT to use another port)');
      expect(run.stderr).toContain(`Server log: ${path.join(home, 'temporal-server.log')}`);
      expect(run.stdout).toBe('');
      expect(gitIn(repo, 'branch', '--list', 'slipway/cli-ui-taken/*')).toBe('');
    } finally {
      await close();
    }
  });
});

describe('slipway against a running server', () => {
  it('runs, then reports the objective in status and list', async () => {
    const repo = makeDemoRepo();
    const run = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', repo, '--id', 'cli-status', '--follow', '--json'], serverEnv);
    expect(run.code).toBe(0);
    expect(JSON.parse(run.stdout).outcome).toBe('completed');

    const status = await slipway(['status', 'cli-status', '--json'], serverEnv);
    expect(status.code).toBe(0);
    expect(JSON.parse(status.stdout)).toMatchObject({ objectiveId: 'cli-status', workflowStatus: 'COMPLETED', outcome: 'completed' });

    const text = await slipway(['status', 'cli-status'], serverEnv);
    expect(text.stdout).toMatch(/objective cli-status: completed/);
    expect(text.stdout).toMatch(/clamp\s+merged\s+iterations=2/);

    // Visibility is eventually consistent: retry list briefly.
    let rows: Array<{ objectiveId: string; outcome?: string }> = [];
    for (let i = 0; i < 20 && !rows.some((r) => r.objectiveId === 'cli-status' && r.outcome); i++) {
      rows = JSON.parse((await slipway(['list', '--json'], serverEnv)).stdout);
      if (!rows.some((r) => r.objectiveId === 'cli-status' && r.outcome)) await new Promise((r) => setTimeout(r, 500));
    }
    expect(rows.find((r) => r.objectiveId === 'cli-status')).toMatchObject({ outcome: 'completed' });
  });

  it('watch follows a run to its end, with recovery lines, filtered by stream', async () => {
    const repo = makeDemoRepo();
    const run = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', repo, '--id', 'cli-watch'], serverEnv);
    expect(run.code).toBe(0);
    const [all, clampOnly] = await Promise.all([
      slipway(['watch', '--objective', 'cli-watch'], serverEnv),
      slipway(['watch', '--objective', 'cli-watch', '--agent', 'builder-clamp'], serverEnv),
    ]);
    expect(all.code).toBe(0);
    expect(all.stdout).toMatch(/^\d\d:\d\d:\d\d \[clamp\] quality_gate_failure -> rerun builder \(1\/2\)$/m);
    expect(all.stdout).toMatch(/\[merge-queue\] merged greet/);
    expect(all.stdout.trim().split('\n').at(-1)).toBe('objective cli-watch: completed');
    expect(clampOnly.stdout).toContain('[clamp]');
    expect(clampOnly.stdout).not.toMatch(/\[(greet|sum|objective)\]/);
  });

  it('refuses a second objective with the same id (exit 2)', async () => {
    const repo = makeDemoRepo();
    const first = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', repo, '--id', 'cli-dup', '--follow', '--json'], serverEnv);
    expect(first.code).toBe(0);
    // In the same repository the id is claimed (ADR 0008)...
    const second = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', repo, '--id', 'cli-dup'], serverEnv);
    expect(second.code).toBe(2);
    expect(second.stderr).toMatch(/objective id "cli-dup" was used before .*refs\/slipway-objectives\/cli-dup/);
    // ...and in another one, Temporal refuses the workflow id.
    const elsewhere = await slipway(['run', path.join(DEMO_DIR, 'objective.yaml'), '--repo', makeDemoRepo(), '--id', 'cli-dup'], serverEnv);
    expect(elsewhere.code).toBe(2);
    expect(elsewhere.stderr).toMatch(/objective "cli-dup" already exists/);
  });

  it('worker shuts down gracefully on SIGTERM and SIGINT', async () => {
    for (const signal of ['SIGTERM', 'SIGINT'] as const) {
      const w = await startWorkerProcess(serverEnv);
      const exited = new Promise<number | null>((resolve) => w.child.once('exit', (code) => resolve(code)));
      w.child.kill(signal);
      expect(await exited).toBe(0);
      expect(w.output()).toContain(`${signal}: shutting down the worker`);
    }
  });

  it('says so for an unknown objective (exit 2)', async () => {
    const status = await slipway(['status', 'no-such-objective'], serverEnv);
    expect(status.code).toBe(2);
    expect(status.stderr).toContain('no objective "no-such-objective"');
  });
});

describe('bad input', () => {
  const repo = makeDemoRepo();
  const good = {
    objective: 'x',
    repository: repo,
    agents: { builder: { provider: 'script', command: 'true' } },
    streams: [{ id: 'a', task: 'do a' }],
  };
  const cases: Array<{ name: string; yaml: string; expect: RegExp }> = [
    { name: 'missing field', yaml: `repository: ${repo}\nagents:\n  builder: { provider: script, command: "true" }\nstreams:\n  - { id: a, task: t }\n`, expect: /objective\.yaml:1:1: objective: .*required/ },
    { name: 'wrong type', yaml: `${toYaml(good)}max_parallel_streams: three\n`, expect: /objective\.yaml:\d+:\d+: max_parallel_streams: expected a number/ },
    {
      name: 'unknown stream dependency',
      yaml: toYaml({ ...good, streams: [{ id: 'a', task: 'do a', depends_on: ['ghost'] }] }),
      expect: /objective\.yaml:\d+:\d+: streams\[0\]\.depends_on\[0\]: unknown stream "ghost"/,
    },
    { name: 'repository that does not exist', yaml: toYaml({ ...good, repository: '/nonexistent/repo' }), expect: /objective\.yaml:2:\d+: repository: .*does not exist/ },
    { name: 'repository URL with credentials', yaml: toYaml({ ...good, repository: 'https://me:t0ken-secret@example.com/r.git' }), expect: /objective\.yaml:2:\d+: repository: https:\/\/example\.com\/r\.git embeds credentials; .*credential helper/ },
    // A remote is checked, not contacted, here: the worker that prepares the objective clones it (ADR 0028).
    { name: 'repository URL of an unsupported scheme', yaml: toYaml({ ...good, repository: 'ftp://example.com/r.git' }), expect: /objective\.yaml:2:\d+: repository: unsupported URL scheme "ftp:\/\/"/ },
  ];

  for (const c of cases) {
    it(`rejects a ${c.name} with exit 2 and starts nothing`, async () => {
      const dir = tempDir('slipway-bad-');
      const file = path.join(dir, 'objective.yaml');
      writeFileSync(file, c.yaml);
      const home = tempDir('slipway-home-');
      const id = `bad-${c.name.replace(/\W+/g, '-')}`;
      // Embedded mode: a bad file must fail before any server is started.
      const embedded = await slipway(['run', file, '--id', id], { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await testPort()) });
      expect(embedded.code).toBe(2);
      expect(embedded.stderr).toMatch(c.expect);
      expect(embedded.stderr).not.toContain('t0ken-secret');
      expect(existsSync(path.join(home, 'temporal.sqlite'))).toBe(false);
      // Against a live server: no workflow was started.
      const remote = await slipway(['run', file, '--id', id], serverEnv);
      expect(remote.code).toBe(2);
      await expect(worker.client.workflow.getHandle(`objective:${id}`).describe()).rejects.toThrow(/not found/i);
    });
  }

  it('prints help for every command and exits 2 on an unknown one', async () => {
    for (const args of [['--help'], ['run', '--help'], ['status', '--help'], ['list', '--help'], ['dev', '--help'], ['worker', '--help']]) {
      const help = await slipway(args);
      expect(help.code).toBe(0);
      expect(help.stdout).toMatch(/Usage: slipway/);
    }
    const unknown = await slipway(['frobnicate']);
    expect(unknown.code).toBe(2);
  });
});

function toYaml(value: Record<string, unknown>): string {
  return stringify(value);
}
