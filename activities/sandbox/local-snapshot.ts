/**
 * Suspend and restore for local (git worktree) sandboxes: the idle offload of the sandbox
 * service. Linux-style fidelity from the proposal: files come back exactly, processes do not.
 *
 * Suspend captures, in the repository's own object store:
 *   - the index as a tree (staged changes stay staged),
 *   - the working tree as a tree, untracked files included (a throwaway index + `git add -A`),
 *   - HEAD and the branch it is on (or the detached commit),
 * under the ref `refs/slipway/snapshots/<group>/<name>` (two commits whose parent is HEAD, so
 * gc keeps them and unchanged files cost nothing). Ignored files the template does not supply
 * (build outputs, `.slipway/grants.json`) go into a tar beside the manifest; ignored files the
 * template does supply (node_modules, ...) are copied again from it on restore. Then the
 * worktree is removed: the directory is freed.
 *
 * Restore adds the worktree back without checkout, writes the working tree from its tree, sets
 * the index to the staged tree, unpacks the tar, re-copies template files, and drops the
 * snapshot. Both steps are idempotent, so a retried activity converges.
 *
 * Not kept (documented in ADR 0003): running processes, an in-progress merge or rebase, file
 * modes other than git's 644/755, empty directories, nested repositories' contents.
 */
import { removeLockedWorktree } from './worktree-admin';
import { writeJsonAtomic } from '../../lib/atomic-write';
import { execFile } from 'node:child_process';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SLIPWAY_DIR, WORKTREES_DIR } from '../../core/ids';
import { addWorktree, git, gitMaybe, GitError, rawGit, SLIPWAY_GIT_IDENTITY } from '../../lib/git';
import { collapse, copyIgnoredFiles, listIgnoredToCopy } from './copy-ignored';
import { locateWorktree, objectFolders, trustedWorktreeArgs, type WorktreeLocation } from './sandbox-git';

export const SNAPSHOTS_DIR = `${SLIPWAY_DIR}/snapshots`;
const CHECKOUT_WORKERS = 8;
export const SNAPSHOT_REF_PREFIX = 'refs/slipway/snapshots';

export interface LocalSnapshotManifest {
  version: 1;
  ref: string;
  repository: string;
  root: string;
  head: string;
  /** Full ref HEAD pointed at (`refs/heads/...`), absent when detached. */
  branchRef?: string;
  indexTree: string;
  worktreeTree: string;
  /** Ignored paths archived in ignored.tar (relative, git's --directory form). */
  archived: string[];
  /** Ignored paths left to the template (copied again from the repository on restore). */
  fromTemplate: string[];
  bytes: number;
  createdAt: string;
}

export interface SuspendResult {
  snapshotRef: string;
  bytes: number;
  files: number;
  durationMs: number;
}

export interface RestoreResult {
  root: string;
  branch?: string;
  head: string;
  durationMs: number;
  alreadyRestored: boolean;
}

export class SnapshotError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'SnapshotError';
  }
}

/** `<repo>/.slipway/worktrees/<group>/<name>` -> its parts. */
function parseRoot(root: string): { repository: string; group: string; name: string } {
  const name = path.basename(root);
  const group = path.basename(path.dirname(root));
  const repository = path.dirname(path.dirname(path.dirname(path.dirname(root))));
  if (path.join(repository, WORKTREES_DIR, group, name) !== root) throw new SnapshotError(`${root} is not a Slipway sandbox root`);
  return { repository, group, name };
}

const snapshotDir = (repository: string, group: string, name: string) => path.join(repository, SNAPSHOTS_DIR, group, name);
const manifestPath = (dir: string) => path.join(dir, 'manifest.json');
const snapshotRefName = (group: string, name: string) => `${SNAPSHOT_REF_PREFIX}/${group}/${name}`;

async function exists(p: string): Promise<boolean> {
  return fs.lstat(p).then(
    () => true,
    () => false,
  );
}

function run(cmd: string, args: string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv } = {}): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { ...opts, maxBuffer: 256 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) reject(new Error(`${cmd} ${args.slice(0, 3).join(' ')} failed: ${(stderr || error.message).trim()}`));
      else resolve(stdout);
    });
  });
}

const identityEnv = {
  GIT_AUTHOR_NAME: SLIPWAY_GIT_IDENTITY.name,
  GIT_AUTHOR_EMAIL: SLIPWAY_GIT_IDENTITY.email,
  GIT_COMMITTER_NAME: SLIPWAY_GIT_IDENTITY.name,
  GIT_COMMITTER_EMAIL: SLIPWAY_GIT_IDENTITY.email,
};

async function readManifest(dir: string): Promise<LocalSnapshotManifest | undefined> {
  try {
    return JSON.parse(await fs.readFile(manifestPath(dir), 'utf8')) as LocalSnapshotManifest;
  } catch {
    return undefined;
  }
}

/**
 * The snapshot's own object store: what suspend writes (changed and untracked files) goes to
 * `<snapshot>/objects`, never into the repository, so a tenant's files neither grow the
 * operator's repository nor become visible to other sandboxes; the repository's objects are read
 * through alternates. Dropped with the snapshot.
 */
async function snapshotStore(loc: WorktreeLocation, dir: string): Promise<{ GIT_OBJECT_DIRECTORY: string; GIT_ALTERNATE_OBJECT_DIRECTORIES: string }> {
  return {
    GIT_OBJECT_DIRECTORY: path.join(dir, 'objects'),
    GIT_ALTERNATE_OBJECT_DIRECTORIES: (await objectFolders(loc.commonDir)).join(path.delimiter),
  };
}

async function folderBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await fs.readdir(dir, { withFileTypes: true, recursive: true }).catch(() => [])) {
    if (entry.isFile()) total += (await fs.lstat(path.join(entry.parentPath ?? (entry as unknown as { path: string }).path, entry.name)).catch(() => undefined))?.size ?? 0;
  }
  return total;
}

/** Ignored entries of the worktree, in git's collapsed --directory form. */
async function ignoredEntries(loc: WorktreeLocation): Promise<string[]> {
  const out = await rawGit(loc.worktree, [...trustedWorktreeArgs(loc), 'ls-files', '-z', '--others', '--ignored', '--exclude-standard', '--directory']);
  return collapse(out.split('\0').filter(Boolean));
}

const covers = (dir: string, p: string) => dir === p || (dir.endsWith('/') && p.startsWith(dir));

/**
 * Suspends the sandbox at `root`: snapshot stored, directory freed. Throws SnapshotError when
 * the state cannot be captured faithfully (a merge conflict in the index); the sandbox is left
 * untouched in that case.
 */
export async function suspendLocal(root: string, opts: { templateIgnored: boolean }): Promise<SuspendResult> {
  const started = Date.now();
  const { repository, group, name } = parseRoot(root);
  const dir = snapshotDir(repository, group, name);
  const ref = snapshotRefName(group, name);
  const done = await readManifest(dir);
  if (done && !(await exists(root))) {
    // A retried suspend whose first attempt finished: the snapshot stands.
    return { snapshotRef: ref, bytes: done.bytes, files: 0, durationMs: Date.now() - started };
  }
  if (!(await exists(path.join(root, '.git')))) throw new SnapshotError(`${root} is not a live worktree`);
  // Git addresses the worktree through the repository's record of it, never its `.git` file.
  const loc = await locateWorktree(repository, root).catch((e: Error) => {
    throw new SnapshotError(e.message);
  });
  const store = await snapshotStore(loc, dir);
  await fs.mkdir(store.GIT_OBJECT_DIRECTORY, { recursive: true });
  const wt = (args: string[], env?: Record<string, string>) => rawGit(root, [...trustedWorktreeArgs(loc), ...args], { ...store, ...env }).then((o) => o.trim());

  const head = await wt(['rev-parse', 'HEAD']);
  const branchRef = await wt(['symbolic-ref', '-q', 'HEAD']).catch(() => undefined);
  let indexTree: string;
  try {
    indexTree = await wt(['write-tree']);
  } catch (e) {
    throw new SnapshotError(`the index cannot be captured (unresolved merge?): ${(e as GitError).stderr?.trim() ?? (e as Error).message}`);
  }
  // The working tree, untracked files included, through a throwaway copy of the index (its
  // stat cache means only changed files are hashed).
  const realIndex = path.join(loc.adminDir, 'index');
  const tmpIndex = path.join(os.tmpdir(), `slipway-snapshot-index-${process.pid}-${Date.now()}`);
  await fs.copyFile(realIndex, tmpIndex).catch(() => undefined);
  let worktreeTree: string;
  try {
    const env = { GIT_INDEX_FILE: tmpIndex };
    await wt(['add', '-A', '--ignore-errors', '.'], env);
    worktreeTree = await wt(['write-tree'], env);
  } finally {
    await fs.rm(tmpIndex, { force: true });
  }
  const env = { ...identityEnv };
  const indexCommit = await wt(['commit-tree', indexTree, '-p', head, '-m', 'slipway snapshot: index'], env);
  await wt(['commit-tree', worktreeTree, '-p', head, '-p', indexCommit, '-m', `slipway snapshot of ${group}/${name}`], env);

  // Ignored files: the template supplies some again; the rest are archived.
  const template = opts.templateIgnored ? (await listIgnoredToCopy(repository)).paths : [];
  const ignored = await ignoredEntries(loc);
  const fromTemplate = ignored.filter((entry) => template.some((t) => covers(t, entry)));
  const archived = ignored.filter((entry) => !fromTemplate.includes(entry));
  await fs.mkdir(dir, { recursive: true });
  let bytes = 0;
  if (archived.length > 0) {
    const tar = path.join(dir, 'ignored.tar');
    const list = path.join(dir, 'ignored.list');
    await fs.writeFile(list, archived.map((e) => (e.endsWith('/') ? e.slice(0, -1) : e)).join('\0') + '\0');
    await run('tar', ['-C', root, '--null', '-T', list, '-cf', tar]);
    await fs.chmod(tar, 0o600);
    bytes += (await fs.stat(tar)).size;
  }
  // Storage attributable to the snapshot: changed and untracked blobs (the rest is shared).
  const changed = (await rawGit(repository, ['diff-tree', '-r', '-z', '--no-commit-id', '--name-only', head, worktreeTree], store)).split('\0').filter(Boolean);
  bytes += await folderBytes(store.GIT_OBJECT_DIRECTORY);

  const manifest: LocalSnapshotManifest = {
    version: 1,
    ref,
    repository,
    root,
    head,
    ...(branchRef ? { branchRef } : {}),
    indexTree,
    worktreeTree,
    archived,
    fromTemplate,
    bytes,
    createdAt: new Date().toISOString(),
  };
  await writeJsonAtomic(manifestPath(dir), manifest, { mode: 0o600 });
  // Only now, with everything stored, is the working directory given up.
  await removeLockedWorktree(repository, root);
  return { snapshotRef: ref, bytes, files: changed.length, durationMs: Date.now() - started };
}

/** Restores a suspended sandbox to `root` exactly as it was suspended, then drops the snapshot. */
export async function restoreLocal(root: string, opts: { templateIgnored: boolean }): Promise<RestoreResult> {
  const started = Date.now();
  const { repository, group, name } = parseRoot(root);
  const dir = snapshotDir(repository, group, name);
  const m = await readManifest(dir);
  if (!m) {
    if (await exists(path.join(root, '.git'))) {
      // A retried restore whose first attempt finished.
      const loc = await locateWorktree(repository, root);
      return {
        root,
        branch: await gitMaybe(root, [...trustedWorktreeArgs(loc), 'symbolic-ref', '-q', '--short', 'HEAD']),
        head: await git(root, [...trustedWorktreeArgs(loc), 'rev-parse', 'HEAD']),
        durationMs: Date.now() - started,
        alreadyRestored: true,
      };
    }
    throw new SnapshotError(`no snapshot for ${group}/${name}`);
  }
  if (!(await exists(path.join(dir, 'objects')))) throw new SnapshotError(`the snapshot's objects for ${group}/${name} are gone`);
  // A half-done earlier attempt: start over.
  if (await exists(root)) await removeLockedWorktree(repository, root);
  await gitMaybe(repository, ['worktree', 'prune']);
  await fs.mkdir(path.dirname(root), { recursive: true });

  if (m.branchRef) {
    const tip = await gitMaybe(repository, ['rev-parse', '--verify', '--quiet', m.branchRef]);
    if (tip !== m.head) throw new SnapshotError(`branch ${m.branchRef} moved while the sandbox was suspended (${m.head} -> ${tip ?? 'deleted'})`);
    await addWorktree(repository, ['--no-checkout', root, m.branchRef.replace(/^refs\/heads\//, '')]);
  } else {
    await addWorktree(repository, ['--no-checkout', '--detach', root, m.head]);
  }
  const loc = await locateWorktree(repository, root);
  const store = await snapshotStore(loc, dir);
  const wt = (args: string[]) => rawGit(root, [...trustedWorktreeArgs(loc), ...args], store);
  // Working tree (with untracked files) from its tree; then the index as it was staged.
  await wt(['read-tree', m.worktreeTree]);
  // Writing 10,000 files is bound by per-file latency in the kernel, not CPU: parallel
  // checkout workers cut a loaded machine's wake from ~10 s to ~1-3 s (bench/sandbox-service.ts).
  await wt(['-c', `checkout.workers=${CHECKOUT_WORKERS}`, '-c', 'checkout.thresholdForParallelism=64', 'checkout-index', '--all', '--force', '--quiet']);
  await wt(['read-tree', m.indexTree]);
  await wt(['update-index', '-q', '--refresh']).catch(() => undefined); // non-zero while files differ from the index
  if (m.archived.length > 0) await run('tar', ['-C', root, '-xpf', path.join(dir, 'ignored.tar')]);
  if (opts.templateIgnored && m.fromTemplate.length > 0) await copyIgnoredFiles(repository, root);

  await fs.rm(dir, { recursive: true, force: true });
  await fs.rmdir(path.dirname(dir)).catch(() => undefined);
  return {
    root,
    branch: m.branchRef?.replace(/^refs\/heads\//, ''),
    head: m.head,
    durationMs: Date.now() - started,
    alreadyRestored: false,
  };
}

/** Drops a snapshot (the sandbox was terminated while suspended). Idempotent. */
export async function deleteLocalSnapshot(root: string): Promise<void> {
  const { repository, group, name } = parseRoot(root);
  // Snapshots of earlier versions lived under a ref in the repository.
  await gitMaybe(repository, ['update-ref', '-d', snapshotRefName(group, name)]);
  const dir = snapshotDir(repository, group, name);
  await fs.rm(dir, { recursive: true, force: true });
  await fs.rmdir(path.dirname(dir)).catch(() => undefined);
}

export type LocalLiveness = { alive: true } | { alive: false; reason: 'directory_removed' | 'worktree_unregistered'; detail: string };

/**
 * Is the worktree at `root` still there? A few syscalls, no git process: the directory, its
 * `.git` file, and the registration that file points to.
 */
export async function probeLocal(root: string): Promise<LocalLiveness> {
  const stat = await fs.stat(root).catch(() => undefined);
  if (!stat?.isDirectory()) return { alive: false, reason: 'directory_removed', detail: `${root} no longer exists` };
  const dotGit = await fs.readFile(path.join(root, '.git'), 'utf8').catch(() => undefined);
  const gitdir = dotGit?.match(/^gitdir: (.+)$/m)?.[1]?.trim();
  if (!gitdir) return { alive: false, reason: 'worktree_unregistered', detail: `${root}/.git is missing` };
  const registered = await fs.stat(path.resolve(root, gitdir)).catch(() => undefined);
  if (!registered) return { alive: false, reason: 'worktree_unregistered', detail: `git no longer knows the worktree at ${root}` };
  return { alive: true };
}
