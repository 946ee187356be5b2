/**
 * The warm pool: ready worktrees claimed atomically by concurrent creates (in one process and
 * across processes), refilled in the background, stale entries replaced, crashed claims cleaned.
 */
import { execFile } from 'node:child_process';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { claimPoolEntry, listPool, poolDir, sweepPool } from '../../activities/sandbox/pool';
import type { ProjectSetup, SandboxCreateRequest } from '../../activities/sandbox/provider';
import { exists, gitIn, makeRepo, snapshotCheckout, tempDir } from './helpers';

const execFileAsync = promisify(execFile);
const TSX = path.resolve(__dirname, '../../node_modules/.bin/tsx');
const CLAIM = path.join(__dirname, 'fixtures', 'claim.ts');

const SETUP: ProjectSetup = { commands: ['echo done > .setup-done'], verify: ['test -f .setup-done', 'test -f node_modules/dep/index.js'] };
const POOL = 4;

let parent: string;
let repo: string;
let before: Record<string, string>;
const provider = new LocalSandboxProvider({ log: () => undefined });
let n = 0;
const req = (label: string, extra: Partial<SandboxCreateRequest> = {}): SandboxCreateRequest => {
  const name = `${label}-${++n}`;
  return { sandboxId: `pool.${name}`, repository: repo, group: 'pool', name, branch: `slipway/pool/${name}`, base: 'main', setup: SETUP, warmPool: POOL, ...extra };
};
const recordOf = async (root: string) => JSON.parse(await fs.readFile(path.join(repo, '.slipway/sandboxes/pool', `${path.basename(root)}.json`), 'utf8'));
const readyIds = async () => (await listPool(repo)).ready.map((e) => e.id).sort();
const fill = () => provider.fillWarmPool({ repository: repo, base: 'main', setup: SETUP, size: POOL });
/** Worktree paths git knows, each once. */
const registered = () => gitIn(repo, 'worktree', 'list', '--porcelain').split('\n').filter((l) => l.startsWith('worktree ')).map((l) => l.slice(9));

beforeAll(async () => {
  parent = tempDir('pool');
  ({ repo } = makeRepo(parent));
  await fs.writeFile(path.join(repo, '.gitignore'), 'node_modules/\n.setup-done\n');
  await fs.writeFile(path.join(repo, 'package-lock.json'), '{"lockfileVersion":3}\n');
  gitIn(repo, 'add', '-A');
  gitIn(repo, 'commit', '-q', '-m', 'deps');
  await fs.mkdir(path.join(repo, 'node_modules/dep'), { recursive: true });
  await fs.writeFile(path.join(repo, 'node_modules/dep/index.js'), 'module.exports = 1;\n');
  before = await snapshotCheckout(repo);
});
afterAll(async () => {
  await provider.whenPoolIdle();
  await fs.rm(parent, { recursive: true, force: true });
});

describe('warm pool', () => {
  it('fills to N ready entries with ignored files copied and setup done, kept out of sandbox listings', async () => {
    expect((await fill()).made).toBe(POOL);
    expect(await readyIds()).toHaveLength(POOL);
    for (const id of await readyIds()) {
      const root = path.join(poolDir(repo), id);
      expect(await exists(path.join(root, 'node_modules/dep/index.js'))).toBe(true);
      expect(await exists(path.join(root, '.setup-done'))).toBe(true);
    }
    expect(await provider.list(repo)).toEqual([]);
    expect((await fill()).made).toBe(0); // already full
  });

  it('hands a ready entry to a create, on its branch, and refills in the background', async () => {
    const cold = await provider.create(req('cold', { warmPool: 0 }));
    expect(cold.origin).toBe('cold');
    const warm = await provider.create(req('warm'));
    expect(warm.origin).toBe('pool');
    expect(gitIn(warm.root, 'rev-parse', '--abbrev-ref', 'HEAD')).toBe(warm.branch);
    expect(gitIn(warm.root, 'status', '--porcelain')).toBe('');
    expect(await fs.readFile(path.join(warm.root, 'node_modules/dep/index.js'), 'utf8')).toBe('module.exports = 1;\n');
    expect(await exists(path.join(warm.root, '.setup-done'))).toBe(true);
    expect((await recordOf(warm.root)).origin).toBe('pool');
    // A regular sandbox now: listed, committable, destroyable; git knows it at its new place.
    expect((await provider.list(repo)).map((s) => s.root)).toContain(warm.root);
    expect(registered()).toContain(warm.root);
    const commit = await provider.exec(warm, { command: 'echo x > f.txt && git add f.txt && git -c user.name=t -c user.email=t@t commit -qm f && git rev-parse HEAD', shell: true });
    expect(commit.exitCode, commit.stderr).toBe(0);
    expect(gitIn(repo, 'rev-parse', warm.branch)).toBe(commit.stdout.trim());
    await provider.whenPoolIdle();
    expect(await readyIds()).toHaveLength(POOL);
    for (const h of [cold, warm]) await provider.destroy({ repository: repo, root: h.root });
  });

  it('never hands one entry out twice under concurrent creates, in one process and across processes', async () => {
    await provider.whenPoolIdle();
    const pool = await readyIds();
    expect(pool).toHaveLength(POOL);
    // Two providers in this process and three child processes, all at once: 3 + 3 + 3 x 2 = 12 creates for 4 entries.
    const other = new LocalSandboxProvider({ backgroundFill: false });
    const children = ['p1', 'p2', 'p3'].map((label) =>
      execFileAsync(TSX, [CLAIM, repo, label, '2', JSON.stringify(SETUP)], { encoding: 'utf8', timeout: 60_000 }).then(({ stdout }) =>
        stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { root: string; origin: string; poolEntry?: string }),
      ),
    );
    const local = [
      ...[0, 1, 2].map(() => provider.create(req('a'))),
      ...[0, 1, 2].map(() => other.create(req('b'))),
    ].map((p) => p.then(async (h) => ({ root: h.root, origin: h.origin!, poolEntry: (await recordOf(h.root)).poolEntry as string | undefined })));
    const all = (await Promise.all([...local, ...children.map((c) => c)])).flat();
    expect(all).toHaveLength(12);
    const fromPool = all.filter((s) => s.origin === 'pool');
    const entries = fromPool.map((s) => s.poolEntry);
    // Each claim took a different entry; every create got its own worktree.
    expect(new Set(entries).size).toBe(entries.length);
    expect(fromPool.length).toBeGreaterThanOrEqual(1);
    for (const e of entries) expect(pool.concat(await readyIds()).concat(entries as string[])).toContain(e);
    expect(new Set(all.map((s) => s.root)).size).toBe(12);
    const paths = registered();
    expect(new Set(paths).size).toBe(paths.length);
    for (const s of all) {
      expect(paths.filter((p) => p === s.root)).toHaveLength(1);
      expect(await exists(path.join(s.root, '.setup-done'))).toBe(true);
      expect(gitIn(s.root, 'status', '--porcelain')).toBe('');
    }
    // No entry is both claimed and still in the pool.
    const left = await readyIds();
    for (const e of entries) expect(left).not.toContain(e);
    await provider.whenPoolIdle();
    for (const s of all) await provider.destroy({ repository: repo, root: s.root });
  });

  it('replaces stale entries: the checkout lockfile changed, the setup commands changed, the base moved on', async () => {
    await provider.whenPoolIdle();
    await fill();
    const original = await readyIds();
    expect(original).toHaveLength(POOL);

    // The user ran `npm install` in the checkout: new lockfile, new dependencies.
    await fs.writeFile(path.join(repo, 'package-lock.json'), '{"lockfileVersion":3,"packages":{"dep":"2"}}\n');
    await fs.writeFile(path.join(repo, 'node_modules/dep/index.js'), 'module.exports = 2;\n');
    const h = await provider.create(req('after-lockfile'));
    expect(h.origin).toBe('cold'); // nothing in the pool fits any more
    expect(await fs.readFile(path.join(h.root, 'node_modules/dep/index.js'), 'utf8')).toBe('module.exports = 2;\n');
    await provider.whenPoolIdle();
    const afterLockfile = await readyIds();
    expect(afterLockfile).toHaveLength(POOL);
    expect(afterLockfile.filter((id) => original.includes(id))).toEqual([]);
    for (const id of afterLockfile) expect(await fs.readFile(path.join(poolDir(repo), id, 'node_modules/dep/index.js'), 'utf8')).toBe('module.exports = 2;\n');
    // Put the checkout back (the lockfile is tracked).
    gitIn(repo, 'checkout', '--', 'package-lock.json');
    await fs.writeFile(path.join(repo, 'node_modules/dep/index.js'), 'module.exports = 1;\n');

    // Other setup commands: entries made with the old ones do not fit.
    const newSetup = { ...SETUP, commands: [...SETUP.commands, 'echo more > .setup-done'] };
    await provider.fillWarmPool({ repository: repo, base: 'main', setup: newSetup, size: POOL });
    const afterSetup = await readyIds();
    expect(afterSetup).toHaveLength(POOL);
    expect(afterSetup.filter((id) => afterLockfile.includes(id))).toEqual([]);

    // main moved on: entries at its old commit are stale once the pool fills for the new one.
    const oldBase = gitIn(repo, 'rev-parse', 'main');
    const wt = path.join(parent, 'mover');
    gitIn(repo, 'worktree', 'add', '-q', wt, '-b', 'mover', 'main');
    await fs.writeFile(path.join(wt, 'new.txt'), 'new\n');
    gitIn(wt, 'add', 'new.txt');
    gitIn(wt, 'commit', '-q', '-m', 'new');
    gitIn(repo, 'update-ref', 'refs/heads/main', gitIn(wt, 'rev-parse', 'HEAD'), oldBase);
    gitIn(repo, 'worktree', 'remove', wt);
    gitIn(repo, 'branch', '-D', 'mover');
    await provider.fillWarmPool({ repository: repo, base: 'main', setup: newSetup, size: POOL });
    const { ready } = await listPool(repo);
    expect(ready).toHaveLength(POOL);
    for (const e of ready) expect(e.baseCommit).not.toBe(oldBase);
    gitIn(repo, 'update-ref', 'refs/heads/main', oldBase); // back, for the checkout picture
    await provider.destroy({ repository: repo, root: h.root });
  });

  it('cleans up after a claimer that died between taking an entry and finishing', async () => {
    await fill();
    const [id] = await readyIds();
    // Claim by hand into a folder, as a dying claimer would: renamed, but git still points at the pool.
    const target = path.join(repo, '.slipway/worktrees/pool/died');
    await fs.mkdir(path.dirname(target), { recursive: true });
    await fs.rename(path.join(poolDir(repo), id), target);
    // Its retried create clears the half-made sandbox and makes it again.
    const h = await provider.create({ ...req('x'), name: 'died', sandboxId: 'pool.died', branch: 'slipway/pool/died' });
    expect(h.root).toBe(target);
    expect(gitIn(target, 'rev-parse', '--abbrev-ref', 'HEAD')).toBe('slipway/pool/died');
    await provider.whenPoolIdle();
    // The entry's stale marker and git's locked record of it go with the next sweep (once old enough).
    const marker = path.join(poolDir(repo), `${id}.ready`);
    const old = new Date(Date.now() - 3600_000);
    await fs.utimes(marker, old, old);
    const common = path.join(repo, '.git', 'worktrees');
    for (const admin of await fs.readdir(common)) {
      const lock = path.join(common, admin, 'locked');
      if (await exists(lock)) await fs.utimes(lock, old, old);
    }
    const swept = await sweepPool(repo);
    expect(swept.removedLeftovers).toContain(id);
    expect(await exists(marker)).toBe(false);
    const paths = registered();
    expect(paths.filter((p) => p.includes(id))).toEqual([]);
    expect(new Set(paths).size).toBe(paths.length);
    await provider.destroy({ repository: repo, root: h.root });
    // Nothing left to claim for a commit the pool has no entries for.
    expect(await claimPoolEntry(repo, { baseCommit: '0'.repeat(40), fingerprint: 'f'.repeat(64) }, path.join(parent, 'nowhere'))).toBeUndefined();
  });

  it("leaves the user's checkout untouched (but for the two files the test itself edited and put back)", async () => {
    await provider.whenPoolIdle();
    // mode, mtime, inode, hash: the test rewrote these two, so only their content must match.
    const contentOnly = (snap: Record<string, string>) => {
      const out = { ...snap };
      for (const key of ['file:package-lock.json', 'file:node_modules/dep/index.js']) out[key] = out[key].split(' ').pop()!;
      return out;
    };
    expect(contentOnly(await snapshotCheckout(repo))).toEqual(contentOnly(before));
  });
});
