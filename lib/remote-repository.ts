/**
 * Objectives on a remote repository (a URL, or a path to a bare repository): Slipway keeps a
 * clone of it under `$SLIPWAY_HOME/repositories/<hash of the URL>` and everything downstream
 * (ids, worktrees, merges) runs on that clone as on a local checkout; the integration branch is
 * pushed back at the end, never forced (docs/adr/0012, "Remote repositories").
 *
 * The remote is as untrusted as a sandbox: every call carries GIT_HARDENING and allows only the
 * URL's own transport, so a hostile remote (or a redirect) cannot switch to another protocol.
 */
import { createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { RepositoryUrlProtocol } from '../core/repository-spec';
import { withFileLock } from './file-lock';
import { git, gitMaybe, GitError } from './git';
import { slipwayHome } from './settings';

/** Git config key in a clone holding the remote it mirrors; its presence marks a clone as Slipway's. */
export const REMOTE_CONFIG_KEY = 'slipway.remote';

export function mirrorRoot(url: string, home = slipwayHome()): string {
  return path.join(home, 'repositories', createHash('sha256').update(url).digest('hex').slice(0, 24));
}

/** `-c` options allowing only the URL's transport (ssh also needs its command back from GIT_HARDENING). */
export function transportOptions(protocol: RepositoryUrlProtocol): string[] {
  const opts = ['-c', 'protocol.allow=never', '-c', `protocol.${protocol}.allow=always`];
  if (protocol === 'ssh') opts.push('-c', 'core.sshCommand=ssh');
  return opts;
}

/**
 * Clones the remote (first time) or fetches it, then checks out `baseBranch` (default: the
 * remote's default branch) at the remote's tip. Serialized per clone by a file lock, so objectives
 * starting together on one remote see one consistent clone. Throws with git's message when the
 * remote cannot be read; a first clone that fails leaves nothing behind.
 */
export async function syncMirror(remote: { url: string; protocol: RepositoryUrlProtocol }, baseBranch: string | undefined, home = slipwayHome()): Promise<{ root: string; baseBranch: string }> {
  await fs.mkdir(path.join(home, 'repositories'), { recursive: true });
  // Real path: the lock file is named after it here and in pushToRemote.
  const root = mirrorRoot(remote.url, await fs.realpath(home));
  const t = transportOptions(remote.protocol);
  return withFileLock(`${root}.sync`, async () => {
    if (!(await gitMaybe(root, ['config', '--get', REMOTE_CONFIG_KEY]))) {
      await fs.rm(root, { recursive: true, force: true });
      const partial = `${root}.partial-${process.pid}`;
      await fs.rm(partial, { recursive: true, force: true });
      try {
        await git(path.dirname(root), [...t, 'clone', '--quiet', '--no-checkout', '--', remote.url, partial]);
        await git(partial, ['config', REMOTE_CONFIG_KEY, remote.url]);
        await fs.rename(partial, root);
      } catch (e) {
        await fs.rm(partial, { recursive: true, force: true });
        throw e;
      }
    } else {
      await git(root, [...t, 'fetch', '--quiet', '--prune', 'origin']);
    }
    const branch = baseBranch ?? (await gitMaybe(root, ['symbolic-ref', '--short', 'refs/remotes/origin/HEAD']))?.replace(/^origin\//, '');
    if (!branch) throw new GitError(['symbolic-ref'], 1, 'the remote has no default branch; set base_branch');
    // The remote is the truth for the base branch: the local one follows it (forced, it is ours).
    if (await gitMaybe(root, ['rev-parse', '--verify', '--quiet', `refs/remotes/origin/${branch}^{commit}`])) {
      await git(root, ['checkout', '--quiet', '--force', '-B', branch, `refs/remotes/origin/${branch}`]);
    }
    return { root, baseBranch: branch };
  }, { waitMs: 120_000 });
}

/** The remote a Slipway clone mirrors, or undefined for a user's own checkout. */
export async function mirroredRemote(repository: string): Promise<string | undefined> {
  return (await gitMaybe(repository, ['config', '--get', REMOTE_CONFIG_KEY])) || undefined;
}

/**
 * Pushes `branch` to the remote without force: a remote branch that moved on (someone else's
 * work) rejects the push, and the caller reports it. Returns git's error text then.
 */
export async function pushToRemote(repository: string, protocol: RepositoryUrlProtocol, branch: string): Promise<{ error?: string }> {
  try {
    await withFileLock(`${repository}.sync`, () => git(repository, [...transportOptions(protocol), 'push', '--quiet', '--no-verify', 'origin', `refs/heads/${branch}:refs/heads/${branch}`]), { waitMs: 120_000 });
    return {};
  } catch (e) {
    return { error: e instanceof GitError ? e.message : String(e) };
  }
}
