/**
 * Local sandboxes created and destroyed at the same time in one group (as an objective's streams
 * are): a destroy removes the group's folders once they are empty, and a concurrent create must
 * not fail on a folder that vanished under it; `git worktree list` must not fail while another
 * `git worktree add` is half way. Many lanes over many rounds, no timing: each lane creates and
 * destroys as fast as it can, so the folders empty and fill again all the time.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { HALF_ADDED_WORKTREE, listWorktrees } from '../../lib/git';
import { ensureDir, writeFileAtomic } from '../../lib/atomic-write';
import { makeRepo, sandboxRequest, tempDir } from './helpers';

const LANES = 12;
const ROUNDS = 4;

describe('concurrent creates and destroys in one group', () => {
  it(`${LANES} lanes creating and destroying ${ROUNDS} times each, with worktree lists alongside: nothing fails`, async () => {
    const { repo } = makeRepo(tempDir('concurrent'));
    const provider = new LocalSandboxProvider({ backgroundFill: false });
    let lanesDone = 0;
    let lists = 0;
    const lane = async (i: number) => {
      try {
        for (let r = 0; r < ROUNDS; r++) {
          const handle = await provider.create(sandboxRequest(repo, `l${i}-r${r}`, { group: 'crowd' }));
          expect(handle.root).toBe(path.join(repo, '.slipway', 'worktrees', 'crowd', `l${i}-r${r}`));
          await provider.destroy({ repository: repo, root: handle.root });
        }
      } finally {
        lanesDone += 1;
      }
    };
    const lister = async () => {
      while (lanesDone < LANES) {
        await listWorktrees(repo);
        lists += 1;
      }
    };
    const results = await Promise.allSettled([...Array.from({ length: LANES }, (_, i) => lane(i)), lister()]);
    const failures = results.flatMap((r) => (r.status === 'rejected' ? [String((r.reason as Error)?.stack ?? r.reason)] : []));
    expect(failures).toEqual([]);
    expect(lists).toBeGreaterThan(0);
    // All gone again, group folder included.
    expect((await listWorktrees(repo)).map((w) => w.path)).toEqual([repo]);
    await expect(fs.stat(path.join(repo, '.slipway', 'worktrees', 'crowd'))).rejects.toMatchObject({ code: 'ENOENT' });
  }, 300_000);

  it('atomic writes into a folder that concurrent removers take away once empty always land', async () => {
    // As records are: each lane writes its file into the group folder, removes it, then removes
    // the folder if it is empty (what a destroy does), over and over.
    const dir = path.join(tempDir('atomic-race'), 'records', 'group');
    const lane = async (i: number) => {
      for (let k = 0; k < 60; k++) {
        const file = path.join(dir, `l${i}.json`);
        await writeFileAtomic(file, `${k}\n`, { mkdir: true });
        expect(await fs.readFile(file, 'utf8')).toBe(`${k}\n`);
        await fs.rm(file);
        await fs.rmdir(dir).catch(() => undefined);
        // And a plain mkdir -p of a folder in it (what a create does for a sandbox's root).
        await ensureDir(path.join(dir, `root-${i}`));
        await fs.rmdir(path.join(dir, `root-${i}`));
        await fs.rmdir(dir).catch(() => undefined);
      }
    };
    const results = await Promise.allSettled(Array.from({ length: LANES }, (_, i) => lane(i)));
    expect(results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : []))).toEqual([]);
  });

  it('mkdir -p against a remover of empty folders never fails; a file in the way still does', async () => {
    // Node's recursive mkdir, raced by rmdir, fails with ENOENT and now and then with ENOTDIR
    // (a clean-clone CI's create failed on the second): six makers, one remover, as often as they can.
    // The race is rare: without the retry of ENOTDIR this fails about every other run.
    const group = path.join(tempDir('mkdir-race'), 'worktrees', 'group');
    let making = true;
    const remover = (async () => {
      while (making) {
        for (const d of ['a', 'b']) await fs.rmdir(path.join(group, d)).catch(() => undefined);
        await fs.rmdir(group).catch(() => undefined);
      }
    })();
    const maker = async (i: number) => {
      for (let n = 0; n < 12_000; n++) await ensureDir(path.join(group, i % 2 ? 'a' : 'b'));
    };
    const results = await Promise.allSettled(Array.from({ length: 6 }, (_, i) => maker(i)));
    making = false;
    await remover;
    expect(results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : []))).toEqual([]);
    await fs.mkdir(group, { recursive: true });
    await fs.writeFile(path.join(group, 'file'), '');
    await expect(ensureDir(path.join(group, 'file', 'below'))).rejects.toMatchObject({ code: 'ENOTDIR' });
  }, 120_000);

  it.each([
    ['fatal: failed to read .git/worktrees/l3-r1/commondir: No such file or directory', true],
    ['fatal: failed to read /r/.git/worktrees/x/gitdir: No such file or directory', true],
    ["fatal: failed to read '/r/.git/worktrees/x/HEAD'", true],
    ["fatal: Invalid path '/r/.git/worktrees/l4-r1': No such file or directory", true],
    // Seen in a clean-clone CI: a remove deleted the lock marker between git's check and its read.
    ["fatal: failed to read '.git/worktrees/l6-r1/locked': No such file or directory", true],
    ['fatal: not a git repository: /r/.git/worktrees/x', false],
    ['fatal: failed to read /r/.git/config', false],
  ])('a worktree list failing with %j is a half-added worktree: %s', (stderr, transient) => {
    expect(HALF_ADDED_WORKTREE.test(stderr)).toBe(transient);
  });
});
