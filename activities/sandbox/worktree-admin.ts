/**
 * Worktrees Slipway keeps locked (warm-pool entries, templates): `git worktree prune` leaves a
 * locked worktree alone even while its folder is being renamed, which is what makes moving a
 * pool entry by a plain rename safe against a concurrent prune.
 */
import { locateWorktree } from './sandbox-git';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';
import { gitMaybe } from '../../lib/git';
import { unmountDisk } from './disk';

/** `<common>/worktrees/<id>` named by `<root>/.git`, or undefined. */
export async function adminDirOf(root: string): Promise<string | undefined> {
  const dotGit = await fs.readFile(path.join(root, '.git'), 'utf8').catch(() => undefined);
  const gitdir = dotGit?.match(/^gitdir: (.+)$/m)?.[1]?.trim();
  if (!gitdir) return undefined;
  return path.resolve(root, gitdir);
}

/** After the folder of a worktree was renamed to `root`: point git's record at it and unlock it. */
export async function relinkMovedWorktree(root: string, opts: { unlock: boolean }): Promise<void> {
  const admin = await adminDirOf(root);
  if (!admin) throw new Error(`${root} is not a worktree (no .git file)`);
  await fs.writeFile(path.join(admin, 'gitdir'), `${path.join(root, '.git')}\n`);
  if (opts.unlock) await fs.rm(path.join(admin, 'locked'), { force: true });
}

/**
 * Removes a (possibly locked) worktree: its folder is renamed into the trash first (atomic: of
 * two removers, or a remover and a claimer, exactly one gets it), then unlocked, deleted, pruned.
 * Returns false when the folder was already gone (someone else got it).
 */
/** The one way Slipway removes a worktree's folder (sandboxes, pool entries, templates, suspend). */
export async function removeLockedWorktree(repo: string, root: string): Promise<boolean> {
  // git's record of it, from the repository (never from the worktree's own `.git` file, which
  // whatever ran in it could have pointed anywhere).
  const admin = await locateWorktree(repo, root).then(
    (loc) => loc.adminDir,
    () => undefined,
  );
  // A worktree on its own disk (disk.ts) is a mount point, which rename refuses: unmounted, it
  // is an empty folder, and its files stay on the image the caller deletes.
  await unmountDisk(root);
  const trash = path.join(repo, SLIPWAY_DIR, 'trash', `${path.basename(root)}.${process.pid}.${Date.now()}`);
  await fs.mkdir(path.dirname(trash), { recursive: true });
  try {
    await fs.rename(root, trash);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') {
      await gitMaybe(repo, ['worktree', 'prune']);
      return false;
    }
    throw e;
  }
  if (admin) await fs.rm(path.join(admin, 'locked'), { force: true });
  await fs.rm(trash, { recursive: true, force: true });
  await gitMaybe(repo, ['worktree', 'prune']);
  return true;
}
