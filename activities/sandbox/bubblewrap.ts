/**
 * Bubblewrap confinement for local sandboxes. A confined command sees a minimal system and
 * nothing of the host's state:
 *
 *   bwrap --unshare-user --uid 1000 --gid 1000      an unprivileged uid inside (ADR 0006)
 *         --cap-drop ALL                            no capabilities, even when Slipway runs as root
 *         --ro-bind /usr /usr (+ /bin, /lib*, ...)  the system's programs, read-only
 *         --ro-bind /etc /etc, masks                /etc without shadow, sudoers, ssh host keys
 *         --dev /dev --proc /proc                   private /dev and /proc (PID namespace)
 *         --tmpfs /tmp --tmpfs $HOME --tmpfs /var/tmp   private and empty
 *         --ro-bind <readable>...                   the objective folder (script agents, prompts)
 *         --bind <worktree> /workspace              the sandbox itself, writable, at a fixed path
 *         --bind <sandbox git dir> /run/slipway/git the sandbox's own git state (sandbox-git.ts)
 *         --ro-bind <repo objects> /run/slipway/objects/<n>  the repository's objects, read-only
 *         --ro-bind <trusted link> /workspace/.git  `gitdir: /run/slipway/git/worktrees/<id>`
 *         --bind <writable>...  --tmpfs <hidden>...  explicit extras (agent state such as ~/.claude)
 *         --unshare-pid --unshare-ipc --unshare-uts [--unshare-net]
 *         --remount-ro /                            the root itself holds only mount points
 *         --die-with-parent --new-session --chdir <cwd>
 *         --seccomp <fd>                            the system call filter (seccomp.ts), given by exec.ts
 *         -- <command>
 *
 * The root is an empty tmpfs: the user's checkout, other sandboxes, $SLIPWAY_HOME, the user's
 * home and the rest of the host are not there at all, so neither a read nor a remount can reach
 * them. Nor does it learn where they are: the sandbox's own paths are fixed, and host paths of
 * the worktree in a command's cwd, arguments and environment are translated at the boundary
 * (`toSandboxPath`). Every path comes from trusted places (Slipway's records, the repository's own git
 * directory), never from files inside the worktree, which the agent controls.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync, lstatSync, promises as fs, readlinkSync, realpathSync, type Stats } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { isInside } from './paths';
import type { SandboxLimits } from './limits';

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
  /** Enforced limits of every command (limits.ts): processes, memory, CPU, file size. */
  limits?: SandboxLimits;
  /** The seccomp filter of seccomp.ts on every command (default true); false for agents that need, say, ptrace. */
  seccomp?: boolean;
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
    probe = execFileAsync(bwrap, ['--unshare-user', '--cap-drop', 'ALL', '--ro-bind', '/', '/', '--dev', '/dev', '--proc', '/proc', '--unshare-pid', '--die-with-parent', '--', 'true'], {
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

/** Where a confined sandbox sees its worktree, whatever its host path. */
export const SANDBOX_WORKSPACE = '/workspace';

/**
 * A host path inside the worktree as the sandbox sees it (below SANDBOX_WORKSPACE); other
 * strings unchanged. Every occurrence of the worktree's host path in `value` is translated, so an
 * argument such as `--dir=<root>/src` or a prompt naming a file arrives in the sandbox's terms.
 */
export function toSandboxPath(worktrees: string[], value: string): string {
  let out = value;
  // Longest first: a worktree given both by a symlinked and by its real path.
  for (const root of [...new Set(worktrees)].sort((a, b) => b.length - a.length)) {
    if (!root || root === '/') continue;
    out = out.replace(new RegExp(`${escapeRegExp(root)}(?=/|$|[^\\w.-])`, 'g'), SANDBOX_WORKSPACE);
  }
  return out;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/** What a confined command may see and write, all absolute real paths. */
export interface ConfinementLayout {
  /** The worktree on the host, mounted at SANDBOX_WORKSPACE. */
  worktree: string;
  /** Writable directories mounted at a path (source on the host -> where the sandbox sees it). */
  binds: Array<{ source: string; dest: string }>;
  /** Read-only directories mounted at a path. */
  roBinds: Array<{ source: string; dest: string }>;
}

const PRIVATE_TMP = '/tmp';
/** The uid and gid a confined command runs as (inside its user namespace). */
export const SANDBOX_UID = 1000;

/**
 * System paths bound read-only. Listed in one place: what a sandbox may run. Agent CLIs installed
 * elsewhere (~/.local, nvm) are added through `readable`; Node's own prefix is added when it
 * lies outside these.
 */
export const SYSTEM_PATHS = ['/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32', '/etc', '/opt'];
/** Files and folders of /etc no sandbox may read. */
export const ETC_MASKED_FILES = ['/etc/shadow', '/etc/shadow-', '/etc/gshadow', '/etc/gshadow-', '/etc/sudoers', '/etc/security/opasswd'];
export const ETC_MASKED_DIRS = ['/etc/ssh', '/etc/ssl/private', '/etc/sudoers.d', '/etc/slipway'];

interface SystemView {
  args: string[];
}
let systemView: SystemView | undefined;

/** The bwrap arguments for the read-only system view (computed once per process). */
export function systemViewArgs(): string[] {
  if (systemView) return systemView.args;
  const args: string[] = [];
  const bound: string[] = [];
  for (const p of SYSTEM_PATHS) {
    let st: Stats | undefined;
    try {
      st = lstatSync(p);
    } catch {
      continue;
    }
    if (st.isSymbolicLink()) args.push('--symlink', readlinkSync(p), p);
    else if (st.isDirectory()) {
      args.push('--ro-bind', p, p);
      bound.push(p);
    }
  }
  // Node (and npm-installed agent CLIs beside it) may live outside /usr, e.g. /usr/local is
  // covered but an nvm prefix is not.
  const nodePrefix = path.dirname(path.dirname(realpathSync(process.execPath)));
  if (!bound.some((b) => isInside(b, nodePrefix)) && nodePrefix !== '/') args.push('--ro-bind', nodePrefix, nodePrefix);
  for (const f of ETC_MASKED_FILES) if (existsSync(f)) args.push('--ro-bind', '/dev/null', f);
  for (const d of ETC_MASKED_DIRS) if (existsSync(d)) args.push('--tmpfs', d);
  systemView = { args };
  return args;
}

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
  const home = process.env.HOME && path.isAbsolute(process.env.HOME) ? path.normalize(process.env.HOME) : undefined;
  const args = [
    '--unshare-user', '--uid', String(SANDBOX_UID), '--gid', String(SANDBOX_UID),
    '--cap-drop', 'ALL',
    ...systemViewArgs(),
    '--dev', '/dev', '--proc', '/proc',
    '--tmpfs', PRIVATE_TMP, '--tmpfs', '/var/tmp',
  ];
  if (home && home !== '/' && !isInside(PRIVATE_TMP, home)) args.push('--tmpfs', home);
  const writable = dedupe(extra.writable.map((p) => absolute(p, 'writable')));
  const readable = dedupe((extra.readable ?? []).map((p) => absolute(p, 'readable')));
  // A read-only path inside a writable one (an agent's config file in its home) is bound after it, so it stays read-only.
  const readOnlyWithin = (p: string) => writable.some((w) => w !== p && isInside(w, p));
  for (const p of readable.filter((p) => !readOnlyWithin(p))) args.push('--ro-bind', p, p);
  args.push('--bind', layout.worktree, SANDBOX_WORKSPACE);
  for (const b of layout.binds) args.push('--bind', b.source, b.dest);
  for (const b of layout.roBinds) args.push('--ro-bind', b.source, b.dest);
  for (const p of writable) args.push('--bind', p, p);
  for (const p of readable.filter(readOnlyWithin)) args.push('--ro-bind', p, p);
  for (const p of extra.hidden) args.push('--tmpfs', absolute(p, 'hidden'));
  args.push('--unshare-pid', '--unshare-ipc', '--unshare-uts', '--hostname', 'slipway-sandbox');
  if (!confinement.network) args.push('--unshare-net');
  // The root tmpfs only holds mount points: read-only, so nothing pretends to write outside.
  args.push('--remount-ro', '/');
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

