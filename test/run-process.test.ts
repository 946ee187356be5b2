/**
 * runProcess (activities/process.ts) with real processes, run directly by this process and through
 * the worker's spawner (ADR 0036): a plain run (no lines as they come, no pipes, no hooks) takes
 * the spawner when one runs, and must behave the same either way.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runProcess } from '../activities/process';
import { SpawnerDied, spawnerPid, spawnerRuns, startSpawner } from '../lib/spawner';
import { alive, waitUntil } from './helpers/processes';

const ENV = { PATH: process.env.PATH ?? '/usr/bin:/bin' };

const pidIn = (file: string) => Number(readFileSync(file, 'utf8').trim());

describe.each(['directly', 'through the spawner'] as const)('runProcess %s', (mode) => {
  let release: (() => void) | undefined;
  let dir: string;
  beforeAll(() => {
    if (mode === 'through the spawner') release = startSpawner();
    dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-run-process-'));
  });
  afterAll(() => {
    release?.();
    rmSync(dir, { recursive: true, force: true });
  });

  it('gives exit code, stdout and stderr, runs shell lines and feeds stdin; the process is started by the spawner only in that mode', async () => {
    const run = await runProcess({ command: 'read line; echo "got $line"; echo oops >&2; echo "$PPID"; exit 3', shell: true, cwd: dir, env: ENV, stdin: 'hello\n' });
    const [got, ppid] = run.stdout.trim().split('\n');
    expect({ exitCode: run.exitCode, signal: run.signal, got, stderr: run.stderr, timedOut: run.timedOut, cancelled: run.cancelled }).toEqual({ exitCode: 3, signal: null, got: 'got hello', stderr: 'oops\n', timedOut: false, cancelled: false });
    expect(Number(ppid)).toBe(mode === 'directly' ? process.pid : spawnerPid());
    const argv = await runProcess({ command: process.execPath, args: ['-e', 'console.log(JSON.stringify(process.argv.slice(1)))', 'a b', '$HOME'], cwd: dir, env: ENV });
    expect(JSON.parse(argv.stdout)).toEqual(['a b', '$HOME']);
  });

  it("gives the process the caller's environment without the payload keys and launch-location variables, and PWD set to its real cwd", async () => {
    const link = path.join(dir, 'link');
    if (!existsSync(link)) symlinkSync(dir, link);
    const run = await runProcess({ command: 'env', cwd: link, env: { ...ENV, KEEP: 'yes', SLIPWAY_PAYLOAD_KEY: 'secret', OLDPWD: '/elsewhere', PWD: '/elsewhere' } });
    const seen = new Map(run.stdout.trim().split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)] as const));
    expect([...seen.keys()].sort()).toEqual(['KEEP', 'PATH', 'PWD']);
    expect(seen.get('PWD')).toBe(realpathSync(dir));
  });

  it('keeps the tail of a long output, marked, and never kills the process for printing much', async () => {
    const run = await runProcess({ command: process.execPath, args: ['-e', "for (let i = 0; i < 20000; i++) process.stdout.write(`line ${i}\\n`); process.stderr.write('end\\n')"], cwd: dir, env: ENV, maxCaptureBytes: 4096 });
    expect(run.exitCode).toBe(0);
    expect(run.stdout.startsWith('…[truncated]\n')).toBe(true);
    expect(run.stdout.endsWith('line 19999\n')).toBe(true);
    expect(Buffer.byteLength(run.stdout.slice('…[truncated]\n'.length))).toBe(4096);
    expect(run.stderr).toBe('end\n');
  });

  it('on timeout kills the whole process group and says so', async () => {
    const pidFile = path.join(dir, `timeout-${mode.length}.pid`);
    const run = await runProcess({ command: `sleep 60 & echo $! > ${pidFile}; wait`, shell: true, cwd: dir, env: ENV, timeoutMs: 500 });
    expect({ timedOut: run.timedOut, cancelled: run.cancelled, exitCode: run.exitCode, signal: run.signal }).toEqual({ timedOut: true, cancelled: false, exitCode: null, signal: 'SIGKILL' });
    await waitUntil(() => !alive(pidIn(pidFile)), 'the background sleep to be killed');
  });

  it('on abort kills the whole process group and reports it cancelled; an abort before the start runs nothing', async () => {
    const pidFile = path.join(dir, `abort-${mode.length}.pid`);
    const stop = new AbortController();
    const running = runProcess({ command: `sleep 60 & echo $! > ${pidFile}; wait`, shell: true, cwd: dir, env: ENV, signal: stop.signal });
    await waitUntil(() => existsSync(pidFile) && readFileSync(pidFile, 'utf8').endsWith('\n'), 'the pid file');
    stop.abort();
    const run = await running;
    expect({ cancelled: run.cancelled, timedOut: run.timedOut, exitCode: run.exitCode }).toEqual({ cancelled: true, timedOut: false, exitCode: null });
    await waitUntil(() => !alive(pidIn(pidFile)), 'the background sleep to be killed');
    const marker = path.join(dir, `never-${mode.length}`);
    const before = await runProcess({ command: `touch ${marker}`, shell: true, cwd: dir, env: ENV, signal: stop.signal });
    expect(before.cancelled).toBe(true);
    expect(existsSync(marker)).toBe(false);
  });

  it('kills what the leader left in its group when it exits, and lets go of pipes a process in another session holds', async () => {
    const inGroup = path.join(dir, `group-${mode.length}.pid`);
    const left = await runProcess({ command: `sleep 60 & echo $! > ${inGroup}; echo done`, shell: true, cwd: dir, env: ENV });
    expect({ exitCode: left.exitCode, stdout: left.stdout }).toEqual({ exitCode: 0, stdout: 'done\n' });
    await waitUntil(() => !alive(pidIn(inGroup)), 'the leftover sleep to be killed');
    // setsid: out of the group's reach, with the run's stdout still open. The run ends anyway.
    const session = path.join(dir, `session-${mode.length}.pid`);
    const daemon = await runProcess({ command: `setsid sleep 60 & echo $! > ${session}; echo started`, shell: true, cwd: dir, env: ENV });
    expect({ exitCode: daemon.exitCode, stdout: daemon.stdout }).toEqual({ exitCode: 0, stdout: 'started\n' });
    process.kill(pidIn(session), 'SIGKILL');
  });

  it('fails with the spawn error when the program does not exist', async () => {
    const e = await runProcess({ command: path.join(dir, 'no-such-program'), cwd: dir, env: ENV }).catch((x: unknown) => x);
    expect((e as NodeJS.ErrnoException).code).toBe('ENOENT');
  });
});

describe('runProcess through the spawner', () => {
  /** `test` with a spawner held (released after, if `test` did not) and a folder of its own. */
  async function withSpawner(test: (dir: string, release: () => void) => Promise<void>): Promise<void> {
    const release = startSpawner();
    const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-run-process-'));
    try {
      await test(dir, release);
    } finally {
      release();
      rmSync(dir, { recursive: true, force: true });
    }
  }

  /** A run of `sleep 60` whose shell wrote its pid; the pid of that sleep's group. */
  async function sleeping(dir: string, name: string) {
    const pidFile = path.join(dir, `${name}.pid`);
    const run = runProcess({ command: `sleep 60 & echo $! > ${pidFile}; wait`, shell: true, cwd: dir, env: ENV });
    await waitUntil(() => existsSync(pidFile) && readFileSync(pidFile, 'utf8').endsWith('\n'), 'the pid file');
    return { run, sleep: pidIn(pidFile) };
  }

  it('fails a run with SpawnerDied when the spawner is killed under it, kills what it ran (once the spawner reported it), and the next run starts a new spawner', () =>
    withSpawner(async (dir) => {
      const { run, sleep } = await sleeping(dir, 'killed');
      await waitUntil(() => spawnerRuns().length === 1, 'the spawner to report the run');
      const first = spawnerPid()!;
      process.kill(first, 'SIGKILL');
      await expect(run).rejects.toBeInstanceOf(SpawnerDied);
      await waitUntil(() => !alive(sleep), 'the sleep the dead spawner ran to be killed');
      const again = await runProcess({ command: 'echo $PPID', shell: true, cwd: dir, env: ENV });
      expect(Number(again.stdout.trim())).toBe(spawnerPid());
      expect(spawnerPid()).not.toBe(first);
    }));

  it('a release while a run is in flight fails it the same way, and the spawner kills what it ran before it exits (ten times: a release that lands as the spawner starts a run must not end it first)', async () => {
    for (let i = 0; i < 10; i++) {
      await withSpawner(async (dir, release) => {
        const { run, sleep } = await sleeping(dir, `released-${i}`);
        release();
        await expect(run).rejects.toThrow(/the process spawner exited while/);
        await waitUntil(() => !alive(sleep), 'the sleep to be killed');
      });
    }
  });

  it('out of file descriptors, the runs that cannot start fail with EMFILE and the spawner lives on', () =>
    withSpawner(async (dir) => {
      await runProcess({ command: 'true', cwd: dir, env: ENV });
      const pid = spawnerPid()!;
      const open = readdirSync(`/proc/${pid}/fd`).length;
      // Room for about one run at a time: its pipes take six descriptors while it starts.
      // The soft limit only: raising it again needs no privilege.
      const soft = execFileSync('prlimit', ['--pid', String(pid), '--nofile', '--noheadings', '--output=SOFT'], { encoding: 'utf8' }).trim();
      execFileSync('prlimit', ['--pid', String(pid), `--nofile=${open + 8}:`]);
      const outcomes = await Promise.all(Array.from({ length: 20 }, () => runProcess({ command: 'sleep', args: ['0.2'], cwd: dir, env: ENV }).then((r) => `exit ${r.exitCode}`, (e: NodeJS.ErrnoException) => `error ${e.code}`)));
      expect([...new Set(outcomes)].sort()).toEqual(['error EMFILE', 'exit 0']);
      expect(spawnerPid()).toBe(pid);
      execFileSync('prlimit', ['--pid', String(pid), `--nofile=${soft}:`]);
      expect((await runProcess({ command: 'echo $PPID', shell: true, cwd: dir, env: ENV })).stdout.trim()).toBe(String(pid));
    }));
});

describe('runProcess directly', () => {
  it('out of file descriptors, the runs that cannot start fail with EMFILE; the process does not crash', () => {
    // In a process of its own with a low limit: an unhandled spawn error would end it.
    const script = `import { runProcess } from ${JSON.stringify(path.join(__dirname, '..', 'activities', 'process.ts'))};
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
execFileSync('prlimit', ['--pid', String(process.pid), '--nofile=' + (readdirSync('/proc/self/fd').length + 8) + ':']);
const outcomes = await Promise.all(Array.from({ length: 40 }, () => runProcess({ command: 'sleep', args: ['0.2'], cwd: '/', env: { PATH: ${JSON.stringify(ENV.PATH)} } }).then((r) => 'exit ' + r.exitCode, (e) => 'error ' + e.code)));
console.log(JSON.stringify([...new Set(outcomes)].sort()));`;
    const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-run-process-'));
    try {
      const file = path.join(dir, 'emfile.mts');
      writeFileSync(file, script);
      const out = execFileSync(process.execPath, ['--import', 'tsx', file], { encoding: 'utf8', cwd: path.join(__dirname, '..') });
      expect(JSON.parse(out.trim().split('\n').at(-1)!)).toEqual(['error EMFILE', 'exit 0']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
