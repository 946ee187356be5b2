/**
 * The worker's process spawner (ADR 0036), with real processes: each case runs through the
 * spawner and, where the outcome must match, directly through execFile, and compares.
 */
import { execFile, spawn, type ExecFileException } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnFile, spawnerPid, startSpawner, type SpawnOptions } from '../lib/spawner';
import { GitError, gitAnswer, rawGit } from '../lib/git';
import { alive, waitUntil } from './helpers/processes';

interface Outcome { error: ExecFileException | null; stdout: string; stderr: string }

function viaSpawner(file: string, args: string[], options: SpawnOptions): Promise<Outcome> {
  return new Promise((resolve) => spawnFile(file, args, options, (error, stdout, stderr) => resolve({ error, stdout, stderr })));
}

function direct(file: string, args: string[], options: SpawnOptions): Promise<Outcome> {
  return new Promise((resolve) => {
    const c = execFile(file, args, { env: options.env, cwd: options.cwd, maxBuffer: options.maxBuffer, timeout: options.timeout, killSignal: options.killSignal, ...(options.signal ? { signal: options.signal } : {}) }, (error, stdout, stderr) => resolve({ error, stdout: String(stdout), stderr: String(stderr) }));
    if (options.input !== undefined) c.stdin?.end(options.input);
  });
}

const env = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
const base: SpawnOptions = { env, maxBuffer: 1024 * 1024 };

describe('process spawner', () => {
  let release: () => void;
  beforeAll(() => {
    release = startSpawner();
  });
  afterAll(() => release());

  it('runs through a separate process and returns stdout, stderr and exit codes as execFile does', async () => {
    expect(spawnerPid()).toBeGreaterThan(0);
    const ok = await viaSpawner('sh', ['-c', 'echo out; echo err >&2'], base);
    expect(ok).toEqual({ error: null, stdout: 'out\n', stderr: 'err\n' });
    const args = ['-c', 'echo partial; echo broken >&2; exit 3'];
    const [a, b] = await Promise.all([viaSpawner('sh', args, base), direct('sh', args, base)]);
    expect(a.error?.code).toBe(3);
    expect(a.error?.code).toBe(b.error?.code);
    expect(a.error?.message).toBe(b.error?.message);
    expect([a.stdout, a.stderr]).toEqual([b.stdout, b.stderr]);
  });

  it('passes cwd and stdin input', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
    const r = await viaSpawner('sh', ['-c', 'pwd; cat'], { ...base, cwd: dir, input: 'from stdin' });
    expect(r.stdout).toBe(`${dir}\nfrom stdin`);
  });

  it('gives the process only the environment the caller passes, none of the worker\'s', async () => {
    process.env.SLIPWAY_SPAWNER_TEST_SECRET = 'tenant-secret';
    try {
      const r = await viaSpawner('/usr/bin/env', [], { ...base, env: { ONLY: 'this' } });
      expect(r.stdout.trim().split('\n').sort()).toEqual(['ONLY=this']);
    } finally {
      delete process.env.SLIPWAY_SPAWNER_TEST_SECRET;
    }
  });

  it('refuses output over maxBuffer as execFile does, and kills the process', async () => {
    const args = ['-c', 'head -c 300000 /dev/zero; sleep 30'];
    const [a, b] = await Promise.all([viaSpawner('sh', args, { ...base, maxBuffer: 100_000 }), direct('sh', args, { ...base, maxBuffer: 100_000 })]);
    expect(a.error?.code).toBe('ERR_CHILD_PROCESS_STDIO_MAXBUFFER');
    expect(a.error?.code).toBe(b.error?.code);
    expect(a.error?.message).toBe(b.error?.message);
    expect(a.stdout.length).toBe(100_000);
  });

  it('kills a process group on timeout', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
    const pidFile = path.join(dir, 'grandchild');
    // The grandchild writes its pid, then sleeps: killing only `sh` would leave it running.
    const r = await viaSpawner('sh', ['-c', `sleep 300 & echo $! > ${pidFile}; wait`], { ...base, timeout: 1_000, killSignal: 'SIGKILL' });
    expect(r.error?.killed).toBe(true);
    expect(r.error?.signal).toBe('SIGKILL');
    expect(r.error?.code).toBe(null);
    const grandchild = Number(readFileSync(pidFile, 'utf8'));
    await waitUntil(() => !alive(grandchild), 'the timed-out group to die');
  });

  it('abort kills the process group and fails with an AbortError', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
    const pidFile = path.join(dir, 'grandchild');
    const controller = new AbortController();
    const run = viaSpawner('sh', ['-c', `sleep 300 & echo $! > ${pidFile}; wait`], { ...base, killSignal: 'SIGKILL', signal: controller.signal });
    await waitUntil(() => existsSync(pidFile) && readFileSync(pidFile, 'utf8').trim() !== '', 'the grandchild to start');
    controller.abort();
    const r = await run;
    expect(r.error?.name).toBe('AbortError');
    expect(r.error?.code).toBe('ABORT_ERR');
    const grandchild = Number(readFileSync(pidFile, 'utf8'));
    await waitUntil(() => !alive(grandchild), 'the aborted group to die');
  });

  it('a missing program fails with ENOENT as execFile does', async () => {
    const [a, b] = await Promise.all([viaSpawner('no-such-program-slipway', [], base), direct('no-such-program-slipway', [], base)]);
    expect(a.error?.code).toBe('ENOENT');
    expect(a.error?.code).toBe(b.error?.code);
  });

  it('git errors keep their shape through the spawner', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
    const e = await rawGit(dir, ['rev-parse', '--verify', 'HEAD']).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(GitError);
    expect((e as GitError).exitCode).toBe(128);
    expect((e as GitError).stderr).toMatch(/not a git repository/);
  });

  it('a killed spawner fails its call in flight and the next call starts a new one', async () => {
    const first = spawnerPid()!;
    const inFlight = viaSpawner('sleep', ['300'], base);
    await waitUntil(() => spawnerPid() === first, 'the spawner');
    process.kill(first, 'SIGKILL');
    const r = await inFlight;
    expect(r.error).not.toBe(null);
    await waitUntil(() => spawnerPid() === undefined, 'the dead spawner to be noticed');
    const next = await viaSpawner('sh', ['-c', 'echo again'], base);
    expect(next).toEqual({ error: null, stdout: 'again\n', stderr: '' });
    expect(spawnerPid()).toBeGreaterThan(0);
    expect(spawnerPid()).not.toBe(first);
  });

  it('the spawner ignores the group\'s stop signals, and exits when its worker is killed with SIGKILL, killing what it ran', async () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'spawner-'));
    const worker = spawn(process.execPath, ['--import', 'tsx', '-e', `
      const { startSpawner, spawnerPid } = require(${JSON.stringify(path.resolve(__dirname, '../lib/spawner.ts'))});
      const { spawnFile } = require(${JSON.stringify(path.resolve(__dirname, '../lib/spawner.ts'))});
      startSpawner();
      console.log('spawner ' + spawnerPid());
      spawnFile('sh', ['-c', 'echo $$ > ' + ${JSON.stringify(path.join(dir, 'held.pid'))} + '; exec sleep 300'], { env: { PATH: process.env.PATH }, maxBuffer: 1024 }, () => {});
      setInterval(() => {}, 1000);
    `], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    worker.stdout!.on('data', (c) => (out += c));
    try {
      await waitUntil(() => /spawner \d+/.test(out), 'the worker to start its spawner', 60_000);
      const pid = Number(/spawner (\d+)/.exec(out)![1]);
      expect(alive(pid)).toBe(true);
      const heldFile = path.join(dir, 'held.pid');
      await waitUntil(() => existsSync(heldFile) && readFileSync(heldFile, 'utf8').trim() !== '', 'the process the spawner runs', 60_000);
      const held = Number(readFileSync(heldFile, 'utf8').trim());
      // A terminal's Ctrl-C or a stop signalling the group is the worker's to handle: the spawner
      // catches SIGHUP, SIGINT and SIGTERM (its caught-signal mask), so they do not end it.
      const caught = BigInt(`0x${/SigCgt:\s*([0-9a-f]+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))![1]}`);
      for (const signal of [1, 2, 15]) expect((caught >> BigInt(signal - 1)) & 1n).toBe(1n);
      process.kill(pid, 'SIGTERM');
      expect(alive(held)).toBe(true);
      worker.kill('SIGKILL');
      await waitUntil(() => !alive(pid), 'the orphaned spawner to exit');
      // ...and takes what it ran (in its own process group) with it.
      await waitUntil(() => !alive(held), 'the process the spawner ran to be killed');
    } finally {
      worker.kill('SIGKILL');
    }
  });

  it('runs directly once the last holder releases it, and stops the spawner', async () => {
    const second = startSpawner();
    const pid = spawnerPid()!;
    second();
    expect(spawnerPid()).toBe(pid);
    release();
    expect(spawnerPid()).toBe(undefined);
    await waitUntil(() => !alive(pid), 'the released spawner to exit');
    expect(await viaSpawner('sh', ['-c', 'echo direct'], base)).toEqual({ error: null, stdout: 'direct\n', stderr: '' });
    // Input a process never reads (it exits first): its exit code, not an uncaught EPIPE.
    for (let i = 0; i < 5; i++) expect((await viaSpawner('sh', ['-c', 'exit 4'], { ...base, input: 'x'.repeat(4 * 1024 * 1024) })).error?.code).toBe(4);
    expect(spawnerPid()).toBe(undefined);
    release = startSpawner();
  });
});

describe('gitAnswer', () => {
  it('reads exit 0 as yes and 1 as no, and rethrows anything else (a killed or broken git is never a "no")', async () => {
    const repo = mkdtempSync(path.join(os.tmpdir(), 'answer-'));
    await rawGit(repo, ['init', '-q']);
    await rawGit(repo, ['-c', 'user.name=a', '-c', 'user.email=a@a', 'commit', '-q', '--allow-empty', '-m', 'one']);
    const one = (await rawGit(repo, ['rev-parse', 'HEAD'])).trim();
    await rawGit(repo, ['-c', 'user.name=a', '-c', 'user.email=a@a', 'commit', '-q', '--allow-empty', '-m', 'two']);
    const two = (await rawGit(repo, ['rev-parse', 'HEAD'])).trim();
    expect(await gitAnswer(rawGit(repo, ['merge-base', '--is-ancestor', one, two]))).toBe(true);
    expect(await gitAnswer(rawGit(repo, ['merge-base', '--is-ancestor', two, one]))).toBe(false);
    await expect(gitAnswer(rawGit(repo, ['merge-base', '--is-ancestor', one, 'no-such-ref']))).rejects.toMatchObject({ exitCode: 128 });
    await expect(gitAnswer(Promise.reject(new GitError(['merge-base'], null, 'killed')))).rejects.toBeInstanceOf(GitError);
  });
});
