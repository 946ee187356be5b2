/**
 * Local sandboxes: one git worktree per stream under `<repo>/.slipway/worktrees/<group>/<name>`.
 * The user's checkout is never touched: worktrees are added from refs, and every command
 * runs inside the worktree.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { WORKTREES_DIR } from '../../core/ids';
import { branchExists, ensureSlipwayExcluded, git, gitMaybe, listWorktrees, resolveCommit } from '../git';
import { runProcess } from '../process';
import { resolveInside } from './paths';
import type { ExecRequest, SandboxCreateRequest, SandboxHandle, SandboxProvider } from './provider';

async function realpathOrSelf(p: string): Promise<string> {
  return fs.realpath(p).catch(() => p);
}

export function localSandboxRoot(repository: string, group: string, name: string): string {
  return path.join(repository, WORKTREES_DIR, group, name);
}

export class LocalSandboxProvider implements SandboxProvider {
  readonly kind = 'local';

  async create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    const repo = await realpathOrSelf(req.repository);
    await ensureSlipwayExcluded(repo);
    const root = localSandboxRoot(repo, req.group, req.name);
    const worktrees = await listWorktrees(repo);
    const existing = await findWorktree(worktrees, root);
    const baseCommit = await resolveCommit(repo, req.base);

    if (existing && !existing.prunable) {
      if (existing.branch !== req.branch) {
        throw new Error(`worktree ${root} exists on branch ${existing.branch ?? '(detached)'}, expected ${req.branch}`);
      }
      return { sandboxId: req.sandboxId, provider: this.kind, root, branch: req.branch, baseCommit, headCommit: existing.head, reused: true };
    }
    // A half-made worktree from a crashed attempt: clear it and start again.
    await git(repo, ['worktree', 'prune']);
    await fs.rm(root, { recursive: true, force: true });
    await fs.mkdir(path.dirname(root), { recursive: true });
    if (await branchExists(repo, req.branch)) {
      await git(repo, ['worktree', 'add', root, req.branch]);
    } else {
      await git(repo, ['worktree', 'add', '-b', req.branch, root, baseCommit]);
    }
    const headCommit = await git(root, ['rev-parse', 'HEAD']);
    return { sandboxId: req.sandboxId, provider: this.kind, root, branch: req.branch, baseCommit, headCommit, reused: false };
  }

  async exec(handle: Pick<SandboxHandle, 'root'>, req: ExecRequest) {
    const cwd = req.cwd ? await resolveInside(handle.root, req.cwd) : handle.root;
    return runProcess({
      command: req.command,
      args: req.args,
      shell: req.shell,
      cwd,
      env: { ...process.env, ...req.env },
      stdin: req.stdin,
      timeoutMs: req.timeoutMs,
      signal: req.signal,
      onLine: req.onLine,
      maxCaptureBytes: req.maxCaptureBytes,
    });
  }

  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string): Promise<Buffer> {
    return fs.readFile(await resolveInside(handle.root, file));
  }

  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string): Promise<void> {
    const target = await resolveInside(handle.root, file);
    await fs.mkdir(path.dirname(target), { recursive: true });
    await fs.writeFile(target, content);
  }

  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string): Promise<void> {
    await fs.rm(await resolveInside(handle.root, file), { force: true });
  }

  async destroy({ repository, root }: { repository: string; root: string }): Promise<void> {
    const repo = await realpathOrSelf(repository);
    const existing = await findWorktree(await listWorktrees(repo), root);
    if (existing) await gitMaybe(repo, ['worktree', 'remove', '--force', '--force', existing.path]);
    await fs.rm(root, { recursive: true, force: true });
    await git(repo, ['worktree', 'prune']);
    // Remove the group folder once its last sandbox is gone.
    await fs.rmdir(path.dirname(root)).catch(() => undefined);
  }

  async list(repository: string) {
    const repo = await realpathOrSelf(repository);
    const prefix = path.join(repo, WORKTREES_DIR) + path.sep;
    return (await listWorktrees(repo))
      .filter((w) => w.path.startsWith(prefix))
      .map((w) => ({ root: w.path, branch: w.branch, head: w.head }));
  }
}

async function findWorktree<T extends { path: string }>(worktrees: T[], root: string): Promise<T | undefined> {
  const want = await realpathOrSelf(root);
  for (const w of worktrees) {
    if (w.path === root || w.path === want || (await realpathOrSelf(w.path)) === want) return w;
  }
  return undefined;
}
