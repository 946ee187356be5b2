/**
 * Local suspend/restore: everything git and the user can see comes back exactly (branch,
 * HEAD, staged and unstaged changes, deletions, untracked files, modes, links, ignored build
 * output), the directory is freed while suspended, and the probe tells a dead worktree apart.
 */
import { createHash } from 'node:crypto';
import { promises as fs, existsSync } from 'node:fs';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { probeLocal, restoreLocal, SnapshotError, suspendLocal } from '../../activities/sandbox/local-snapshot';
import { gitIn, makeServiceRepo, sh } from './repo';

/** Everything observable about a worktree, outside .git. */
async function picture(root: string): Promise<Record<string, string>> {
  const files: string[] = [];
  const walk = async (dir: string) => {
    for (const entry of await fs.readdir(dir, { withFileTypes: true })) {
      if (entry.name === '.git') continue;
      const full = path.join(dir, entry.name);
      const rel = path.relative(root, full);
      const st = await fs.lstat(full);
      if (entry.isSymbolicLink()) files.push(`${rel} -> ${await fs.readlink(full)}`);
      else if (entry.isDirectory()) await walk(full);
      else files.push(`${rel} ${(st.mode & 0o111) !== 0 ? 'x' : '-'} ${createHash('sha1').update(await fs.readFile(full)).digest('hex')}`);
    }
  };
  await walk(root);
  return {
    head: gitIn(root, 'rev-parse', 'HEAD'),
    branch: gitIn(root, 'rev-parse', '--abbrev-ref', 'HEAD'),
    status: gitIn(root, 'status', '--porcelain=v2', '--branch', '--untracked-files=all'),
    staged: gitIn(root, 'diff', '--cached'),
    unstaged: gitIn(root, 'diff'),
    files: files.sort().join('\n'),
  };
}

describe('local suspend and restore', () => {
  let repo: string;
  let provider: LocalSandboxProvider;
  beforeAll(() => {
    repo = makeServiceRepo();
    provider = new LocalSandboxProvider();
  });

  const create = (name: string) =>
    provider.create({ sandboxId: `t.${name}`, repository: repo, group: 'acct-t', name, branch: `slipway/sandboxes/${name}`, base: 'main' });

  it('brings back the branch, index, working tree and untracked files exactly, and frees the directory', async () => {
    const { root } = await create('full');
    sh(root, 'printf "committed\\n" > src/c.txt && git add src/c.txt && git -c user.name=t -c user.email=t@t commit -q -m c');
    sh(root, 'printf "unstaged\\n" >> src/a.txt');
    sh(root, 'printf "staged\\n" >> src/b.txt && git add src/b.txt && printf "then more\\n" >> src/b.txt');
    sh(root, 'printf "new staged\\n" > src/new.txt && git add src/new.txt');
    sh(root, 'git rm -q README.md');
    sh(root, 'mkdir -p notes/deep && printf "untracked\\n" > notes/deep/todo.md && printf "#!/bin/sh\\necho hi\\n" > run.sh && chmod +x run.sh');
    sh(root, 'ln -s src/a.txt link-to-a');
    sh(root, 'mkdir -p dist && printf "built\\n" > dist/out.js && mkdir -p .slipway && printf "{}\\n" > .slipway/grants.json');
    const before = await picture(root);
    expect(before.status).toContain('? notes/deep/todo.md');
    expect(existsSync(path.join(root, 'node_modules/dep/index.js'))).toBe(true);

    const suspended = await suspendLocal(root, { templateIgnored: true });
    expect(suspended.snapshotRef).toBe('refs/slipway/snapshots/acct-t/full');
    expect(existsSync(root)).toBe(false);
    expect(gitIn(repo, 'worktree', 'list')).not.toContain(root);
    expect(gitIn(repo, 'rev-parse', 'slipway/sandboxes/full')).toBe(before.head); // the branch stays
    // A retried suspend finds its own snapshot.
    expect((await suspendLocal(root, { templateIgnored: true })).snapshotRef).toBe(suspended.snapshotRef);

    const restored = await restoreLocal(root, { templateIgnored: true });
    expect(restored).toMatchObject({ root, branch: 'slipway/sandboxes/full', head: before.head, alreadyRestored: false });
    expect(await picture(root)).toEqual(before);
    expect(gitIn(repo, 'for-each-ref', 'refs/slipway/snapshots')).toBe(''); // the snapshot is dropped
    // A retried restore finds the sandbox already back.
    expect((await restoreLocal(root, { templateIgnored: true })).alreadyRestored).toBe(true);
    expect(await picture(root)).toEqual(before);
  });

  it('keeps a detached HEAD detached', async () => {
    const { root } = await create('detached');
    sh(root, 'git checkout -q --detach HEAD~0 && printf "x\\n" > loose.txt');
    const before = await picture(root);
    await suspendLocal(root, { templateIgnored: false });
    await restoreLocal(root, { templateIgnored: false });
    expect(await picture(root)).toEqual(before);
    expect(before.branch).toBe('HEAD');
  });

  it('refuses to suspend an unresolved merge and leaves the sandbox as it was', async () => {
    const { root } = await create('conflict');
    sh(root, 'git checkout -q -b side && printf "side\\n" > src/a.txt && git -c user.name=t -c user.email=t@t commit -qam side');
    sh(root, 'git checkout -q slipway/sandboxes/conflict && printf "mine\\n" > src/a.txt && git -c user.name=t -c user.email=t@t commit -qam mine');
    sh(root, 'git merge side >/dev/null 2>&1 || true');
    const before = await picture(root);
    await expect(suspendLocal(root, { templateIgnored: false })).rejects.toBeInstanceOf(SnapshotError);
    expect(await picture(root)).toEqual(before);
  });

  it('probes a worktree: alive, unregistered, removed', async () => {
    const { root } = await create('probe');
    expect(await probeLocal(root)).toEqual({ alive: true });
    await fs.rename(path.join(root, '.git'), path.join(root, '.git-moved'));
    expect(await probeLocal(root)).toMatchObject({ alive: false, reason: 'worktree_unregistered' });
    await fs.rm(root, { recursive: true, force: true });
    expect(await probeLocal(root)).toMatchObject({ alive: false, reason: 'directory_removed' });
  });
});
