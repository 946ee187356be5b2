/**
 * Slipway's own git in a sandbox, and the commit that brings a sandbox's work into the
 * repository: `commitWork` the activity, and the same commit at the end of a stream's agent run
 * or passing gates (docs/adr/0034-fewer-round-trips-per-stream.md), one place for all three.
 */
import path from 'node:path';
import { promises as fs } from 'node:fs';
import { BRANCH_PREFIX } from '../../core/ids';
import { commitIdentityVariables, GIT_HARDENING, GIT_TIMEOUT_MS } from '../../lib/git';
import { failure } from '../failures';
import { clearStaleGitLocks, STALE_LOCKS_SCRIPT } from '../git-locks';
import { activityContext } from '../heartbeat';
import { tail } from '../process';
import { parseContainerRoot } from './container';
import { parseSandboxRoot, SLIPWAY_GIT_ENV } from './local';
import type { SandboxProvider } from './provider';
import { locateWorktree, sandboxGitDir } from './sandbox-git';

/** What a commit of a sandbox's work left: the sandbox's HEAD, collected into the repository, and whether anything was committed. */
export interface CommittedWork {
  head: string;
  committed: boolean;
}

/**
 * Commits whatever is uncommitted in the sandbox (git there sees only the sandbox's own git
 * state), then collects the sandbox's HEAD into the repository. Idempotent: a retry after the
 * commit finds a clean tree and commits nothing again; the head is the sandbox's HEAD either way.
 * The message goes through stdin: it carries task text of any size.
 */
export async function commitSandboxWork(sandboxes: SandboxProvider, input: { path: string; message: string }): Promise<CommittedWork> {
  const run = sandboxGit(sandboxes, input.path);
  let committed = false;
  if ((await run(['status', '--porcelain', '--untracked-files=all'])).length > 0) {
    await run(['add', '-A']);
    await run(['commit', '--no-verify', '-q', '-F', '-'], input.message);
    committed = true;
  }
  const { head } = await sandboxes.collect({ root: input.path });
  return { head, committed };
}

/**
 * Slipway's own git commands in a sandbox, run through the provider: inside the sandbox when it is
 * confined (seeing only its private git state), with nothing of the worker's environment, and a
 * commit identity from the repository. Throws with git's message on a non-zero exit.
 */
export function sandboxGit(sandboxes: SandboxProvider, root: string) {
  let identity: Promise<Record<string, string>> | undefined;
  let unlocked: Promise<unknown> | undefined;
  return async (args: string[], stdin?: string): Promise<string> => {
    const parsed = parseSandboxRoot(path.resolve(root));
    const repository = parsed?.repository ?? parseContainerRoot(path.resolve(root))?.repository;
    identity ??= repository ? commitIdentityVariables(repository) : Promise.resolve({});
    unlocked ??= clearSandboxGitLocks(sandboxes, root);
    await unlocked;
    // The sandbox's config is the agent's: its hooks and fsmonitor do not run for Slipway's own
    // commands even inside, and a command that hangs is killed.
    const r = await sandboxes.exec(
      { root },
      { command: 'git', args: [...GIT_HARDENING, ...args], stdin, env: { ...SLIPWAY_GIT_ENV, ...(await identity) }, inheritEnv: false, maxCaptureBytes: 1024 * 1024, timeoutMs: GIT_TIMEOUT_MS },
    );
    if (r.exitCode !== 0) throw failure('sandbox_failure', `git ${args[0]} in the sandbox failed (exit ${r.exitCode}): ${tail(r.stderr.trim(), 2000)}`);
    return r.stdout.trim();
  };
}

/**
 * Removes a sandbox's stale git locks (a worker killed while Slipway's git or an agent's git ran
 * in it), run before Slipway's git and before each agent run, whose own `git commit` would
 * otherwise fail on the dead one's `index.lock` at every retry. Returns the removed paths.
 *   - A local sandbox, from the host: its worktree record, its private git folder (confined) and
 *     Slipway's refs of its group. Cheap, so always.
 *   - A sandbox with its git inside (containers, Kubernetes, Daytona): STALE_LOCKS_SCRIPT run in
 *     it, which costs an exec; by default only in a retried attempt, the only one a dead run can
 *     precede. Best effort: a sandbox that cannot run it is left as it is.
 */
export async function clearSandboxGitLocks(sandboxes: SandboxProvider, root: string, opts: { inside?: boolean } = {}): Promise<string[]> {
  const parsed = parseSandboxRoot(path.resolve(root));
  if (!parsed) {
    // A retried attempt: a worker may have died under the one before.
    if (!(opts.inside ?? (activityContext()?.info.attempt ?? 1) > 1)) return [];
    // A sandbox that cannot be reached fails the command that follows, with its own error.
    const r = await sandboxes.exec({ root }, { command: '/bin/sh', args: ['-c', STALE_LOCKS_SCRIPT], env: SLIPWAY_GIT_ENV, inheritEnv: false, maxCaptureBytes: 64 * 1024, timeoutMs: GIT_TIMEOUT_MS }).catch(() => undefined);
    return r?.exitCode === 0 ? r.stdout.split('\n').filter((l) => l.length > 0) : [];
  }
  const loc = await locateWorktree(parsed.repository, root).catch(() => undefined);
  if (!loc) return [];
  const own = sandboxGitDir(parsed.repository, loc.worktree);
  const ownRecords = await fs.readdir(path.join(own, 'worktrees')).catch(() => [] as string[]);
  return clearStaleGitLocks({
    top: [loc.adminDir, own, ...ownRecords.map((id) => path.join(own, 'worktrees', id))],
    tree: [path.join(own, 'refs'), path.join(loc.commonDir, 'refs', 'heads', BRANCH_PREFIX, parsed.group)],
  });
}
