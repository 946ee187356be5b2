/**
 * Enforced resource limits (activities/sandbox/limits.ts) against the real kernel: a fork bomb,
 * a memory hog and a disk filler each hit their limit, the wrapper composes with bubblewrap, and
 * cleanup leaves neither processes nor cgroups behind.
 *
 * Security tests: they never skip. Without cgroups, prlimit or bubblewrap they fail and say why.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runProcess, type RunResult } from '../../activities/process';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import { detectHostLimits, InvalidLimitsError, limitedCommand, type LimitedCommand, type SandboxLimits } from '../../activities/sandbox/limits';
import { exists, processesWith, tempDir, waitFor } from './helpers';

const MiB = 1024 * 1024;
/** Unique per run, so ids and markers never meet another run's leftovers. */
const RUN = `${process.pid}${Date.now() % 100_000}`;
let seq = 0;
const nextId = (label: string) => `t${RUN}-${label}-${++seq}`;

/** A clean environment: the worker's NODE_OPTIONS and friends must not change what a child allocates. */
const ENV = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: '/tmp', LANG: 'C' };

let dir: string;
const pending: LimitedCommand[] = [];

async function limited(limits: SandboxLimits | undefined, label: string, command: string, args: string[], opts: Parameters<typeof limitedCommand>[4] = {}) {
  const l = await limitedCommand(limits, nextId(label), command, args, opts);
  pending.push(l);
  return l;
}

function run(l: LimitedCommand, timeoutMs = 60_000): Promise<RunResult> {
  return runProcess({ command: l.command, args: l.args, cwd: dir, env: ENV, timeoutMs, maxCaptureBytes: 256 * 1024 });
}

async function cleanupAndCheck(l: LimitedCommand): Promise<void> {
  await l.cleanup();
  for (const cg of l.cgroups) expect(await exists(cg), `cgroup ${cg} left behind`).toBe(false);
}

/** The last number a loop printed (one line per process it started). */
function started(stdout: string): number {
  const numbers = stdout.split('\n').filter((line) => /^\d+$/.test(line));
  return numbers.length ? Number(numbers[numbers.length - 1]) : 0;
}

/**
 * Starts up to 200 `setsid sleep <marker>` and prints how many it started. The sleeps escape the
 * process group (runProcess's group kill misses them) and let go of the output pipes (else the
 * runner would wait for them).
 */
const forkLoop = (marker: string) =>
  `i=0; while [ $i -lt 200 ]; do setsid sleep ${marker} </dev/null >/dev/null 2>&1 & i=$((i+1)); echo $i; done; echo all-started`;

describe('enforced sandbox limits', () => {
  beforeAll(async () => {
    dir = tempDir('limits');
    const host = await detectHostLimits();
    if (host.mode === 'none') {
      throw new Error(`sandbox limits need cgroups here (pids and memory cannot be held per sandbox otherwise): ${host.why.join('; ')}`);
    }
    if (!host.prlimit) throw new Error('sandbox limits need prlimit for file sizes: install util-linux (apt-get install util-linux)');
    if (!findExecutable('bwrap')) throw new Error(`the limits suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);
    if (!findExecutable('setsid')) throw new Error('the limits suite needs setsid: install util-linux');
  });

  afterAll(async () => {
    for (const l of pending) await l.cleanup().catch(() => undefined);
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  it('holds a fork bomb to the pids limit, and cleanup kills every process that escaped its process group', async () => {
    const marker = `1000.${RUN}1`;
    const l = await limited({ pids: 32 }, 'fork', '/bin/sh', ['-c', forkLoop(marker)]);
    expect(l.enforcedBy).toMatch(/^cgroup-v[12]$/);
    expect(l.notEnforced).toEqual([]);
    const r = await run(l);
    const n = started(r.stdout);
    expect(r.stdout).not.toContain('all-started');
    expect(r.exitCode).not.toBe(0);
    expect(r.stderr).toMatch(/fork|resource temporarily unavailable/i);
    expect(n).toBeGreaterThan(0);
    expect(n).toBeLessThanOrEqual(32);
    // The sleeps left the shell's process group (setsid): runProcess's group kill missed them.
    const alive = await processesWith(marker);
    expect(alive.length).toBeGreaterThan(0);
    expect(alive.length).toBeLessThanOrEqual(32);
    await cleanupAndCheck(l);
    expect(await waitFor(async () => (await processesWith(marker)).length === 0, 10_000), 'sleeps survived cleanup').toBe(true);
  });

  it('kills a memory hog over memoryBytes, and lets a modest allocation through', async () => {
    const alloc = (mib: number) => `const a = []; for (let i = 0; i < ${mib}; i++) a.push(Buffer.alloc(${MiB}, 1)); console.log('allocated', a.length);`;
    const hog = await limited({ memoryBytes: 64 * MiB }, 'hog', process.execPath, ['-e', alloc(512)]);
    expect(hog.enforcedBy).toMatch(/^cgroup-v[12]$/);
    const r = await run(hog);
    expect(r.stdout).not.toContain('allocated');
    expect(r.exitCode === 0).toBe(false);
    expect(r.signal ?? r.exitCode).toBeTruthy();
    await cleanupAndCheck(hog);

    const modest = await limited({ memoryBytes: 64 * MiB }, 'modest', process.execPath, ['-e', alloc(16)]);
    const ok = await run(modest);
    expect(ok.stderr).toBe('');
    expect(ok.exitCode).toBe(0);
    expect(ok.stdout).toContain('allocated 16');
    await cleanupAndCheck(modest);
  });

  it('stops a disk filler at fileSizeBytes', async () => {
    const file = path.join(dir, 'filler');
    const l = await limited({ fileSizeBytes: MiB }, 'fsize', '/bin/sh', ['-c', `head -c 5000000 /dev/zero > '${file}'`]);
    expect(l.notEnforced).toEqual([]);
    const r = await run(l);
    expect(r.exitCode).not.toBe(0); // head dies of SIGXFSZ: the shell reports 128 + 25
    expect((await fs.stat(file)).size).toBeLessThanOrEqual(MiB);
    await cleanupAndCheck(l);
  });

  it('writes the CPU quota', async () => {
    const l = await limited({ cpus: 0.2 }, 'cpu', '/bin/true', []);
    expect(l.enforcedBy).toMatch(/^cgroup-v[12]$/);
    const host = await detectHostLimits();
    if (host.mode === 'cgroup-v2') {
      const cg = l.cgroups[0];
      expect((await fs.readFile(path.join(cg, 'cpu.max'), 'utf8')).trim()).toBe('20000 100000');
    } else {
      const cg = l.cgroups.find((c) => c.startsWith(path.dirname(host.v1Parents.cpu!) + '/'));
      expect(cg, `no cpu cgroup among ${l.cgroups.join(', ')}`).toBeDefined();
      expect((await fs.readFile(path.join(cg!, 'cpu.cfs_quota_us'), 'utf8')).trim()).toBe('20000');
      expect((await fs.readFile(path.join(cg!, 'cpu.cfs_period_us'), 'utf8')).trim()).toBe('100000');
    }
    const r = await run(l);
    expect(r.exitCode).toBe(0);
    await cleanupAndCheck(l);
  });

  it('composes with bubblewrap: the pids limit holds inside its PID namespace', async () => {
    const marker = `1000.${RUN}2`;
    const inner = `grep -q "slipway/" /proc/self/cgroup && echo in-cgroup; ${forkLoop(marker)}`;
    const l = await limited({ pids: 32 }, 'bwrap', 'bwrap', [
      '--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--unshare-pid', '--die-with-parent', '--', '/bin/sh', '-c', inner,
    ]);
    expect(l.enforcedBy).toMatch(/^cgroup-v[12]$/);
    const r = await run(l);
    expect(r.stdout).toContain('in-cgroup');
    expect(r.stdout).not.toContain('all-started');
    expect(r.stderr).toMatch(/fork|resource temporarily unavailable/i);
    const n = started(r.stdout);
    expect(n).toBeGreaterThan(0);
    expect(n).toBeLessThanOrEqual(32);
    await cleanupAndCheck(l);
    expect(await waitFor(async () => (await processesWith(marker)).length === 0, 10_000), 'sleeps survived cleanup').toBe(true);
  });

  it('rejects invalid limits naming the field', async () => {
    const bad: [unknown, RegExp][] = [
      [{ pids: 0 }, /pids/],
      [{ pids: 2.5 }, /pids must be a positive integer/],
      [{ memoryBytes: -1 }, /memoryBytes/],
      [{ memoryBytes: '64m' }, /memoryBytes/],
      [{ fileSizeBytes: Number.NaN }, /fileSizeBytes/],
      [{ cpus: 0 }, /cpus/],
      [{ cpus: Number.POSITIVE_INFINITY }, /cpus/],
      [{ cpuSeconds: 0 }, /cpuSeconds/],
      [{ pid: 3 }, /unknown field "pid"/],
      [null, /must be an object/],
    ];
    for (const [limits, message] of bad) {
      const p = limitedCommand(limits as SandboxLimits, nextId('bad'), '/bin/true', []);
      await expect(p).rejects.toThrow(InvalidLimitsError);
      await expect(p).rejects.toThrow(message);
    }
    for (const id of ['', '../escape', 'a/b', '.hidden', '-x']) {
      await expect(limitedCommand({ pids: 4 }, id, '/bin/true', [])).rejects.toThrow(/id must be/);
    }
  });

  it('refuses an id already in use, and cleanup removes every cgroup (idempotently)', async () => {
    const id = nextId('dup');
    const l = await limitedCommand({ pids: 8, memoryBytes: 32 * MiB, cpus: 0.5 }, id, '/bin/true', []);
    pending.push(l);
    expect(l.cgroups.length).toBeGreaterThan(0);
    for (const cg of l.cgroups) {
      expect(await exists(cg)).toBe(true);
      expect(path.basename(cg)).toBe(id);
      expect(path.basename(path.dirname(cg))).toBe('slipway');
    }
    await expect(limitedCommand({ pids: 8 }, id, '/bin/true', [])).rejects.toThrow(/must be unique/);
    expect((await run(l)).exitCode).toBe(0);
    await cleanupAndCheck(l);
    await l.cleanup();
    for (const cg of l.cgroups) expect(await exists(cg)).toBe(false);
  });

  it('without limits, runs the command unchanged', async () => {
    const l = await limitedCommand(undefined, nextId('none'), '/bin/echo', ['hi']);
    expect(l).toMatchObject({ command: '/bin/echo', args: ['hi'], enforcedBy: 'none', notEnforced: [], cgroups: [] });
  });

  it('prlimit fallback: file size and address space held, pids and CPU share reported as not enforced', async () => {
    const l = await limited({ pids: 16, memoryBytes: 64 * MiB, cpus: 0.5, fileSizeBytes: MiB }, 'prl', '/bin/sh', ['-c', 'awk \'BEGIN { s = "x"; while (1) s = s s }\''], {
      mode: 'prlimit',
    });
    expect(l.enforcedBy).toBe('prlimit');
    expect(l.cgroups).toEqual([]);
    expect(l.notEnforced.map((s) => s.split(':')[0]).sort()).toEqual(['cpus', 'memoryBytes', 'pids']);
    expect(l.notEnforced.join('\n')).toMatch(/RLIMIT_NPROC/);
    const r = await run(l);
    expect(r.exitCode).not.toBe(0); // awk runs out of address space
    expect(r.stderr).toMatch(/memory|alloc/i);

    const file = path.join(dir, 'filler-prlimit');
    const f = await limited({ fileSizeBytes: MiB }, 'prl-f', '/bin/sh', ['-c', `head -c 5000000 /dev/zero > '${file}'`], { mode: 'prlimit' });
    expect(f.enforcedBy).toBe('prlimit');
    expect((await run(f)).exitCode).not.toBe(0);
    expect((await fs.stat(file)).size).toBeLessThanOrEqual(MiB);
  });
});
