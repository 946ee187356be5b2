/**
 * Bubblewrap confinement for local sandboxes: every command sees the whole filesystem
 * read-only and may write only to its worktree, to the few parts of the repository's git
 * directory a commit on its own branch needs, and to a private /tmp.
 *
 * Layout (in this order; later mounts win):
 *
 *   bwrap --ro-bind / /                       everything read-only
 *         --dev /dev --proc /proc             private /dev (with /dev/shm) and /proc
 *         --tmpfs /tmp                        private, empty /tmp
 *         --ro-bind <repo> <repo>             only when the repository lives under /tmp
 *         --ro-bind <common> <common>         (the tmpfs would hide it otherwise)
 *         --tmpfs <hidden>...                 optional: hide secrets (~/.ssh, ...)
 *         --bind <worktree> <worktree>        the sandbox itself, writable
 *         --bind <common>/worktrees/<id> ...  this worktree's HEAD, index, logs/HEAD
 *         --bind <common>/objects ...         new objects
 *         --bind <common>/refs/heads/<branch dir> ...        the branch ref (+ .lock)
 *         --bind <common>/logs/refs/heads/<branch dir> ...   the branch reflog
 *         --bind <writable>...                optional extra writable paths
 *         --unshare-pid --unshare-ipc [--unshare-net]
 *         --die-with-parent --new-session
 *         --chdir <cwd> -- <command> <args...>
 *
 * Every path comes from trusted places (the repository, Slipway's own state), never from
 * files inside the worktree, which the agent controls.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { isInside } from './paths';

const execFileAsync = promisify(execFile);

export interface BubblewrapConfinement {
  kind: 'bubblewrap';
  /** False: the sandbox gets its own network namespace with only a loopback device. */
  network: boolean;
  /**
   * Extra absolute paths the command may write (agent state such as ~/.claude). A missing
   * path is created as a directory; a file must exist to be bound.
   */
  writable?: string[];
  /** Absolute paths replaced by an empty tmpfs (for example ~/.ssh, ~/.aws); missing ones are skipped. */
  hidden?: string[];
  /**
   * Absolute paths kept visible, read-only, although they live under /tmp (which the sandbox
   * replaces with a private one): the objective folder with its script agents. Missing ones are skipped.
   */
  readable?: string[];
  /** The bwrap executable; default: `bwrap` found on PATH. */
  bwrapPath?: string;
}

export const BWRAP_MISSING_MESSAGE = 'bubblewrap (bwrap) is not installed; install it with `apt-get install bubblewrap`';

export class BubblewrapMissingError extends Error {
  constructor() {
    super(BWRAP_MISSING_MESSAGE);
    this.name = 'BubblewrapMissingError';
  }
}

/** Finds an executable on PATH (or checks an explicit path). */
export function findExecutable(name: string, envPath = process.env.PATH ?? ''): string | undefined {
  const candidates = name.includes('/') ? [name] : envPath.split(path.delimiter).filter(Boolean).map((d) => path.join(d, name));
  for (const candidate of candidates) {
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      /* keep looking */
    }
  }
  return undefined;
}

/** The bwrap executable, or BubblewrapMissingError. */
export function requireBwrap(bwrapPath?: string): string {
  const found = findExecutable(bwrapPath ?? 'bwrap');
  if (!found) throw new BubblewrapMissingError();
  return found;
}

const probes = new Map<string, Promise<void>>();
/**
 * Starts one trivial sandbox so a host where bwrap exists but cannot work (user namespaces
 * disabled, AppArmor restrictions) fails with a clear message instead of on every command.
 */
export function probeBwrap(bwrap: string): Promise<void> {
  let probe = probes.get(bwrap);
  if (!probe) {
    probe = execFileAsync(bwrap, ['--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--unshare-pid', '--die-with-parent', '--', 'true'], {
      encoding: 'utf8',
      timeout: 30_000,
    }).then(
      () => undefined,
      (e: NodeJS.ErrnoException & { stderr?: string }) => {
        probes.delete(bwrap);
        if (e.code === 'ENOENT') throw new BubblewrapMissingError();
        throw new Error(
          `bubblewrap (bwrap) is installed but cannot start a sandbox: ${(e.stderr ?? e.message).trim()}` +
            ' (unprivileged user namespaces may be disabled: check kernel.unprivileged_userns_clone or AppArmor\'s kernel.apparmor_restrict_unprivileged_userns)',
        );
      },
    );
    probes.set(bwrap, probe);
  }
  return probe;
}

/** What a confined command may see and write, all absolute real paths. */
export interface ConfinementLayout {
  worktree: string;
  repository: string;
  commonDir: string;
  /** `<common>/worktrees/<id>`: HEAD, index, logs/HEAD, COMMIT_EDITMSG of this worktree. */
  worktreeGitDir: string;
  branch?: string;
  /** Writable parts of the git common dir. */
  gitWritable: string[];
}

async function realDir(p: string): Promise<string> {
  await fs.mkdir(p, { recursive: true });
  return fs.realpath(p);
}

/**
 * Works out the layout for a worktree at `worktree` of `repository`, on `branch` (trusted:
 * from Slipway's state, not from the worktree's own HEAD, which the agent could point at
 * `main`).
 */
export async function confinementLayout(repository: string, worktree: string, branch: string | undefined): Promise<ConfinementLayout> {
  const repo = await fs.realpath(repository);
  const root = await fs.realpath(worktree);
  const { stdout } = await execFileAsync('git', ['-C', repo, 'rev-parse', '--git-common-dir'], { encoding: 'utf8' });
  const commonDir = await fs.realpath(path.resolve(repo, stdout.trim()));

  // The worktree's admin folder is the one whose `gitdir` file names <worktree>/.git.
  // Those files live in the common dir; each agent can only write its own.
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
      matches.length === 0
        ? `${root} is not a registered worktree of ${repo}`
        : `several worktree folders of ${repo} claim ${root}: ${matches.join(', ')}`,
    );
  }
  const worktreeGitDir = await fs.realpath(matches[0]);

  const gitWritable = [worktreeGitDir, await fs.realpath(path.join(commonDir, 'objects'))];
  const reftable = path.join(commonDir, 'reftable');
  if (await fs.stat(reftable).then((s) => s.isDirectory(), () => false)) {
    // The reftable backend keeps every ref in one folder: there is no finer grain.
    gitWritable.push(await fs.realpath(reftable));
  } else if (branch) {
    // `git commit` writes refs/heads/<branch> through <branch>.lock in the same folder, and
    // appends to logs/refs/heads/<branch>. A bind of the file alone cannot be renamed over,
    // so the branch's folder is bound: branches sharing it (slipway/<objective>/...) are
    // writable too, the user's branches outside it are not.
    const branchDir = path.dirname(branch);
    gitWritable.push(await realDir(path.join(commonDir, 'refs', 'heads', branchDir)));
    gitWritable.push(await realDir(path.join(commonDir, 'logs', 'refs', 'heads', branchDir)));
  }
  for (const p of gitWritable) {
    if (!isInside(commonDir, p)) throw new Error(`refusing to make ${p} writable: it is outside ${commonDir}`);
  }
  return { worktree: root, repository: repo, commonDir, worktreeGitDir, branch, gitWritable };
}

const PRIVATE_TMP = '/tmp';

/** The extra writable and hidden paths, checked and resolved (bwrap cannot mount on missing paths in a read-only tree). */
export async function resolveExtraPaths(confinement: BubblewrapConfinement): Promise<{ writable: string[]; hidden: string[]; readable: string[] }> {
  const writable: string[] = [];
  for (const p of confinement.writable ?? []) {
    const abs = absolute(p, 'writable');
    if (!(await fs.lstat(abs).then(() => true, () => false))) await fs.mkdir(abs, { recursive: true });
    writable.push(await fs.realpath(abs));
  }
  const hidden: string[] = [];
  for (const p of confinement.hidden ?? []) {
    const real = await fs.realpath(absolute(p, 'hidden')).catch(() => undefined);
    if (real) hidden.push(real);
  }
  const readable: string[] = [];
  for (const p of confinement.readable ?? []) {
    const real = await fs.realpath(absolute(p, 'readable')).catch(() => undefined);
    if (real) readable.push(real);
  }
  return { writable, hidden, readable };
}

/** The bwrap arguments (everything before the command) for a layout. */
export function bwrapArgs(
  layout: ConfinementLayout,
  confinement: BubblewrapConfinement,
  cwd: string,
  extra: { writable: string[]; hidden: string[]; readable?: string[] } = {
    writable: confinement.writable ?? [],
    hidden: confinement.hidden ?? [],
    readable: confinement.readable ?? [],
  },
): string[] {
  const args = ['--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--tmpfs', PRIVATE_TMP];
  // The private /tmp hides whatever lived there; bring the repository back, read-only.
  const underTmp = (p: string) => isInside(PRIVATE_TMP, p);
  const readOnly = [layout.repository, layout.commonDir, ...(extra.readable ?? []).map((p) => absolute(p, 'readable'))].filter(underTmp);
  for (const p of dedupe(readOnly)) args.push('--ro-bind', p, p);
  for (const p of extra.hidden) args.push('--tmpfs', absolute(p, 'hidden'));
  const writable = [layout.worktree, ...layout.gitWritable, ...extra.writable.map((p) => absolute(p, 'writable'))];
  for (const p of dedupe(writable)) args.push('--bind', p, p);
  args.push('--unshare-pid', '--unshare-ipc');
  if (!confinement.network) args.push('--unshare-net');
  args.push('--die-with-parent', '--new-session', '--chdir', cwd);
  return args;
}

function absolute(p: string, what: string): string {
  if (!path.isAbsolute(p)) throw new Error(`confinement.${what} paths must be absolute: ${p}`);
  return path.normalize(p);
}

function dedupe(paths: string[]): string[] {
  return [...new Set(paths)];
}

/**
 * A confined command can rewrite `<worktree>/.git` and its admin folder's `commondir`,
 * `gitdir` and `config.worktree`. Slipway later runs git in the worktree outside the
 * sandbox, so a tampered link could point that git at a config the agent wrote
 * (core.fsmonitor, core.hooksPath: code execution outside the sandbox). Snapshot them
 * before a command and put them back after.
 */
export async function snapshotGitLinks(layout: ConfinementLayout): Promise<() => Promise<void>> {
  const files = [
    path.join(layout.worktreeGitDir, 'commondir'),
    path.join(layout.worktreeGitDir, 'gitdir'),
    path.join(layout.worktreeGitDir, 'config.worktree'),
  ];
  const saved = await Promise.all(files.map((f) => fs.readFile(f).catch(() => undefined)));
  const dotGit = path.join(layout.worktree, '.git');
  const dotGitContent = `gitdir: ${layout.worktreeGitDir}\n`;
  return async () => {
    for (const [i, file] of files.entries()) {
      const before = saved[i];
      const now = await fs.readFile(file).catch(() => undefined);
      if (before === undefined && now === undefined) continue;
      if (before !== undefined && now !== undefined && before.equals(now)) continue;
      await fs.rm(file, { recursive: true, force: true });
      if (before !== undefined) await fs.writeFile(file, before);
    }
    const stat = await fs.lstat(dotGit).catch(() => undefined);
    const current = stat?.isFile() ? await fs.readFile(dotGit, 'utf8') : undefined;
    const named = current === undefined ? undefined : path.resolve(layout.worktree, current.replace(/^gitdir:\s*/, '').trim());
    const namedReal = named === undefined ? undefined : await fs.realpath(named).catch(() => named);
    if (namedReal !== layout.worktreeGitDir) {
      await fs.rm(dotGit, { recursive: true, force: true });
      await fs.writeFile(dotGit, dotGitContent);
    }
  };
}
