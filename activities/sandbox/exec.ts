/**
 * Runs one command in a worktree, confined by bubblewrap or not. Shared by sandboxes, warm-pool
 * entries and the prepared template (their setup commands run under the same confinement as
 * the sandbox's agents and gates).
 */
import { promises as fs } from 'node:fs';
import { runProcess, type RunResult } from '../process';
import { bwrapArgs, BubblewrapMissingError, confinementLayout, probeBwrap, requireBwrap, resolveExtraPaths, snapshotGitLinks, type BubblewrapConfinement } from './bubblewrap';
import { resolveInside } from './paths';
import type { ExecRequest } from './provider';

export interface ExecTarget {
  /** The worktree (absolute). */
  root: string;
  /** Needed under confinement: the repository, and the branch whose ref the command may move (trusted, from Slipway's records). */
  repository?: string;
  branch?: string;
  confinement?: BubblewrapConfinement;
}

async function realpathOrSelf(p: string): Promise<string> {
  return fs.realpath(p).catch(() => p);
}

export async function execInWorktree(target: ExecTarget, req: ExecRequest): Promise<RunResult> {
  const cwd = req.cwd ? await resolveInside(target.root, req.cwd) : await realpathOrSelf(target.root);
  const env: NodeJS.ProcessEnv = req.inheritEnv === false ? { ...req.env } : { ...process.env, ...req.env };
  const common = {
    cwd,
    stdin: req.stdin,
    timeoutMs: req.timeoutMs,
    signal: req.signal,
    onLine: req.onLine,
    maxCaptureBytes: req.maxCaptureBytes,
  };
  const confinement = target.confinement;
  if (!confinement) return runProcess({ ...common, command: req.command, args: req.args, shell: req.shell, env });
  if (!target.repository) throw new Error(`confined commands need the repository of ${target.root}`);

  const bwrap = requireBwrap(confinement.bwrapPath);
  await probeBwrap(bwrap);
  const layout = await confinementLayout(target.repository, target.root, target.branch);
  const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
  // The host's TMPDIR may point somewhere read-only in the sandbox; /tmp is private and writable.
  if (req.env?.TMPDIR === undefined) env.TMPDIR = '/tmp';
  const restoreGitLinks = await snapshotGitLinks(layout);
  try {
    return await runProcess({
      ...common,
      command: bwrap,
      args: [...bwrapArgs(layout, confinement, cwd, await resolveExtraPaths(confinement)), '--', ...inner],
      env,
    });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' && (e as NodeJS.ErrnoException).path === bwrap) throw new BubblewrapMissingError();
    throw e;
  } finally {
    await restoreGitLinks();
  }
}

/** The stricter of two confinements: the provider's own (if any) is never loosened by a sandbox's. */
export function combineConfinement(
  provider: BubblewrapConfinement | undefined,
  sandbox: BubblewrapConfinement | undefined,
): BubblewrapConfinement | undefined {
  if (!provider) return sandbox;
  if (!sandbox) return provider;
  return {
    ...provider,
    network: provider.network && sandbox.network,
    hidden: [...new Set([...(provider.hidden ?? []), ...(sandbox.hidden ?? [])])],
    readable: [...new Set([...(provider.readable ?? []), ...(sandbox.readable ?? [])])],
  };
}
