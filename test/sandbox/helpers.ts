/**
 * Real git repositories in temp folders for sandbox tests, and small probes.
 */
import { engineEnv } from '../../activities/sandbox/container-engine';
import type { SandboxCreateRequest } from '../../activities/sandbox/provider';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, promises as fs, realpathSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

export const IDENTITY = ['-c', 'user.name=t', '-c', 'user.email=t@t'];
export const IDENTITY_ENV = { GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@t', GIT_COMMITTER_NAME: 't', GIT_COMMITTER_EMAIL: 't@t' };

export function sh(cwd: string, command: string, env: Record<string, string> = {}): string {
  return execFileSync('/bin/sh', ['-c', command], { cwd, encoding: 'utf8', env: { ...process.env, ...env } }).trim();
}

export function gitIn(cwd: string, ...args: string[]): string {
  return execFileSync('git', ['-C', cwd, ...IDENTITY, ...args], { encoding: 'utf8' }).trim();
}

export function tempDir(prefix: string): string {
  return realpathSync(mkdtempSync(path.join(os.tmpdir(), `slipway-${prefix}-`)));
}

/** `git init -b main` with a couple of commits; returns the repository path and commits. */
export function makeRepo(parent: string, name = 'repo'): { repo: string; first: string; second: string } {
  const repo = path.join(parent, name);
  execFileSync('git', ['init', '-q', '-b', 'main', repo]);
  sh(repo, 'printf "hello\\n" > README.md && mkdir -p src && printf "one\\n" > src/a.txt');
  gitIn(repo, 'add', '-A');
  gitIn(repo, 'commit', '-q', '-m', 'first');
  const first = gitIn(repo, 'rev-parse', 'HEAD');
  sh(repo, 'printf "two\\n" >> src/a.txt');
  gitIn(repo, 'commit', '-q', '-am', 'second');
  const second = gitIn(repo, 'rev-parse', 'HEAD');
  return { repo, first, second };
}

/** PIDs of host processes whose command line contains `marker`. */
export async function processesWith(marker: string): Promise<number[]> {
  const found: number[] = [];
  for (const entry of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const cmdline = await fs.readFile(`/proc/${entry}/cmdline`, 'utf8').catch(() => '');
    if (cmdline.includes(marker)) found.push(Number(entry));
  }
  return found;
}

export async function waitFor(check: () => Promise<boolean>, timeoutMs = 5_000): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

export async function exists(p: string): Promise<boolean> {
  return fs.lstat(p).then(
    () => true,
    () => false,
  );
}

/**
 * Everything observable about a user's checkout: branch, HEAD, index, working tree diff,
 * untracked and ignored files, stash list, and every file's content, mode and mtime
 * (outside .git and .slipway).
 */
export async function snapshotCheckout(repo: string): Promise<Record<string, string>> {
  const snap: Record<string, string> = {
    branch: gitIn(repo, 'symbolic-ref', 'HEAD'),
    head: gitIn(repo, 'rev-parse', 'HEAD'),
    index: gitIn(repo, 'diff', '--cached'),
    worktree: gitIn(repo, 'diff'),
    // Slipway's own folder is ignored through .git/info/exclude; everything else counts.
    status: gitIn(repo, 'status', '--porcelain=v1', '--untracked-files=all', '--ignored')
      .split('\n')
      .filter((line) => !line.slice(3).startsWith('.slipway/'))
      .join('\n'),
    stash: gitIn(repo, 'stash', 'list'),
    lsFilesStage: gitIn(repo, 'ls-files', '--stage'),
  };
  const walk = async (dir: string): Promise<void> => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      const full = path.join(dir, entry.name);
      const rel = path.relative(repo, full);
      if (rel === '.git' || rel === '.slipway') continue;
      const st = await fs.lstat(full);
      if (entry.isSymbolicLink()) snap[`file:${rel}`] = `link ${await fs.readlink(full)}`;
      else if (entry.isDirectory()) await walk(full);
      else {
        const hash = createHash('sha256').update(await fs.readFile(full)).digest('hex');
        snap[`file:${rel}`] = `${st.mode.toString(8)} ${st.mtimeMs} ${st.ino} ${hash}`;
      }
    }
  };
  await walk(repo);
  return snap;
}

let requests = 0;
/** A create request for sandbox `label` of `group`, on a branch of its own (a new one each call). */
export function sandboxRequest(repo: string, label: string, extra: Partial<SandboxCreateRequest> & { group?: string } = {}): SandboxCreateRequest {
  const group = extra.group ?? 'obj';
  return {
    sandboxId: `${group === 'obj' ? 't' : group}.${label}`,
    repository: repo,
    group,
    name: label,
    branch: `slipway/${group}/${label}-${++requests}`,
    base: 'main',
    ...extra,
  };
}

/**
 * A shell script that gets a container killed by the kernel's OOM killer. An allocating process
 * would be the OOM killer's choice and the container would live on; so every other process is
 * marked first (oom_score_adj 1000, which raising needs no capability), then /dev/shm is filled:
 * tmpfs pages count against the container's memory but belong to no process, so the marked init
 * and `sleep` are what the kernel kills, and the container with them. Needs a memory limit below
 * the size of /dev/shm (64 MiB on podman).
 */
export const OOM_KILL_CONTAINER_SCRIPT =
  'for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] || echo 1000 > "$d/oom_score_adj" 2>/dev/null; done; dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>&1';

/** Runs podman (with the project's containers.conf) and returns its trimmed stdout; throws on a non-zero exit. */
export function podman(...args: string[]): string {
  return execFileSync('podman', args, { env: engineEnv(), encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }).trim();
}

/** True when podman exits 0 (an image or container exists, ...). */
export function podmanOk(...args: string[]): boolean {
  try {
    podman(...args);
    return true;
  } catch {
    return false;
  }
}

/**
 * A shared object that creates `marker` whenever the dynamic loader runs it, as a preloaded
 * library (its constructor) or as an audit library (`la_version`): a host path the sandbox cannot
 * see, so the marker means it ran in one of Slipway's own host-side processes. Compiled here with
 * gcc or cc; without a compiler this throws, naming the package, never skips.
 */
export function hostileLibrary(dir: string, marker: string): string {
  const compiler = ['gcc', 'cc'].map((c) => { try { return execFileSync('sh', ['-c', `command -v ${c}`], { encoding: 'utf8' }).trim(); } catch { return ''; } }).find(Boolean);
  if (!compiler) throw new Error('this attack test needs a C compiler to build its LD_PRELOAD/LD_AUDIT library: install one with `apt-get install gcc`');
  const source = path.join(dir, 'hostile.c');
  const lib = path.join(dir, 'hostile.so');
  const c = [
    '#include <fcntl.h>',
    '#include <unistd.h>',
    `static void mark(void) { int fd = open(${JSON.stringify(marker)}, O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd); }`,
    '__attribute__((constructor)) static void preloaded(void) { mark(); }',
    'unsigned int la_version(unsigned int v) { mark(); return v; }',
  ].join('\n');
  writeFileSync(source, c);
  execFileSync(compiler, ['-shared', '-fPIC', '-o', lib, source]);
  return lib;
}

/** The numeric pids of every process whose cmdline or environ (as `file`) holds `needle`. */
export async function processesHolding(needle: string, file: 'cmdline' | 'environ'): Promise<number[]> {
  const hits: number[] = [];
  for (const pid of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(pid)) continue;
    const text = await fs.readFile(`/proc/${pid}/${file}`).catch(() => Buffer.alloc(0));
    if (text.includes(needle)) hits.push(Number(pid));
  }
  return hits;
}

/** A process's name (`/proc/PID/comm`), '' once it is gone. */
export async function processName(pid: number): Promise<string> {
  return (await fs.readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')).trim();
}
