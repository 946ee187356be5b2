/**
 * Local sandboxes: one git worktree per stream under `<repo>/.slipway/worktrees/<group>/<name>`.
 * The user's checkout is never touched: worktrees are added from refs, and every command
 * runs inside the worktree.
 *
 * On create, the checkout's git-ignored files (node_modules, .env, caches) are copied in
 * with copy-on-write clones where the filesystem has them (see copy-ignored.ts). With
 * `confinement: { kind: 'bubblewrap' }` every command runs under bwrap and can write only
 * to its worktree (see bubblewrap.ts).
 *
 * Slipway's own record of each sandbox (branch, state of creation) lives in
 * `<repo>/.slipway/sandboxes/<group>/<name>.json`, outside every worktree, so a confined
 * agent can neither read it as part of its tree nor change it.
 */
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR, WORKTREES_DIR } from '../../core/ids';
import { branchExists, ensureSlipwayExcluded, git, gitMaybe, listWorktrees, resolveCommit } from '../git';
import { runProcess, type RunResult } from '../process';
import {
  bwrapArgs,
  BubblewrapMissingError,
  confinementLayout,
  probeBwrap,
  requireBwrap,
  resolveExtraPaths,
  snapshotGitLinks,
  type BubblewrapConfinement,
} from './bubblewrap';
import { copyIgnoredFiles, type CopyMethod } from './copy-ignored';
import { deleteLocalSnapshot, probeLocal, restoreLocal, suspendLocal } from './local-snapshot';
import { NOFOLLOW, PathEscapeError, resolveInside } from './paths';
import type { ExecRequest, SandboxCreateRequest, SandboxHandle, SandboxProvider } from './provider';

export type { BubblewrapConfinement } from './bubblewrap';

/** Slipway's records of local sandboxes, one JSON file per sandbox. */
export const SANDBOX_STATE_DIR = `${SLIPWAY_DIR}/sandboxes`;

export interface LocalSandboxOptions {
  /** Copy the checkout's git-ignored files into new worktrees (default true). */
  copyIgnored?: boolean;
  /** Run every command under bubblewrap. */
  confinement?: BubblewrapConfinement;
  /** Force how ignored files are copied (benchmarks, tests); default picks the fastest. */
  copyMethod?: CopyMethod;
}

interface SandboxRecord {
  version: 1;
  sandboxId: string;
  group: string;
  name: string;
  branch: string;
  baseCommit: string;
  /** `creating` until the worktree and its copied files are complete. */
  state: 'creating' | 'ready';
  createdAt: string;
  ignoredCopy?: SandboxHandle['ignoredCopy'];
}

async function realpathOrSelf(p: string): Promise<string> {
  return fs.realpath(p).catch(() => p);
}

export function localSandboxRoot(repository: string, group: string, name: string): string {
  return path.join(repository, WORKTREES_DIR, group, name);
}

function recordPath(repo: string, group: string, name: string): string {
  return path.join(repo, SANDBOX_STATE_DIR, group, `${name}.json`);
}

/** `<repo>/.slipway/worktrees/<group>/<name>` → its parts, or undefined for other paths. */
function parseSandboxRoot(root: string): { repository: string; group: string; name: string } | undefined {
  const name = path.basename(root);
  const groupDir = path.dirname(root);
  const worktreesDir = path.dirname(groupDir);
  const slipwayDir = path.dirname(worktreesDir);
  if (path.join(path.basename(slipwayDir), path.basename(worktreesDir)) !== path.normalize(WORKTREES_DIR)) return undefined;
  return { repository: path.dirname(slipwayDir), group: path.basename(groupDir), name };
}

async function readRecord(file: string): Promise<SandboxRecord | undefined> {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8')) as SandboxRecord;
  } catch {
    return undefined;
  }
}

async function writeRecord(file: string, record: SandboxRecord): Promise<void> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  await fs.writeFile(tmp, JSON.stringify(record, null, 2) + '\n');
  await fs.rename(tmp, file);
}

export class LocalSandboxProvider implements SandboxProvider {
  readonly kind = 'local';
  private readonly copyIgnored: boolean;
  private readonly confinement?: BubblewrapConfinement;
  private readonly bwrap?: string;
  private readonly copyMethod?: CopyMethod;

  constructor(options: LocalSandboxOptions = {}) {
    this.copyIgnored = options.copyIgnored ?? true;
    this.copyMethod = options.copyMethod;
    if (options.confinement) {
      if (options.confinement.kind !== 'bubblewrap') throw new Error(`unknown confinement kind "${(options.confinement as { kind: string }).kind}"`);
      this.confinement = options.confinement;
      this.bwrap = requireBwrap(options.confinement.bwrapPath);
    }
  }

  /** True when commands run under bubblewrap. */
  get confined(): boolean {
    return this.confinement !== undefined;
  }

  async create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    const repo = await realpathOrSelf(req.repository);
    await ensureSlipwayExcluded(repo);
    const root = localSandboxRoot(repo, req.group, req.name);
    const recordFile = recordPath(repo, req.group, req.name);
    const worktrees = await listWorktrees(repo);
    const existing = await findWorktree(worktrees, root);
    const baseCommit = await resolveCommit(repo, req.base);
    const record = await readRecord(recordFile);

    if (existing && !existing.prunable) {
      if (existing.branch !== req.branch) {
        throw new Error(`worktree ${root} exists on branch ${existing.branch ?? '(detached)'}, expected ${req.branch}`);
      }
      if (record?.state !== 'creating') {
        if (!record) {
          // Made before Slipway kept records: adopt it.
          await writeRecord(recordFile, { version: 1, sandboxId: req.sandboxId, group: req.group, name: req.name, branch: req.branch, baseCommit, state: 'ready', createdAt: new Date().toISOString() });
        }
        return { sandboxId: req.sandboxId, provider: this.kind, root, branch: req.branch, baseCommit, headCommit: existing.head, reused: true };
      }
      // A previous attempt died before finishing (copying ignored files, say): nobody has
      // used this worktree yet, so start it again. The branch stays.
      await gitMaybe(repo, ['worktree', 'remove', '--force', '--force', existing.path]);
    }

    await writeRecord(recordFile, {
      version: 1,
      sandboxId: req.sandboxId,
      group: req.group,
      name: req.name,
      branch: req.branch,
      baseCommit,
      state: 'creating',
      createdAt: new Date().toISOString(),
    });
    // A half-made worktree from a crashed attempt: clear it and start again.
    await git(repo, ['worktree', 'prune']);
    await fs.rm(root, { recursive: true, force: true });
    await fs.mkdir(path.dirname(root), { recursive: true });
    if (await branchExists(repo, req.branch)) {
      await git(repo, ['worktree', 'add', root, req.branch]);
    } else {
      await git(repo, ['worktree', 'add', '-b', req.branch, root, baseCommit]);
    }
    let ignoredCopy: SandboxHandle['ignoredCopy'];
    if (req.copyIgnored ?? this.copyIgnored) {
      const copied = await copyIgnoredFiles(repo, root, { method: this.copyMethod });
      ignoredCopy = { ...copied, paths: copied.paths.length };
    }
    const headCommit = await git(root, ['rev-parse', 'HEAD']);
    await writeRecord(recordFile, {
      version: 1,
      sandboxId: req.sandboxId,
      group: req.group,
      name: req.name,
      branch: req.branch,
      baseCommit,
      state: 'ready',
      createdAt: new Date().toISOString(),
      ignoredCopy,
    });
    return { sandboxId: req.sandboxId, provider: this.kind, root, branch: req.branch, baseCommit, headCommit, reused: false, ignoredCopy };
  }

  async exec(handle: Pick<SandboxHandle, 'root'>, req: ExecRequest): Promise<RunResult> {
    const cwd = req.cwd ? await resolveInside(handle.root, req.cwd) : await realpathOrSelf(handle.root);
    const env: NodeJS.ProcessEnv = { ...process.env, ...req.env };
    const common = {
      cwd,
      stdin: req.stdin,
      timeoutMs: req.timeoutMs,
      signal: req.signal,
      onLine: req.onLine,
      maxCaptureBytes: req.maxCaptureBytes,
    };
    if (!this.confinement || !this.bwrap) {
      return runProcess({ ...common, command: req.command, args: req.args, shell: req.shell, env });
    }

    await probeBwrap(this.bwrap);
    const layout = await this.layoutFor(handle.root);
    const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
    // The host's TMPDIR may point somewhere read-only in the sandbox; /tmp is private and writable.
    if (req.env?.TMPDIR === undefined) env.TMPDIR = '/tmp';
    const restoreGitLinks = await snapshotGitLinks(layout);
    try {
      return await runProcess({
        ...common,
        command: this.bwrap,
        args: [...bwrapArgs(layout, this.confinement, cwd, await resolveExtraPaths(this.confinement)), '--', ...inner],
        env,
      });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT' && (e as NodeJS.ErrnoException).path === this.bwrap) throw new BubblewrapMissingError();
      throw e;
    } finally {
      await restoreGitLinks();
    }
  }

  /** Layout of a confined sandbox, from Slipway's record and the repository, never from the worktree. */
  private async layoutFor(root: string) {
    const real = await realpathOrSelf(root);
    const parsed = parseSandboxRoot(real);
    if (!parsed) throw new Error(`confined commands need a Slipway sandbox root (<repo>/${WORKTREES_DIR}/<group>/<name>), got ${root}`);
    const record = await readRecord(recordPath(parsed.repository, parsed.group, parsed.name));
    let branch = record?.branch;
    if (!branch) {
      // No record (made by an older Slipway): fall back to the branch git reports.
      const entry = await findWorktree(await listWorktrees(parsed.repository), real);
      branch = entry?.branch;
    }
    return confinementLayout(parsed.repository, real, branch);
  }

  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string): Promise<Buffer> {
    return fs.readFile(await resolveInside(handle.root, file), { flag: fsFlags.read });
  }

  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string): Promise<void> {
    const target = await resolveInside(handle.root, file);
    await fs.mkdir(path.dirname(target), { recursive: true });
    await fs.writeFile(target, content, { flag: fsFlags.write });
  }

  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string): Promise<void> {
    const target = await resolveInside(handle.root, file, { followFinalSymlink: false });
    if (target === (await realpathOrSelf(handle.root))) throw new PathEscapeError(file, 'the sandbox root itself cannot be deleted');
    await fs.rm(target, { force: true });
  }

  async destroy({ repository, root }: { repository: string; root: string }): Promise<void> {
    const repo = await realpathOrSelf(repository);
    const existing = await findWorktree(await listWorktrees(repo), root);
    if (existing) await gitMaybe(repo, ['worktree', 'remove', '--force', '--force', existing.path]);
    await fs.rm(root, { recursive: true, force: true });
    await git(repo, ['worktree', 'prune']);
    // Remove the group folder once its last sandbox is gone.
    await fs.rmdir(path.dirname(root)).catch(() => undefined);
    const parsed = parseSandboxRoot(path.resolve(root));
    if (parsed) {
      const file = recordPath(repo, parsed.group, parsed.name);
      await fs.rm(file, { force: true });
      await fs.rmdir(path.dirname(file)).catch(() => undefined);
    }
  }

  // Idle offload and the watcher's probe live in local-snapshot.ts.
  suspend(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }) {
    return suspendLocal(handle.root, options);
  }

  restore(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }) {
    return restoreLocal(handle.root, options);
  }

  deleteSnapshot(handle: Pick<SandboxHandle, 'root'>) {
    return deleteLocalSnapshot(handle.root);
  }

  probe(handle: Pick<SandboxHandle, 'root'>) {
    return probeLocal(handle.root);
  }

  async list(repository: string) {
    const repo = await realpathOrSelf(repository);
    const prefix = path.join(repo, WORKTREES_DIR) + path.sep;
    const found = (await listWorktrees(repo)).filter((w) => w.path.startsWith(prefix) && !w.prunable);
    return Promise.all(
      found.map(async (w) => {
        const parsed = parseSandboxRoot(w.path);
        const record = parsed ? await readRecord(recordPath(repo, parsed.group, parsed.name)) : undefined;
        return { root: w.path, branch: w.branch, head: w.head, ...(record ? { sandboxId: record.sandboxId } : {}) };
      }),
    );
  }
}

const fsFlags = {
  // O_NOFOLLOW on the last component: a link swapped in after resolveInside is refused.
  read: constants.O_RDONLY | NOFOLLOW,
  write: constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | NOFOLLOW,
};

async function findWorktree<T extends { path: string }>(worktrees: T[], root: string): Promise<T | undefined> {
  const want = await realpathOrSelf(root);
  for (const w of worktrees) {
    if (w.path === root || w.path === want || (await realpathOrSelf(w.path)) === want) return w;
  }
  return undefined;
}
