/**
 * The package as users get it (ADR 0016): `npm pack`, `npm i -g <tarball> --prefix <tmp>`, then
 * the installed `slipway` from a fresh repository elsewhere, with HOME and the working folder
 * outside this checkout: `--help`, `dev` (embedded Temporal, the CLI found through
 * TEMPORAL_CLI_PATH, the documented way), `run` of a one-stream script objective to completion,
 * and `status`, and `slipway api`. No file of the source tree is reachable from the installed package.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isPortOpen } from '../workers/dev-server';
import { testPort } from './helpers/ports';
import { findTemporalBinary } from '../workers/temporal-binary';
import { ensureBuilt } from './helpers/build';
import { waitFor } from './helpers/cli';
import { gitIn, PROJECT_ROOT, tempDir } from './helpers/repo';

const run = promisify(execFile);

describe('the npm package', () => {
  const work = realpathSync(tempDir('slipway-package-'));
  const prefix = path.join(work, 'prefix');
  const home = path.join(work, 'home');
  const repo = path.join(work, 'repo');
  const objectiveDir = path.join(work, 'objective');
  let files: string[] = [];
  let tarball = '';
  let installSeconds = 0;
  let env: NodeJS.ProcessEnv = {};
  let dev: ChildProcess | undefined;
  let devLog = '';
  const slipway = (args: string[], cwd = repo) =>
    run(path.join(prefix, 'bin', 'slipway'), args, { cwd, env, timeout: 600_000 }).then(
      (r) => ({ code: 0, ...r }),
      (e: { code?: number; stdout?: string; stderr?: string }) => ({ code: e.code ?? -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' }),
    );

  beforeAll(async () => {
    // Packed under the build lock, from the build just made (--ignore-scripts: no second build).
    const packed = (await ensureBuilt(() => run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], { cwd: PROJECT_ROOT })))!;
    const info = JSON.parse(packed.stdout) as Array<{ filename: string; files: Array<{ path: string }> }>;
    files = info[0].files.map((f) => f.path);
    tarball = path.join(work, info[0].filename);
    const t0 = Date.now();
    // From the local npm cache where it can (the dependencies this checkout installed).
    await run('npm', ['install', '--global', tarball, '--prefix', prefix, '--prefer-offline', '--no-audit', '--no-fund', '--loglevel=error'], { cwd: work, timeout: 600_000 });
    installSeconds = (Date.now() - t0) / 1000;
    mkdirSync(home);
    mkdirSync(repo);
    gitIn(repo, 'init', '-q', '-b', 'main');
    writeFileSync(path.join(repo, 'README.md'), '# a project\n');
    gitIn(repo, 'add', '-A');
    gitIn(repo, '-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'init');
    const base = { ...process.env };
    for (const k of ['TEMPORAL_ADDRESS', 'SLIPWAY_HOME', 'XDG_DATA_HOME', 'XDG_CACHE_HOME', 'NODE_PATH', 'NODE_OPTIONS']) delete base[k];
    env = {
      ...base,
      HOME: home,
      PATH: `${path.join(prefix, 'bin')}:${path.dirname(process.execPath)}:/usr/local/bin:/usr/bin:/bin`,
      TEMPORAL_CLI_PATH: findTemporalBinary(),
      SLIPWAY_TEMPORAL_PORT: String(await testPort()),
      SLIPWAY_UI_PORT: String(await testPort()),
      GIT_AUTHOR_NAME: 't',
      GIT_AUTHOR_EMAIL: 't@t',
      GIT_COMMITTER_NAME: 't',
      GIT_COMMITTER_EMAIL: 't@t',
    };
  }, 900_000);

  afterAll(async () => {
    if (dev && dev.exitCode === null) {
      const exited = new Promise((r) => dev!.once('exit', r));
      dev.kill('SIGTERM');
      await exited;
    }
    rmSync(work, { recursive: true, force: true }); // the npm prefix with the installed tarball: about 530 MB
  });

  it('holds the compiled code and its declarations, and no tests, fixtures, sources or local state', () => {
    for (const f of ['bin/slipway.cjs', 'dist/cli/main.js', 'dist/index.js', 'dist/index.d.ts', 'dist/workflow-bundle.js', 'dist/blueprints/standard.yaml', 'package.json']) expect(files).toContain(f);
    const unwanted = files.filter((f) => /^(test|bench|examples|scripts|\.tools|\.slipway|node_modules|docs)\//.test(f) || (f.endsWith('.ts') && !f.endsWith('.d.ts')) || f.includes('tsbuildinfo') || /fixtures/.test(f));
    expect(unwanted).toEqual([]);
    // What package.json promises is in the tarball: entry, types, exports and bin point at packed files; public; engines set.
    const pkg = JSON.parse(readFileSync(path.join(PROJECT_ROOT, 'package.json'), 'utf8')) as { private?: boolean; engines?: { node?: string }; main: string; types: string; exports: Record<string, string | Record<string, string>>; bin: Record<string, string> };
    expect(pkg.private).toBeUndefined();
    expect(pkg.engines?.node).toBe('^20.19.0 || >=22.12.0');
    const targets = [pkg.main, pkg.types, ...Object.values(pkg.exports).flatMap((e) => (typeof e === 'string' ? [e] : Object.values(e))), ...Object.values(pkg.bin)];
    for (const target of targets) expect(files, target).toContain(path.posix.normalize(target));
    console.log(`package: ${files.length} files; npm i -g from the tarball took ${installSeconds.toFixed(1)} s`);
  });

  it('runs from a fresh repository: --help, dev, run to completion, status', async () => {
    const help = await slipway(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: slipway');

    dev = spawn(path.join(prefix, 'bin', 'slipway'), ['dev'], { cwd: repo, env, stdio: ['ignore', 'pipe', 'pipe'] });
    dev.stderr!.on('data', (c) => (devLog += c));
    dev.stdout!.on('data', (c) => (devLog += c));
    const exited = new Promise<never>((_, reject) => dev!.once('exit', (code) => reject(new Error(`slipway dev exited (${code}) before polling:\n${devLog}`))));
    exited.catch(() => undefined); // it exits at the end too, by our SIGTERM
    await Promise.race([waitFor(async () => devLog.includes('worker polling'), 'slipway dev to poll', 300_000), exited]);
    expect(await isPortOpen(Number(env.SLIPWAY_TEMPORAL_PORT))).toBe(true);

    // One stream with script agents that live beside the objective file, not in this checkout.
    mkdirSync(path.join(objectiveDir, 'agents'), { recursive: true });
    writeFileSync(
      path.join(objectiveDir, 'agents', 'builder.mjs'),
      `import { execFileSync } from 'node:child_process';\nimport { readFileSync, writeFileSync } from 'node:fs';\nreadFileSync(0, 'utf8');\nwriteFileSync('hello.txt', 'hello from the installed package\\n');\nexecFileSync('git', ['add', '-A']);\nexecFileSync('git', ['commit', '-q', '-m', 'add hello.txt']);\n`,
    );
    writeFileSync(
      path.join(objectiveDir, 'agents', 'reviewer.mjs'),
      `import { readFileSync } from 'node:fs';\nreadFileSync(0, 'utf8');\nconsole.log('<review>' + JSON.stringify({ verdict: 'approve', summary: 'hello.txt is there' }) + '</review>');\n`,
    );
    writeFileSync(
      path.join(objectiveDir, 'objective.yaml'),
      [
        'objective: Add hello.txt',
        'base_branch: main',
        'gates:',
        '  - name: hello',
        '    command: test -f hello.txt',
        'agents:',
        '  builder:',
        '    provider: script',
        '    command: node "$SLIPWAY_OBJECTIVE_DIR/agents/builder.mjs"',
        '  reviewer:',
        '    provider: script',
        '    command: node "$SLIPWAY_OBJECTIVE_DIR/agents/reviewer.mjs"',
        'streams:',
        '  - id: hello',
        '    task: Add hello.txt',
        '',
      ].join('\n'),
    );
    const started = await slipway(['run', path.join(objectiveDir, 'objective.yaml'), '--repo', repo, '--id', 'pkg-hello', '--follow']);
    expect(started.code, `${started.stdout}\n${started.stderr}\n${devLog}`).toBe(0);

    const status = await slipway(['status', 'pkg-hello', '--json']);
    expect(status.code, status.stderr).toBe(0);
    const doc = JSON.parse(status.stdout) as { workflowStatus: string; outcome?: string };
    expect(doc.workflowStatus).toBe('COMPLETED');
    expect(doc.outcome).toBe('completed');
    // The work reached the integration branch of the user's repository.
    expect(gitIn(repo, 'show', 'slipway/pkg-hello/integration:hello.txt')).toContain('installed package');
  }, 900_000);

  it('serves the sandbox API from the installed package: starts beside dev, answers /healthz and a token\'s request, refuses a request without one, stops on SIGTERM', async () => {
    // Against the server `slipway dev` runs (the test above); the billing database is its own PGlite under HOME.
    const port = await testPort();
    let log = '';
    const api = spawn(path.join(prefix, 'bin', 'slipway'), ['api', '--port', String(port)], { cwd: repo, env: { ...env, SLIPWAY_WORKER_ID: 'pkg-api' }, stdio: ['ignore', 'pipe', 'pipe'] });
    api.stderr!.on('data', (c) => (log += c));
    api.stdout!.on('data', (c) => (log += c));
    const exit = new Promise<number | null>((resolve) => api.once('exit', (code) => resolve(code)));
    try {
      const up = await Promise.race([waitFor(async () => log.includes('sandbox API on'), 'slipway api to listen', 300_000), exit.then((code) => Promise.reject(new Error(`slipway api exited (${code}):\n${log}`)))]);
      expect(up).toBe(true);
      const base = `http://127.0.0.1:${port}`;
      expect(await (await fetch(`${base}/healthz`)).json()).toEqual({ ok: true });
      // A token made with the installed CLI, through the running service's billing database.
      const account = await slipway(['account', 'create', 'pkg']);
      expect(account.code, account.stderr).toBe(0);
      const token = await slipway(['token', 'create', '--account', 'pkg']);
      expect(token.code, token.stderr).toBe(0);
      const listed = await fetch(`${base}/api/v1/sandboxes`, { headers: { authorization: `Bearer ${token.stdout.trim()}` } });
      expect(listed.status).toBe(200);
      expect(await listed.json()).toEqual({ sandboxes: [] });
      expect((await fetch(`${base}/api/v1/sandboxes`)).status).toBe(401);
    } finally {
      if (api.exitCode === null) api.kill('SIGTERM');
    }
    expect(await exit, log).toBe(0);
  }, 900_000);
});
