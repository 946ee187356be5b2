/**
 * Git lock files left behind by a git process that died holding them (a worker killed with
 * SIGKILL mid-commit leaves `index.lock`, and every later git call in that worktree fails with
 * "File exists"). Slipway removes such a lock only when it is provably stale:
 *   - no live process has the file open (git keeps `index.lock` open for the whole operation),
 *     known by the file's device and inode, whatever path the holder's namespace gives it;
 *   - and it was last written at least `minAgeMs` ago: a ref lock is closed before git renames it
 *     into place, so an unopened lock that is seconds old may still belong to a live git.
 * Only lock files in the git folders Slipway owns are considered (a worktree's record, a
 * sandbox's private git folder, Slipway's own ref namespace); never the user's `index.lock`.
 *
 * A sandbox whose git lives inside it (containers, Kubernetes, Daytona: a repository of its own
 * in the workspace) is checked from inside, by STALE_LOCKS_SCRIPT run there: a holder's open files
 * name paths of the sandbox's own view, which only a look from that view can match.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { isInside } from './sandbox/paths';

export interface StaleLockOptions {
  /** A lock younger than this is left alone (default 2 s). */
  minAgeMs?: number;
  /** Where to read processes' open files (default `/proc`). Without it, nothing is removed. */
  procRoot?: string;
}

interface Candidate {
  folder: string;
  lock: string;
}

/** Lock files directly in `dir` (not below). */
async function locksIn(dir: string): Promise<Candidate[]> {
  const names = await fs.readdir(dir).catch(() => [] as string[]);
  return names.filter((n) => n.endsWith('.lock')).map((n) => ({ folder: dir, lock: path.join(dir, n) }));
}

/** Lock files anywhere below `dir`, for ref folders (symbolic links are not followed). */
async function locksBelow(dir: string): Promise<Candidate[]> {
  const entries = await fs.readdir(dir, { recursive: true, withFileTypes: true }).catch(() => []);
  return entries.filter((e) => e.isFile() && e.name.endsWith('.lock')).map((e) => ({ folder: dir, lock: path.join(e.parentPath, e.name) }));
}


/**
 * Every lock file some live process holds open, as `device:inode`: the file itself, not its path,
 * which names what the holder's own mount namespace shows (a confined git sees its private git
 * folder at /run/slipway/git, not at the host path). Undefined when /proc cannot be read.
 */
async function openLocks(procRoot: string): Promise<Set<string> | undefined> {
  const pids = await fs.readdir(procRoot).catch(() => undefined);
  if (!pids) return undefined;
  const open = new Set<string>();
  for (const pid of pids) {
    if (!/^\d+$/.test(pid)) continue;
    const fdDir = path.join(procRoot, pid, 'fd');
    // A process that ended meanwhile, or one we may not inspect, has nothing we can see.
    const fds = await fs.readdir(fdDir).catch(() => [] as string[]);
    for (const fd of fds) {
      const link = path.join(fdDir, fd);
      const target = await fs.readlink(link).catch(() => undefined);
      if (!target?.replace(/ \(deleted\)$/, '').endsWith('.lock')) continue;
      const st = await fs.stat(link).catch(() => undefined);
      if (st) open.add(`${st.dev}:${st.ino}`);
    }
  }
  return open;
}

/**
 * Removes the stale lock files among `folders` (`top`: lock files directly in the folder;
 * `tree`: anywhere below it). Returns the removed paths.
 */
export async function clearStaleGitLocks(folders: { top?: string[]; tree?: string[] }, opts: StaleLockOptions = {}): Promise<string[]> {
  const candidates = [
    ...(await Promise.all((folders.top ?? []).map(locksIn))).flat(),
    ...(await Promise.all((folders.tree ?? []).map(locksBelow))).flat(),
  ];
  if (candidates.length === 0) return [];
  const open = await openLocks(opts.procRoot ?? '/proc');
  if (!open) return [];
  const minAgeMs = opts.minAgeMs ?? 2_000;
  const removed: string[] = [];
  for (const { folder, lock } of candidates) {
    // Sandbox code can write some of these folders: a lock that is a link, or that resolves
    // outside its folder, is never followed or removed.
    const st = await fs.lstat(lock).catch(() => undefined);
    if (!st?.isFile() || Date.now() - st.mtimeMs < minAgeMs) continue;
    const [real, realFolder] = await Promise.all([fs.realpath(lock).catch(() => undefined), fs.realpath(folder).catch(() => undefined)]);
    if (!real || !realFolder || !isInside(realFolder, real) || open.has(`${st.dev}:${st.ino}`)) continue;
    await fs.rm(real, { force: true });
    removed.push(lock);
  }
  return removed;
}

/**
 * The same rule, run inside a sandbox whose repository is its workspace's `.git` (POSIX sh,
 * coreutils and findutils): lock files directly in `.git` and anywhere under `.git/refs`, at least
 * 2 s old, that no process of the sandbox has open, are removed and printed one per line. A link
 * is never a candidate (`-type f`); a holder is found by the file's device and inode (`stat -L`
 * of every open descriptor), not by its path.
 */
export const STALE_LOCKS_SCRIPT = `
[ -d .git ] || exit 0
now=$(date +%s) || exit 1
{ find .git -maxdepth 1 -type f -name '*.lock'; [ -d .git/refs ] && find .git/refs -type f -name '*.lock'; } 2>/dev/null |
while IFS= read -r f; do
  m=$(stat -c %Y -- "$f" 2>/dev/null) || continue
  [ $((now - m)) -ge 2 ] || continue
  id=$(stat -c %d:%i -- "$f" 2>/dev/null) || continue
  stat -L -c %d:%i /proc/[0-9]*/fd/* 2>/dev/null | grep -qxF -- "$id" && continue
  rm -f -- "$f" && printf '%s\\n' "$f"
done
exit 0
`;
