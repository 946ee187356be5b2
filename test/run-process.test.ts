/**
 * runProcess (activities/process.ts) with real processes, run directly by this process and through
 * the worker's spawner (ADR 0036): a plain run (no lines as they come, no pipes, no hooks) takes
 * the spawner when one runs, and must behave the same either way.
 */
import { existsSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runProcess } from '../activities/process';
import { spawnerPid, startSpawner } from '../lib/spawner';

const ENV = { PATH: process.env.PATH ?? '/usr/bin:/bin' };

async function waitFor(cond: () => boolean, what: string, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

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
    await waitFor(() => !alive(pidIn(pidFile)), 'the background sleep to be killed');
  });

  it('on abort kills the whole process group and reports it cancelled; an abort before the start runs nothing', async () => {
    const pidFile = path.join(dir, `abort-${mode.length}.pid`);
    const stop = new AbortController();
    const running = runProcess({ command: `sleep 60 & echo $! > ${pidFile}; wait`, shell: true, cwd: dir, env: ENV, signal: stop.signal });
    await waitFor(() => existsSync(pidFile) && readFileSync(pidFile, 'utf8').endsWith('\n'), 'the pid file');
    stop.abort();
    const run = await running;
    expect({ cancelled: run.cancelled, timedOut: run.timedOut, exitCode: run.exitCode }).toEqual({ cancelled: true, timedOut: false, exitCode: null });
    await waitFor(() => !alive(pidIn(pidFile)), 'the background sleep to be killed');
    const marker = path.join(dir, `never-${mode.length}`);
    const before = await runProcess({ command: `touch ${marker}`, shell: true, cwd: dir, env: ENV, signal: stop.signal });
    expect(before.cancelled).toBe(true);
    expect(existsSync(marker)).toBe(false);
  });

  it('kills what the leader left in its group when it exits, and lets go of pipes a process in another session holds', async () => {
    const inGroup = path.join(dir, `group-${mode.length}.pid`);
    const left = await runProcess({ command: `sleep 60 & echo $! > ${inGroup}; echo done`, shell: true, cwd: dir, env: ENV });
    expect({ exitCode: left.exitCode, stdout: left.stdout }).toEqual({ exitCode: 0, stdout: 'done\n' });
    await waitFor(() => !alive(pidIn(inGroup)), 'the leftover sleep to be killed');
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
  it('ends a run as killed when the spawner dies under it, and the next run starts a new spawner', async () => {
    const release = startSpawner();
    try {
      const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-run-process-'));
      const pidFile = path.join(dir, 'sleep.pid');
      const running = runProcess({ command: `echo $$ > ${pidFile}; sleep 60`, shell: true, cwd: dir, env: ENV });
      await waitFor(() => existsSync(pidFile) && readFileSync(pidFile, 'utf8').endsWith('\n'), 'the pid file');
      const first = spawnerPid()!;
      process.kill(first, 'SIGKILL');
      const run = await running;
      expect({ exitCode: run.exitCode, signal: run.signal }).toEqual({ exitCode: null, signal: 'SIGKILL' });
      expect(run.stderr).toContain('the process spawner exited');
      const again = await runProcess({ command: 'echo $PPID', shell: true, cwd: dir, env: ENV });
      expect(Number(again.stdout.trim())).toBe(spawnerPid());
      expect(spawnerPid()).not.toBe(first);
      try {
        process.kill(pidIn(pidFile), 'SIGKILL');
      } catch {
        /* gone with its shell */
      }
      rmSync(dir, { recursive: true, force: true });
    } finally {
      release();
    }
  });
});
