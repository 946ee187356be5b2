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
 * Slipway's own record of each sandbox (branch, state of creation, confinement) lives in
 * `<repo>/.slipway/sandboxes/<group>/<name>.json`, outside every worktree, so a confined
 * agent can neither read it as part of its tree nor change it. A sandbox created with its own
 * confinement (the objective's `sandbox:` section) keeps it in that record, and every later exec
 * in it (agents, gates, setup) looks it up there.
 *
 * Create takes, in order: a ready entry of the warm pool (pool.ts), else a cold create whose
 * ignored files come from the prepared template (template.ts) when it fits, else from the
 * checkout; then project setup (setup.ts) runs, under the sandbox's confinement.
 */
import { ensureDir, writeJsonAtomic } from '../../lib/atomic-write';
import { promises as fs, constants } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR, WORKTREES_DIR } from '../../core/ids';
import { PoolFills } from './pool-fills';
import { branchExists, ensureSlipwayExcluded, git, gitMaybe, listWorktrees, resolveCommit, retryHalfAddedWorktree, GIT_HARDENING, GIT_TIMEOUT_MS } from '../../lib/git';
import type { RunResult } from '../process';
import { requireBwrap, type BubblewrapConfinement } from './bubblewrap';
import { listIgnoredToCopy, type CopyMethod } from './copy-ignored';
import type { Duplex } from 'node:stream';
import { connectSandboxPort, PortUnreachableError } from './port-relay';
import { combineConfinement, confinedCommand, execInWorktree, feedPipes, type ExecTarget } from './exec';
import { openSessionInWorktree } from './session';
import { fingerprint, setupHash, trackedLockfiles } from './fingerprint';
import { deleteLocalSnapshot, probeLocal, restoreLocal, SnapshotError, suspendLocal } from './local-snapshot';
import { NOFOLLOW, PathEscapeError, resolveInside } from './paths';
import { deleteSandboxFile, listSandboxDir, openSandboxFile, readSandboxFile, writeSandboxFile, type FileEntry, type FileIoOptions, type OpenedFile } from './file-io';
import { claimPoolEntry, fillPool, poolKey, type PoolSpec } from './pool';
import { populateWorktree } from './populate';
import { SANDBOX_BASE_ENV, type ExecRequest, type ProjectSetup, type SandboxCreateRequest, type SandboxHandle, type SandboxProvider, type SandboxSession, type SessionRequest } from './provider';
import { runProjectSetup, type SetupResult } from './setup';
import { usableTemplate, type TemplateManifest } from './template';
import { adminDirOf, removeLockedWorktree } from './worktree-admin';
import { diskImagePath, ensureDiskMounted, isMountPoint, moveOntoNewDisk, mountNewDisk, releaseDisk, requireDiskQuota } from './disk';
import { adoptSandboxGitWorktree, discardAgentHome, discardSandboxGit, importPack, locateWorktree, OBJECT_ID, sandboxAgentHome, trustedWorktreeArgs } from './sandbox-git';

/** The environment of Slipway's own git commands inside a sandbox: nothing of the worker's. */
export const SLIPWAY_GIT_ENV: Record<string, string> = { ...SANDBOX_BASE_ENV, HOME: '/tmp', GIT_TERMINAL_PROMPT: '0' };

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
  /** Where background warm-pool fills report problems (default: console.warn). */
  log?: (line: string) => void;
  /** Refill the warm pool in the background after creates (default true; tests turn it off). */
  backgroundFill?: boolean;
}

export interface SandboxRecord {
  version: 1;
  sandboxId: string;
  group: string;
  name: string;
  branch: string;
  baseCommit: string;
  /** `creating` until the worktree, its copied files and project setup are complete. */
  state: 'creating' | 'ready';
  createdAt: string;
  ignoredCopy?: SandboxHandle['ignoredCopy'];
  /** The sandbox's own confinement: every exec in it runs under it. */
  confinement?: BubblewrapConfinement;
  /** Hash of the project setup commands it was made with. */
  setupHash?: string;
  origin?: 'pool' | 'cold' | 'template';
  /** The warm-pool entry or template it came from. */
  poolEntry?: string;
  template?: string;
  setup?: SetupResult;
}

async function realpathOrSelf(p: string): Promise<string> {
  return fs.realpath(p).catch(() => p);
}

export function localSandboxRoot(repository: string, group: string, name: string): string {
  return path.join(repository, WORKTREES_DIR, group, name);
}

export function sandboxRecordPath(repo: string, group: string, name: string): string {
  return path.join(repo, SANDBOX_STATE_DIR, group, `${name}.json`);
}
const recordPath = sandboxRecordPath;

/** `<repo>/.slipway/worktrees/<group>/<name>` → its parts, or undefined for other paths. */
export function parseSandboxRoot(root: string): { repository: string; group: string; name: string } | undefined {
  const name = path.basename(root);
  const groupDir = path.dirname(root);
  const worktreesDir = path.dirname(groupDir);
  const slipwayDir = path.dirname(worktreesDir);
  if (path.join(path.basename(slipwayDir), path.basename(worktreesDir)) !== path.normalize(WORKTREES_DIR)) return undefined;
  return { repository: path.dirname(slipwayDir), group: path.basename(groupDir), name };
}

export async function readSandboxRecord(file: string): Promise<SandboxRecord | undefined> {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8')) as SandboxRecord;
  } catch {
    return undefined;
  }
}
const readRecord = readSandboxRecord;

const writeRecord = (file: string, record: SandboxRecord) => writeJsonAtomic(file, record, { mkdir: true });

const hasSetup = (setup: ProjectSetup | undefined): setup is ProjectSetup => !!setup && (setup.commands.length > 0 || setup.verify.length > 0);

/** Where new sandboxes at a base commit get their ignored files, and the fingerprint pool entries must match. */
interface Source {
  dir: string;
  template?: TemplateManifest;
  fingerprint: string;
}

export class LocalSandboxProvider implements SandboxProvider {
  readonly kind = 'local';
  readonly hostBound = true;
  private readonly copyIgnored: boolean;
  private readonly confinement?: BubblewrapConfinement;
  private readonly copyMethod?: CopyMethod;
  private readonly log: (line: string) => void;
  private readonly fills = new PoolFills();
  private readonly backgroundFill: boolean;

  constructor(options: LocalSandboxOptions = {}) {
    this.copyIgnored = options.copyIgnored ?? true;
    this.copyMethod = options.copyMethod;
    this.log = options.log ?? ((line) => console.warn(line));
    this.backgroundFill = options.backgroundFill ?? true;
    if (options.confinement) {
      if (options.confinement.kind !== 'bubblewrap') throw new Error(`unknown confinement kind "${(options.confinement as { kind: string }).kind}"`);
      this.confinement = options.confinement;
      requireBwrap(options.confinement.bwrapPath);
    }
  }

  /** True when every command runs under bubblewrap (the provider's own setting). */
  get confined(): boolean {
    return this.confinement !== undefined;
  }

  async create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    const started = Date.now();
    const repo = await realpathOrSelf(req.repository);
    const root = localSandboxRoot(repo, req.group, req.name);
    const recordFile = recordPath(repo, req.group, req.name);
    // The reads side by side: each git call is a process, and a create is on every stream's path.
    const [worktrees, baseCommit, record, branchExisted] = await Promise.all([
      listWorktrees(repo),
      resolveCommit(repo, req.base),
      readRecord(recordFile),
      branchExists(repo, req.branch),
      ensureSlipwayExcluded(repo),
    ]);
    const existing = await findWorktree(worktrees, root);
    // Refuse early, with the install hint, rather than on the first command.
    if (req.confinement) requireBwrap(req.confinement.bwrapPath);
    const diskBytes = combineConfinement(this.confinement, req.confinement)?.limits?.diskBytes;
    // A disk limit this host cannot enforce is an error naming the field, before anything is made.
    if (diskBytes !== undefined) await requireDiskQuota();
    const image = diskImagePath(repo, req.group, req.name);

    if (existing && !existing.prunable) {
      if (record?.state !== 'creating') {
        if (existing.branch !== req.branch) {
          throw new Error(`worktree ${root} exists on branch ${existing.branch ?? '(detached)'}, expected ${req.branch}`);
        }
        if (!record) {
          // Made before Slipway kept records: adopt it.
          await writeRecord(recordFile, { version: 1, sandboxId: req.sandboxId, group: req.group, name: req.name, branch: req.branch, baseCommit, state: 'ready', createdAt: new Date().toISOString() });
        }
        return { sandboxId: req.sandboxId, provider: this.kind, root, branch: req.branch, baseCommit, headCommit: existing.head, reused: true };
      }
      // A previous attempt died before finishing (copying ignored files, setup, a pool claim):
      // nobody has used this worktree yet, so start it again. The branch stays.
      await gitMaybe(repo, ['worktree', 'remove', '--force', '--force', existing.path]);
    }

    const copyIgnored = req.copyIgnored ?? this.copyIgnored;
    const setup = hasSetup(req.setup) ? req.setup : undefined;
    // Pool entries are moved into place by rename, which a mounted disk refuses (disk.ts).
    const poolSize = diskBytes === undefined ? req.warmPool ?? 0 : 0;
    const confinement = combineConfinement(this.confinement, req.confinement);
    const base: Omit<SandboxRecord, 'state'> = {
      version: 1,
      sandboxId: req.sandboxId,
      group: req.group,
      name: req.name,
      branch: req.branch,
      baseCommit,
      createdAt: new Date().toISOString(),
      ...(req.confinement ? { confinement: req.confinement } : {}),
      ...(setup ? { setupHash: setupHash(setup) } : {}),
    };
    await writeRecord(recordFile, { ...base, state: 'creating' });
    const sourcing = copyIgnored || setup || poolSize > 0 ? this.sourceFor(repo, baseCommit, { setup, copyIgnored }) : undefined;
    // Awaited below (with the worktree's add on the cold path); never left to reject unheard.
    sourcing?.catch(() => undefined);
    // Leftovers of a crashed attempt (a folder, git's record of it) go first.
    if (existing || (await pathExists(root))) await releaseDisk(image, root).then(() => clearHalfMade(repo, root));
    const poolSpec = (src: Source): PoolSpec => poolSpecFor(baseCommit, src, { copyIgnored, setup, confinement, copyMethod: this.copyMethod });

    // 1. The warm pool: a ready worktree at this base, moved into place and put on the branch.
    if (poolSize > 0 && !branchExisted) {
      const source = (await sourcing)!;
      const claimed = await claimPoolEntry(repo, { baseCommit, fingerprint: source.fingerprint }, root);
      if (claimed) {
        // Plumbing rather than `checkout -b` (which re-reads the whole tree): the entry is at the
        // base already, so only the branch is made (create-only) and HEAD pointed at it.
        const loc = await locateWorktree(repo, root);
        await git(root, [...trustedWorktreeArgs(loc), 'update-ref', '--create-reflog', '-m', `branch: Created from ${baseCommit} (warm pool)`, `refs/heads/${req.branch}`, baseCommit, '']);
        await git(root, [...trustedWorktreeArgs(loc), 'symbolic-ref', '-m', `checkout: moving from ${baseCommit} to ${req.branch}`, 'HEAD', `refs/heads/${req.branch}`]);
        // The entry's setup ran in a git directory of its own; the sandbox starts a fresh one.
        await discardSandboxGit(repo, root);
        await discardAgentHome(repo, root);
        await writeRecord(recordFile, { ...base, state: 'ready', origin: 'pool', poolEntry: claimed.id, ...(claimed.template ? { template: claimed.template } : {}) });
        this.scheduleFill(repo, poolSpec(source), poolSize);
        return {
          sandboxId: req.sandboxId,
          provider: this.kind,
          root,
          branch: req.branch,
          baseCommit,
          headCommit: baseCommit,
          reused: false,
          origin: 'pool',
          durationMs: Date.now() - started,
        };
      }
    }

    // 2. Cold: a new worktree, ignored files from the template or the checkout, then setup.
    // The root itself, not only its group folder: a destroy removes the group folder once it is
    // empty, and an empty root in it keeps it (git adds a worktree into an empty folder).
    await ensureDir(root);
    if (diskBytes !== undefined) await mountNewDisk(image, root, diskBytes);
    // Added without a checkout: the checkout and the copy of ignored files then run side by side.
    // `worktree add -b` makes the branch before it reads the other worktrees' records, so a try
    // that failed on a half-added one may have left the branch: the next try takes it.
    // The source and its listing of ignored files are read while the worktree is added.
    const listing = copyIgnored ? sourcing?.then((src) => listIgnoredToCopy(src.dir, { useIncludeFile: src.template === undefined })) : undefined;
    listing?.catch(() => undefined);
    await retryHalfAddedWorktree(async (attempt) => {
      if (branchExisted || (attempt > 1 && (await branchExists(repo, req.branch)))) {
        return git(repo, ['worktree', 'add', '-q', '--no-checkout', root, req.branch]);
      }
      return git(repo, ['worktree', 'add', '-q', '--no-checkout', '-b', req.branch, root, baseCommit]);
    });
    const source = await sourcing;
    // A sandbox made again at this place starts with a fresh private git directory.
    await discardSandboxGit(repo, root);
    await discardAgentHome(repo, root);
    let ignoredCopy: SandboxHandle['ignoredCopy'];
    const copied = await populateWorktree({
      repo,
      root,
      commit: branchExisted ? req.branch : baseCommit,
      source: copyIgnored ? source?.dir : undefined,
      useIncludeFile: source?.template === undefined,
      method: this.copyMethod,
      ...(listing ? { listing } : {}),
    });
    if (copied) ignoredCopy = { ...copied, paths: copied.paths.length };
    let setupResult: SetupResult | undefined;
    if (setup) {
      setupResult = await runProjectSetup((r) => execInWorktree({ root, repository: repo, branch: req.branch, confinement }, r), setup, {
        signal: req.signal,
        onProgress: req.onProgress,
        skipFirstCommands: source?.template !== undefined,
      });
    }
    // A branch made here without setup is at the base; one that existed, or setup may have moved, is read.
    const headCommit = branchExisted || setup ? await git(root, [...trustedWorktreeArgs(await locateWorktree(repo, root)), 'rev-parse', 'HEAD']) : baseCommit;
    const origin = source?.template ? 'template' : 'cold';
    await writeRecord(recordFile, {
      ...base,
      state: 'ready',
      origin,
      ...(source?.template ? { template: source.template.id } : {}),
      ...(ignoredCopy ? { ignoredCopy } : {}),
      ...(setupResult ? { setup: setupResult } : {}),
    });
    if (poolSize > 0 && source) this.scheduleFill(repo, poolSpec(source), poolSize);
    return {
      sandboxId: req.sandboxId,
      provider: this.kind,
      root,
      branch: req.branch,
      baseCommit,
      headCommit,
      reused: false,
      ignoredCopy,
      origin,
      ...(setupResult ? { setup: setupResult } : {}),
      durationMs: Date.now() - started,
    };
  }

  /** The template (when it fits this base and setup) or the checkout, and the pool fingerprint. */
  private async sourceFor(repo: string, baseCommit: string, opts: { setup?: ProjectSetup; copyIgnored: boolean }): Promise<Source> {
    const tracked = await trackedLockfiles(repo, baseCommit);
    const template = await usableTemplate(repo, baseCommit, { ...opts, tracked });
    const dir = template?.root ?? repo;
    const fp = await fingerprint(repo, baseCommit, { ...opts, source: dir, tracked });
    return { dir, ...(template ? { template } : {}), fingerprint: fp.hash };
  }

  /**
   * Fills the warm pool for a base (and these settings) up to `size` now, and waits. Creates do
   * this in the background by themselves; this is for pre-warming (objective start, benchmarks).
   */
  async fillWarmPool(req: Pick<SandboxCreateRequest, 'repository' | 'base' | 'copyIgnored' | 'setup' | 'confinement'> & { size: number; signal?: AbortSignal }): Promise<{ made: number }> {
    const repo = await realpathOrSelf(req.repository);
    await ensureSlipwayExcluded(repo);
    const baseCommit = await resolveCommit(repo, req.base);
    const copyIgnored = req.copyIgnored ?? this.copyIgnored;
    const setup = hasSetup(req.setup) ? req.setup : undefined;
    const source = await this.sourceFor(repo, baseCommit, { setup, copyIgnored });
    const confinement = combineConfinement(this.confinement, req.confinement);
    // Sandboxes with a disk of their own are never taken from the pool (disk.ts): nothing to warm.
    if (confinement?.limits?.diskBytes !== undefined) return { made: 0 };
    return fillPool(
      repo,
      poolSpecFor(baseCommit, source, { copyIgnored, setup, confinement, copyMethod: this.copyMethod }),
      req.size,
      { signal: req.signal },
    );
  }

  /** Starts a background fill (one per repository and key in this process; a fill asked for while one runs runs again after it). */
  scheduleWarmPool(req: Parameters<LocalSandboxProvider['fillWarmPool']>[0]): void {
    const key = `${req.repository}\0${req.base}`;
    this.background(key, () => this.fillWarmPool(req).then(() => undefined));
  }

  private scheduleFill(repo: string, spec: PoolSpec, size: number): void {
    const key = `${repo}\0${poolKey(spec.baseCommit, spec.fingerprint)}`;
    this.background(key, () => fillPool(repo, spec, size).then(() => undefined));
  }

  private background(key: string, work: () => Promise<void>): void {
    if (!this.backgroundFill) return;
    void this.fills.run(key, () =>
      work().then(
        () => 0,
        (e: Error) => {
          this.log(`slipway: warm pool fill failed: ${e.message}`);
          return 0;
        },
      ),
    );
  }

  /** Resolves once no background pool fill runs in this process (tests, benchmarks, shutdown). */
  async whenPoolIdle(): Promise<void> {
    await this.fills.whenIdle();
  }

  async exec(handle: Pick<SandboxHandle, 'root'>, req: ExecRequest): Promise<RunResult> {
    return execInWorktree(await this.execTarget(handle.root), req);
  }

  async openSession(handle: Pick<SandboxHandle, 'root'>, req: SessionRequest): Promise<SandboxSession> {
    return openSessionInWorktree(await this.execTarget(handle.root), req);
  }

  async connectPort(handle: Pick<SandboxHandle, 'root'>, port: number): Promise<Duplex> {
    const target = await this.execTarget(handle.root);
    // Unconfined commands share the host's network: 127.0.0.1 there is the host's loopback.
    if (!target.confinement) throw new PortUnreachableError(port, 'only confined sandboxes have a network of their own');
    return connectSandboxPort(target.root, port);
  }

  async agentHome(handle: Pick<SandboxHandle, 'root'>): Promise<string | undefined> {
    const target = await this.execTarget(handle.root);
    if (!target.confinement || !target.repository) return undefined;
    const loc = await locateWorktree(target.repository, target.root);
    return sandboxAgentHome(loc.repository, loc.worktree);
  }

  /**
   * Where and how a command runs: the sandbox's confinement from Slipway's record (combined with
   * the provider's own), the branch it may move from the record and the repository, never from
   * the worktree.
   */
  private async execTarget(root: string): Promise<ExecTarget> {
    const real = await realpathOrSelf(root);
    const parsed = parseSandboxRoot(real);
    const record = parsed ? await readRecord(recordPath(parsed.repository, parsed.group, parsed.name)) : undefined;
    const confinement = combineConfinement(this.confinement, record?.confinement);
    // After a reboot the image is there but no longer mounted: the files are on it.
    if (parsed && confinement?.limits?.diskBytes !== undefined) await ensureDiskMounted(diskImagePath(parsed.repository, parsed.group, parsed.name), real);
    if (!confinement) return { root };
    if (!parsed) throw new Error(`confined commands need a Slipway sandbox root (<repo>/${WORKTREES_DIR}/<group>/<name>), got ${root}`);
    let branch = record?.branch;
    if (!branch) {
      // No record (made by an older Slipway): fall back to the branch git reports.
      const entry = await findWorktree(await listWorktrees(parsed.repository), real);
      branch = entry?.branch;
    }
    return { root: real, repository: parsed.repository, branch, confinement };
  }

  // Race-free (descriptor-relative) file I/O: see file-io.ts.
  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<Buffer> {
    return readSandboxFile(handle.root, file, opts);
  }

  async openFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<OpenedFile> {
    return openSandboxFile(handle.root, file, opts);
  }

  async listFiles(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<FileEntry[]> {
    return listSandboxDir(handle.root, file, opts);
  }

  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string, opts: FileIoOptions = {}): Promise<void> {
    return writeSandboxFile(handle.root, file, content, opts);
  }

  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<void> {
    return deleteSandboxFile(handle.root, file, opts);
  }

  async destroy({ repository, root }: { repository: string; root: string }): Promise<void> {
    const repo = await realpathOrSelf(repository);
    const where = parseSandboxRoot(path.resolve(root));
    // The disk first: a mount point cannot be moved aside. Its files go with the image.
    if (where) await releaseDisk(diskImagePath(repo, where.group, where.name), path.resolve(root));
    // Moved aside, deleted by Slipway and pruned: `git worktree remove` would read the worktree's
    // own (sandbox-controlled) `.git` file and could run git in it.
    await removeLockedWorktree(repo, root);
    await discardSandboxGit(repo, path.resolve(root));
    await discardAgentHome(repo, path.resolve(root));
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
  async suspend(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }) {
    const target = await this.execTarget(handle.root).catch(() => undefined);
    if (target?.confinement && target.repository && (await pathExists(path.join(target.root, '.git')))) {
      // A confined sandbox's index lives in its private git directory, which suspend keeps as it
      // is; an unresolved conflict there could not be restored faithfully, so suspend refuses.
      const check = await execInWorktree(target, { command: 'git', args: [...GIT_HARDENING, 'write-tree'], env: SLIPWAY_GIT_ENV, inheritEnv: false, timeoutMs: GIT_TIMEOUT_MS });
      if (check.exitCode !== 0) throw new SnapshotError(`the index cannot be captured (unresolved merge?): ${check.stderr.trim()}`);
    }
    const suspended = await suspendLocal(handle.root, options);
    // The snapshot holds the files; the disk (unmounted with the worktree) is given back.
    const parsed = parseSandboxRoot(path.resolve(handle.root));
    if (parsed) await releaseDisk(diskImagePath(parsed.repository, parsed.group, parsed.name), path.resolve(handle.root));
    return suspended;
  }

  async restore(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }) {
    const parsed = parseSandboxRoot(path.resolve(handle.root));
    const record = parsed ? await readRecord(recordPath(parsed.repository, parsed.group, parsed.name)) : undefined;
    const diskBytes = combineConfinement(this.confinement, record?.confinement)?.limits?.diskBytes;
    const image = parsed && diskBytes !== undefined ? diskImagePath(parsed.repository, parsed.group, parsed.name) : undefined;
    // A retry after a restore that died moving the files onto the disk: they are on it.
    if (image) await ensureDiskMounted(image, path.resolve(handle.root));
    const restored = await restoreLocal(handle.root, options);
    if (image && !(await isMountPoint(path.resolve(handle.root)))) {
      // Restored as a plain folder; its files move onto a fresh disk of the sandbox's size.
      await moveOntoNewDisk(image, path.resolve(handle.root), diskBytes!);
    }
    const target = await this.execTarget(handle.root);
    if (target.confinement && target.repository && !restored.alreadyRestored) {
      // The sandbox's own git directory kept its commits, index and HEAD through the suspend;
      // only the id of git's record of the worktree may have changed with the new registration.
      await adoptSandboxGitWorktree(await locateWorktree(target.repository, target.root));
    }
    return restored;
  }

  /**
   * Confined: git inside the sandbox packs its HEAD's commits and git outside indexes them into
   * the repository with full checks, then the sandbox's branch (from Slipway's record) moves
   * there. Unconfined: the sandbox shares the repository, so HEAD is read directly.
   */
  async collect(handle: Pick<SandboxHandle, 'root'>, options: { known?: string[]; signal?: AbortSignal } = {}): Promise<{ head: string; imported: boolean }> {
    const target = await this.execTarget(handle.root);
    if (!target.confinement || !target.repository) {
      return { head: await git(handle.root, ['rev-parse', 'HEAD']), imported: false };
    }
    const repo = target.repository;
    const rev = await execInWorktree(target, { command: 'git', args: [...GIT_HARDENING, 'rev-parse', '--verify', '--quiet', 'HEAD^{commit}'], env: SLIPWAY_GIT_ENV, inheritEnv: false, signal: options.signal, timeoutMs: GIT_TIMEOUT_MS });
    const head = rev.stdout.trim();
    if (rev.exitCode !== 0 || !OBJECT_ID.test(head)) throw new Error(`the sandbox at ${handle.root} has no commit at HEAD`);
    const have = (await gitMaybe(repo, ['cat-file', '-e', `${head}^{commit}`])) !== undefined;
    if (!have) {
      const parsed = parseSandboxRoot(target.root);
      const record = parsed ? await readRecord(recordPath(repo, parsed.group, parsed.name)) : undefined;
      const candidates = [record?.baseCommit, target.branch ? await gitMaybe(repo, ['rev-parse', '--verify', '--quiet', `refs/heads/${target.branch}^{commit}`]) : undefined, ...(options.known ?? [])];
      const known: string[] = [];
      for (const c of candidates) if (c && OBJECT_ID.test(c) && !known.includes(c) && (await gitMaybe(repo, ['cat-file', '-e', `${c}^{commit}`])) !== undefined) known.push(c);
      // Packing needs no network: none, so no egress helper to attach and stop.
      const packTarget = { ...target, confinement: { ...target.confinement, network: false } };
      const cmd = await confinedCommand(packTarget, { command: 'sh', args: ['-c', `printf "%s\\n" "$@" | git ${GIT_HARDENING.join(' ')} pack-objects --revs --stdout --quiet`, 'pack', head, ...known.map((k) => `^${k}`)], env: SLIPWAY_GIT_ENV, inheritEnv: false });
      await importPack(repo, { ...cmd, prepare: (child) => feedPipes(child, cmd.pipes) }, { signal: options.signal });
      if ((await gitMaybe(repo, ['cat-file', '-e', `${head}^{commit}`])) === undefined) throw new Error(`the sandbox's pack did not contain ${head}`);
    }
    if (target.branch) await git(repo, ['update-ref', '-m', 'slipway: collected from its sandbox', `refs/heads/${target.branch}`, head]);
    return { head, imported: !have };
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

/**
 * Clears what a crashed create left at `root` (a half-copied folder, or a claimed pool entry whose
 * git record is still locked and points into the pool), then prunes git's stale records.
 */
const pathExists = (p: string) => fs.lstat(p).then(
  () => true,
  () => false,
);

async function clearHalfMade(repo: string, root: string): Promise<void> {
  if (await pathExists(root)) {
    const admin = await adminDirOf(root);
    if (admin) {
      const gitdir = (await fs.readFile(path.join(admin, 'gitdir'), 'utf8').catch(() => '')).trim();
      if (path.resolve(gitdir) !== path.join(root, '.git')) await fs.rm(path.join(admin, 'locked'), { force: true });
    }
    await fs.rm(root, { recursive: true, force: true });
  }
  await git(repo, ['worktree', 'prune']);
}

/** What a pool entry is made of, and must still match to be claimed. */
function poolSpecFor(
  baseCommit: string,
  src: Source,
  opts: { copyIgnored: boolean; setup?: PoolSpec['setup']; confinement?: PoolSpec['confinement']; copyMethod?: PoolSpec['copyMethod'] },
): PoolSpec {
  return {
    baseCommit,
    fingerprint: src.fingerprint,
    source: src.dir,
    ...(src.template ? { template: src.template.id } : {}),
    copyIgnored: opts.copyIgnored,
    ...(opts.setup ? { setup: opts.setup } : {}),
    ...(opts.confinement ? { confinement: opts.confinement } : {}),
    ...(opts.copyMethod ? { copyMethod: opts.copyMethod } : {}),
  };
}
