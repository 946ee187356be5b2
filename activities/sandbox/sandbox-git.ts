/**
 * A confined sandbox's own git state (ADR 0006).
 *
 * A local sandbox is a `git worktree` of the user's repository, but under confinement the agent
 * never sees the repository's git directory, nor learns where it is. It sees a private git
 * directory that Slipway made for it, at a fixed path:
 *
 *   <repo>/.slipway/git/<sandbox>/      bound at /run/slipway/git inside the sandbox
 *     objects/                          new objects, private; alternates -> the shared objects
 *     objects/info/alternates           /run/slipway/objects/<n>, the repository's object
 *                                       folders, bound read-only
 *     refs/heads/<branch>               the sandbox's branch (loose), its only writable ref
 *     packed-refs                       a read-only copy of the repository's branches and tags
 *     config, info/exclude              a minimal config (identity, format) and the excludes
 *     worktrees/<admin id>/             HEAD, index, commondir, gitdir (/workspace/.git) of this worktree
 *   <repo>/.slipway/git/<sandbox>.gitlink   `gitdir: /run/slipway/git/worktrees/<admin id>`, bound
 *                                       read-only over the worktree's `.git`, so git inside
 *                                       finds its private directory and no host path
 *
 * So an agent can write only its own objects and refs: deleting objects, moving `main` or the
 * integration branch, setting hooks, fsmonitor or any config changes only its private copy. Its
 * work reaches the repository through `collect`, which Slipway runs from outside: git inside the
 * sandbox packs the commits (`pack-objects`), and git outside indexes the pack in the repository
 * with `index-pack --strict` (the checks a fetch from an untrusted remote gets), then moves the
 * sandbox's branch. Remote sandboxes return work the same way: a pack, never a git directory.
 *
 * Slipway's own git never runs on the sandbox's git directory outside the sandbox.
 */
import { spawn, type ChildProcess, type ChildProcessByStdio } from 'node:child_process';
import type { Readable } from 'node:stream';
import { createHash, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';
import { commitIdentity, commonDirOf, git, GIT_HARDENING, GIT_TIMEOUT_MS, gitEnv, gitMaybe } from '../../lib/git';
import { killProcessGroup } from '../process';
import { isInside } from './paths';
import { SANDBOX_WORKSPACE } from './bubblewrap';
import { readSandboxFile, writeSandboxFile } from './file-io';

/** Where the repository's object folders appear inside a sandbox (read-only). */
export const SHARED_OBJECTS_MOUNT = '/run/slipway/objects';
/** Where the sandbox's private git directory appears inside it. */
export const SANDBOX_GIT_MOUNT = '/run/slipway/git';
/** The worktree's `.git` as the sandbox sees it (SANDBOX_WORKSPACE/.git). */
const SANDBOX_DOT_GIT = `${SANDBOX_WORKSPACE}/.git`;
/** Largest pack a sandbox may hand back in one collect (bytes). */
export const MAX_COLLECT_PACK_BYTES = 2 * 1024 ** 3;

export interface WorktreeLocation {
  repository: string;
  commonDir: string;
  /** `<common>/worktrees/<id>`: git's record of the worktree, out of every sandbox's reach. */
  adminDir: string;
  adminId: string;
  worktree: string;
}

export interface SandboxGit extends WorktreeLocation {
  /** The sandbox's private git directory on the host. */
  gitDir: string;
  /** The trusted `.git` link file, bound read-only over the worktree's `.git`. */
  gitLink: string;
  /** The repository's object folders, and where each is mounted inside. */
  sharedObjects: Array<{ source: string; dest: string }>;
}

/**
 * Finds the worktree's record in the repository: the admin folder whose `gitdir` names
 * `<worktree>/.git`. Read from the repository's common dir (which no sandbox can write), never
 * from the worktree's own `.git` file (which the agent controls).
 */
export async function locateWorktree(repository: string, worktree: string): Promise<WorktreeLocation> {
  const repo = await fs.realpath(repository);
  const root = await fs.realpath(worktree);
  const commonDir = await commonDirOf(repo);
  const adminRoot = path.join(commonDir, 'worktrees');
  const matches: string[] = [];
  for (const id of await fs.readdir(adminRoot).catch(() => [] as string[])) {
    const gitdirFile = await fs.readFile(path.join(adminRoot, id, 'gitdir'), 'utf8').catch(() => undefined);
    if (gitdirFile === undefined) continue;
    const named = path.resolve(adminRoot, id, gitdirFile.trim());
    const namedReal = await fs.realpath(path.dirname(named)).catch(() => path.dirname(named));
    if (path.basename(named) === '.git' && namedReal === root) matches.push(path.join(adminRoot, id));
  }
  if (matches.length !== 1) {
    throw new Error(
      matches.length === 0 ? `${root} is not a registered worktree of ${repo}` : `several worktree records of ${repo} claim ${root}: ${matches.join(', ')}`,
    );
  }
  const adminDir = await fs.realpath(matches[0]);
  return { repository: repo, commonDir, adminDir, adminId: path.basename(adminDir), worktree: root };
}

/** Git arguments that address a worktree through its trusted record, ignoring its `.git` file. */
export function trustedWorktreeArgs(loc: Pick<WorktreeLocation, 'adminDir' | 'worktree'>): string[] {
  return [`--git-dir=${loc.adminDir}`, `--work-tree=${loc.worktree}`];
}

/**
 * `<repo>/.slipway/git/<worktree path below .slipway>`: keyed by where the sandbox lives, so it
 * survives a suspend and restore (whose worktree record may get another id).
 */
export function sandboxGitDir(repository: string, worktree: string): string {
  const base = path.join(repository, SLIPWAY_DIR);
  const rel = path.relative(base, worktree);
  if (rel && !rel.startsWith('..') && !path.isAbsolute(rel) && !rel.startsWith('git')) return path.join(base, 'git', rel);
  return path.join(base, 'git', '_external', createHash('sha256').update(worktree).digest('hex').slice(0, 24));
}

/** The repository's object folders: its own and those it borrows through alternates. */
export async function objectFolders(commonDir: string): Promise<string[]> {
  const own = await fs.realpath(path.join(commonDir, 'objects'));
  const folders = [own];
  const alternates = await fs.readFile(path.join(own, 'info', 'alternates'), 'utf8').catch(() => '');
  for (const line of alternates.split('\n').map((l) => l.trim())) {
    if (!line || line.startsWith('#')) continue;
    const real = await fs.realpath(path.resolve(own, line)).catch(() => undefined);
    if (real && !folders.includes(real)) folders.push(real);
  }
  return folders;
}

/**
 * Makes (once) the sandbox's private git directory, and its worktree record inside it from the
 * repository's (HEAD and index as Slipway left them). Idempotent and safe against a concurrent
 * call: each part is built aside and renamed into place.
 */
export async function ensureSandboxGit(loc: WorktreeLocation, branch: string | undefined): Promise<SandboxGit> {
  const gitDir = sandboxGitDir(loc.repository, loc.worktree);
  const folders = await objectFolders(loc.commonDir);
  const sharedObjects = folders.map((source, i) => ({ source, dest: `${SHARED_OBJECTS_MOUNT}/${i}` }));
  if (!(await exists(path.join(gitDir, 'HEAD')))) {
    const tmp = `${gitDir}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    await fs.mkdir(path.join(tmp, 'objects', 'info'), { recursive: true });
    await fs.mkdir(path.join(tmp, 'objects', 'pack'), { recursive: true });
    await fs.mkdir(path.join(tmp, 'refs', 'heads'), { recursive: true });
    await fs.mkdir(path.join(tmp, 'refs', 'tags'), { recursive: true });
    await fs.mkdir(path.join(tmp, 'info'), { recursive: true });
    await fs.mkdir(path.join(tmp, 'worktrees'), { recursive: true });
    await fs.writeFile(path.join(tmp, 'objects', 'info', 'alternates'), sharedObjects.map((o) => o.dest).join('\n') + '\n');
    await fs.writeFile(path.join(tmp, 'config'), await sandboxConfig(loc.repository));
    await fs.copyFile(path.join(loc.commonDir, 'info', 'exclude'), path.join(tmp, 'info', 'exclude')).catch(() => undefined);
    // A read-only view of the repository's branches and tags (reviewers diff against the target).
    const refs = await git(loc.repository, ['for-each-ref', '--format=%(objectname) %(refname)', 'refs/heads', 'refs/tags']);
    await fs.writeFile(path.join(tmp, 'packed-refs'), refs ? `${refs}\n` : '');
    const head = branch ? `ref: refs/heads/${branch}\n` : (await fs.readFile(path.join(loc.adminDir, 'HEAD'), 'utf8'));
    await fs.writeFile(path.join(tmp, 'HEAD'), head);
    if (branch) {
      const tip = await gitMaybe(loc.repository, ['rev-parse', '--verify', '--quiet', `refs/heads/${branch}^{commit}`]);
      if (tip) {
        await fs.mkdir(path.dirname(path.join(tmp, 'refs', 'heads', branch)), { recursive: true });
        await fs.writeFile(path.join(tmp, 'refs', 'heads', branch), `${tip}\n`);
      }
    }
    await fs.mkdir(path.dirname(gitDir), { recursive: true });
    await fs.rename(tmp, gitDir).catch(async (e: NodeJS.ErrnoException) => {
      await fs.rm(tmp, { recursive: true, force: true });
      // Another caller made it first (ENOTEMPTY/EEXIST): theirs is as good.
      if (e.code !== 'ENOTEMPTY' && e.code !== 'EEXIST') throw e;
    });
  }
  const admin = path.join(gitDir, 'worktrees', loc.adminId);
  if (!(await exists(path.join(admin, 'gitdir')))) {
    const tmp = `${admin}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    await fs.mkdir(tmp, { recursive: true });
    await fs.copyFile(path.join(loc.adminDir, 'HEAD'), path.join(tmp, 'HEAD'));
    await fs.copyFile(path.join(loc.adminDir, 'index'), path.join(tmp, 'index')).catch(() => undefined);
    await fs.writeFile(path.join(tmp, 'commondir'), '../..\n');
    await fs.writeFile(path.join(tmp, 'gitdir'), `${SANDBOX_DOT_GIT}\n`);
    await fs.rename(tmp, admin).catch(async (e: NodeJS.ErrnoException) => {
      await fs.rm(tmp, { recursive: true, force: true });
      if (e.code !== 'ENOTEMPTY' && e.code !== 'EEXIST') throw e;
    });
  }
  // Made before fixed paths, the record names the host path (`git worktree list` inside would
  // show it). The folder is the sandbox's: written by descriptor, following no link it made.
  const recorded = await readSandboxFile(gitDir, `worktrees/${loc.adminId}/gitdir`, { maxBytes: 4096 }).catch(() => undefined);
  if (recorded !== undefined && recorded.toString() !== `${SANDBOX_DOT_GIT}\n`) {
    await writeSandboxFile(gitDir, `worktrees/${loc.adminId}/gitdir`, `${SANDBOX_DOT_GIT}\n`).catch(() => undefined);
  }
  // Outside the bound folder, so Slipway writes it without following anything the sandbox made;
  // a restore may change the id it names.
  const gitLink = `${gitDir}.gitlink`;
  await writeIfChanged(gitLink, `gitdir: ${SANDBOX_GIT_MOUNT}/worktrees/${loc.adminId}\n`);
  return { ...loc, gitDir, gitLink, sharedObjects };
}

/** Writes a file Slipway owns (outside every sandbox) when its content differs, atomically. */
async function writeIfChanged(file: string, content: string): Promise<void> {
  if ((await fs.readFile(file, 'utf8').catch(() => undefined)) === content) return;
  const tmp = `${file}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  await fs.writeFile(tmp, content, { flag: 'wx' });
  await fs.rename(tmp, file);
}

/** A minimal config: the repository's format and identity, nothing that executes. */
async function sandboxConfig(repository: string): Promise<string> {
  const format = await gitMaybe(repository, ['config', '--get', 'extensions.objectformat']);
  const { name, email } = await commitIdentity(repository);
  const quote = (v: string) => JSON.stringify(v.replace(/[\n\r]/g, ' '));
  return [
    '[core]',
    `\trepositoryformatversion = ${format ? 1 : 0}`,
    '\tfilemode = true',
    '\tbare = false',
    '\tlogallrefupdates = true',
    ...(format ? ['[extensions]', `\tobjectformat = ${format}`] : []),
    '[user]',
    `\tname = ${quote(name)}`,
    `\temail = ${quote(email)}`,
    '',
  ].join('\n');
}

/** Drops a sandbox's private git directory (on create, so a sandbox made again starts clean, and on destroy). */
export async function discardSandboxGit(repository: string, worktree: string): Promise<void> {
  const top = path.join(repository, SLIPWAY_DIR, 'git');
  const dir = sandboxGitDir(repository, worktree);
  if (!isInside(top, dir) || dir === top) return;
  await fs.rm(dir, { recursive: true, force: true });
  await fs.rm(`${dir}.gitlink`, { force: true });
}

/**
 * The sandbox's private agent home under confinement: beside its git state, outside the
 * worktree, so nothing the agent keeps there (sessions, caches) lands in its work or in the
 * worker's own home; it lives and dies with the sandbox (not with its git state, which a merge
 * may start afresh).
 */
export function sandboxAgentHome(repository: string, worktree: string): string {
  return `${sandboxGitDir(repository, worktree)}.home`;
}

export async function discardAgentHome(repository: string, worktree: string): Promise<void> {
  const top = path.join(repository, SLIPWAY_DIR, 'git');
  const dir = sandboxAgentHome(repository, worktree);
  if (isInside(top, dir)) await fs.rm(dir, { recursive: true, force: true });
}

/**
 * After a restore registered the worktree again, possibly under another id: the sandbox's own
 * record of it (HEAD, index, an in-progress merge) moves to that id, so nothing of it is lost.
 */
export async function adoptSandboxGitWorktree(loc: WorktreeLocation): Promise<void> {
  const records = path.join(sandboxGitDir(loc.repository, loc.worktree), 'worktrees');
  const ids = await fs.readdir(records).catch(() => [] as string[]);
  if (ids.includes(loc.adminId) || ids.length !== 1) return;
  await fs.rename(path.join(records, ids[0]), path.join(records, loc.adminId));
  await fs.writeFile(path.join(records, loc.adminId, 'gitdir'), `${SANDBOX_DOT_GIT}\n`);
}

/** Environment for git inside a confined sandbox: its files belong to a uid that is not the sandbox's. */
export const CONFINED_GIT_ENV: Record<string, string> = {
  GIT_CONFIG_COUNT: '1',
  GIT_CONFIG_KEY_0: 'safe.directory',
  GIT_CONFIG_VALUE_0: '*',
};

export const OBJECT_ID = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/;

/**
 * Imports a pack that a confined command writes on its stdout into the repository:
 * `index-pack --strict` checks every object (as for a fetch from an untrusted remote), the size
 * is capped, and both processes die on timeout or abort.
 */
export function importPack(
  repository: string,
  producer: { command: string; args: string[]; env: NodeJS.ProcessEnv; cwd: string; extraPipes?: number; prepare?: (child: ChildProcess) => void },
  opts: { maxBytes?: number; timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<void> {
  const maxBytes = opts.maxBytes ?? MAX_COLLECT_PACK_BYTES;
  return new Promise((resolve, reject) => {
    const source = spawn(producer.command, producer.args, { cwd: producer.cwd, env: producer.env, detached: true, stdio: ['ignore', 'pipe', 'pipe', ...Array.from({ length: producer.extraPipes ?? 0 }, () => 'pipe' as const)] }) as ChildProcessByStdio<null, Readable, Readable>;
    producer.prepare?.(source);
    const sink = spawn('git', [...GIT_HARDENING, '-C', repository, 'index-pack', '--stdin', '--strict', '--fix-thin'], {
      env: gitEnv(),
      detached: true,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let bytes = 0;
    let failure: Error | undefined;
    let sourceErr = '';
    let sinkErr = '';
    const stop = (why: Error) => {
      failure ??= why;
      killProcessGroup(source.pid);
      killProcessGroup(sink.pid);
    };
    const timer = setTimeout(() => stop(new Error('collect timed out')), opts.timeoutMs ?? GIT_TIMEOUT_MS);
    const onAbort = () => stop(new Error('collect cancelled'));
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    source.stdout.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > maxBytes) stop(new Error(`the sandbox's pack exceeds ${maxBytes} bytes`));
    });
    source.stdout.pipe(sink.stdin);
    sink.stdin.on('error', () => undefined);
    source.stderr.on('data', (c: Buffer) => (sourceErr = (sourceErr + c.toString()).slice(-4000)));
    sink.stderr.on('data', (c: Buffer) => (sinkErr = (sinkErr + c.toString()).slice(-4000)));
    sink.stdout.resume();
    let pending = 2;
    let sourceCode: number | null = null;
    let sinkCode: number | null = null;
    const done = () => {
      if (--pending > 0) return;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      if (failure) reject(failure);
      else if (sourceCode !== 0) reject(new Error(`packing the sandbox's work failed (exit ${sourceCode}): ${sourceErr.trim()}`));
      else if (sinkCode !== 0) reject(new Error(`the sandbox's pack was refused (exit ${sinkCode}): ${sinkErr.trim()}`));
      else resolve();
    };
    source.on('error', (e) => stop(e));
    sink.on('error', (e) => stop(e));
    source.on('close', (code) => {
      sourceCode = code;
      done();
    });
    sink.on('close', (code) => {
      sinkCode = code;
      done();
    });
  });
}

async function exists(p: string): Promise<boolean> {
  return fs.lstat(p).then(
    () => true,
    () => false,
  );
}
