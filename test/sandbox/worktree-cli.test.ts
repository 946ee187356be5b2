/**
 * `slipway worktree list|review|merge|discard` and `slipway template create|check|update`, through
 * the real CLI on real repositories. Merging into the user's branch is refused (exit 2, nothing
 * changed) unless the checkout is clean.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { readTemplate } from '../../activities/sandbox/template';
import { slipway } from '../helpers/cli';
import { pictureCheckout } from '../helpers/repo';
import { exists, gitIn, IDENTITY_ENV, makeRepo, tempDir } from './helpers';

const provider = new LocalSandboxProvider();
let parent: string;
let home: string;
const env = () => ({ SLIPWAY_HOME: home, TEMPORAL_ADDRESS: '', SLIPWAY_TEMPORAL_PORT: '1' });

async function stream(repo: string, objective: string, name: string, files: Record<string, string>, base = 'main'): Promise<SandboxHandle> {
  const h = await provider.create({ sandboxId: `${objective}.${name}`, repository: repo, group: objective, name, branch: `slipway/${objective}/${name}`, base });
  for (const [file, content] of Object.entries(files)) await provider.writeFile(h, file, content);
  const r = await provider.exec(h, { command: `git add -A && git commit -q -m "${name}: ${Object.keys(files).join(', ')}"`, shell: true, env: IDENTITY_ENV });
  expect(r.exitCode, r.stderr).toBe(0);
  return h;
}

beforeAll(() => {
  parent = tempDir('wt-cli');
  home = path.join(parent, 'home');
});
afterAll(async () => {
  await fs.rm(parent, { recursive: true, force: true });
});

describe('slipway worktree', () => {
  let repo: string;
  let feat: SandboxHandle;

  beforeAll(async () => {
    ({ repo } = makeRepo(parent, 'verbs'));
    gitIn(repo, 'config', 'user.name', 'User');
    gitIn(repo, 'config', 'user.email', 'user@example.com');
    feat = await stream(repo, 'obj1', 'feat', { 'src/feat.txt': 'feature\n', 'docs/feat.md': '# feat\n' });
  });

  it('lists streams with their worktree and commits ahead, from the repository or from inside a worktree', async () => {
    const r = await slipway(['worktree', 'list', '--json'], env(), repo);
    expect(r.code, r.stderr).toBe(0);
    const rows = JSON.parse(r.stdout);
    expect(rows).toEqual([expect.objectContaining({ objective: 'obj1', stream: 'feat', branch: 'slipway/obj1/feat', worktree: feat.root, ahead: 1, dirty: false })]);
    const inside = await slipway(['worktree', 'list'], env(), path.join(feat.root, 'src'));
    expect(inside.code, inside.stderr).toBe(0);
    expect(inside.stdout).toMatch(/obj1\s+feat\s+1 ahead of/);
  });

  it('reviews a stream: commits, diff against its base, limited to paths after --, and uncommitted work', async () => {
    await fs.writeFile(path.join(feat.root, 'src/feat.txt'), 'feature, edited\n');
    const r = await slipway(['worktree', 'review', 'feat'], env(), repo);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`branch slipway/obj1/feat`);
    expect(r.stdout).toContain('feat: src/feat.txt, docs/feat.md');
    expect(r.stdout).toContain('+++ b/src/feat.txt');
    expect(r.stdout).toContain('+++ b/docs/feat.md');
    expect(r.stdout).toContain('uncommitted in the worktree');
    expect(r.stdout).toContain('+feature, edited');
    const limited = await slipway(['worktree', 'review', 'feat', '--', 'docs'], env(), repo);
    expect(limited.stdout).toContain('+++ b/docs/feat.md');
    expect(limited.stdout).not.toContain('+++ b/src/feat.txt');
    await fs.writeFile(path.join(feat.root, 'src/feat.txt'), 'feature\n');
    const missing = await slipway(['worktree', 'review', 'nope'], env(), repo);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain('no stream "nope"');
  });

  it('refuses to merge into a dirty checkout: exit 2, nothing changed', async () => {
    // Each case with the paths the refusal must name, exactly (a first path once lost its first character).
    const cases: Array<[() => Promise<void>, string[], string]> = [
      [async () => fs.appendFile(path.join(repo, 'README.md'), 'unstaged\n'), ['ff', 'squash', 'merge'], '1 changed or untracked path: README.md'],
      [async () => fs.writeFile(path.join(repo, 'untracked.txt'), 'new\n'), ['merge'], '1 changed or untracked path: untracked.txt'],
      [
        async () => {
          await fs.writeFile(path.join(repo, 'staged.txt'), 'staged\n');
          gitIn(repo, 'add', 'staged.txt');
        },
        ['squash'],
        '1 changed or untracked path: staged.txt',
      ],
      [
        async () => {
          gitIn(repo, 'mv', 'README.md', 'READ ME.md');
          await fs.writeFile(path.join(repo, 'naïve file.txt'), 'x\n');
        },
        ['merge'],
        '2 changed or untracked paths: READ ME.md, naïve file.txt',
      ],
    ];
    for (const [dirty, strategies, named] of cases) {
      await dirty();
      const before = pictureCheckout(repo);
      for (const strategy of strategies) {
        const r = await slipway(['worktree', 'merge', 'feat', '--strategy', strategy], env(), repo);
        expect(r.code, strategy).toBe(2);
        expect(r.stderr).toMatch(/refusing to merge slipway\/obj1\/feat: the checkout is not clean .*Nothing was changed/);
        expect(r.stderr).toContain(`the checkout is not clean (${named}); commit or stash first`);
        expect(pictureCheckout(repo)).toEqual(before);
      }
      gitIn(repo, 'reset', '-q', '--hard');
      gitIn(repo, 'clean', '-fdq');
    }
  });

  it('fast-forwards the current branch when it can, and refuses (exit 2, nothing changed) when it cannot', async () => {
    const main = gitIn(repo, 'rev-parse', 'HEAD');
    const r = await slipway(['worktree', 'merge', 'feat', '--strategy', 'ff'], env(), repo);
    expect(r.code, r.stderr).toBe(0);
    expect(gitIn(repo, 'rev-parse', 'HEAD')).toBe(gitIn(repo, 'rev-parse', 'slipway/obj1/feat'));
    expect(gitIn(repo, 'rev-parse', 'HEAD^')).toBe(main);
    expect(await fs.readFile(path.join(repo, 'src/feat.txt'), 'utf8')).toBe('feature\n');
    expect(gitIn(repo, 'status', '--porcelain')).toBe('');

    const diverged = await stream(repo, 'obj1', 'other', { 'other.txt': 'other\n' }, main);
    const before = pictureCheckout(repo);
    const ff = await slipway(['worktree', 'merge', 'other', '--strategy', 'ff'], env(), repo);
    expect(ff.code).toBe(2);
    expect(ff.stderr).toContain('cannot fast-forward');
    expect(pictureCheckout(repo)).toEqual(before);

    const squash = await slipway(['worktree', 'merge', 'other', '--strategy', 'squash'], env(), repo);
    expect(squash.code, squash.stderr).toBe(0);
    expect(gitIn(repo, 'rev-list', '--count', 'HEAD^@')).toBe(gitIn(repo, 'rev-list', '--count', 'HEAD^')); // one parent: a squash
    expect(gitIn(repo, 'log', '-1', '--format=%s')).toBe('slipway: squash stream other of objective obj1');
    expect(gitIn(repo, 'log', '-1', '--format=%an')).toBe('User');
    expect(await fs.readFile(path.join(repo, 'other.txt'), 'utf8')).toBe('other\n');
    await provider.destroy({ repository: repo, root: diverged.root });
  });

  it('merges with a merge commit, and puts the checkout back exactly on a conflict (exit 1)', async () => {
    const base = gitIn(repo, 'rev-parse', 'HEAD');
    await stream(repo, 'obj2', 'mergeme', { 'merged.txt': 'm\n' }, base);
    const clash = await stream(repo, 'obj2', 'clash', { 'README.md': 'theirs\n' }, base);
    await fs.writeFile(path.join(repo, 'README.md'), 'ours\n');
    gitIn(repo, 'commit', '-qam', 'ours');

    const m = await slipway(['worktree', 'merge', 'mergeme', '--strategy', 'merge'], env(), repo);
    expect(m.code, m.stderr).toBe(0);
    expect(gitIn(repo, 'log', '-1', '--format=%P').split(' ')).toHaveLength(2);
    expect(gitIn(repo, 'log', '-1', '--format=%s')).toBe('slipway: merge stream mergeme of objective obj2');

    const before = pictureCheckout(repo);
    const c = await slipway(['worktree', 'merge', 'clash', '--strategy', 'merge'], env(), repo);
    expect(c.code).toBe(1);
    expect(c.stderr).toContain('conflicts in README.md');
    expect(pictureCheckout(repo)).toEqual(before);
    const cs = await slipway(['worktree', 'merge', 'clash', '--strategy', 'squash'], env(), repo);
    expect(cs.code).toBe(1);
    expect(pictureCheckout(repo)).toEqual(before);
    await provider.destroy({ repository: repo, root: clash.root });
  });

  it('asks for --objective when a stream name is ambiguous, and discards worktree and branch', async () => {
    const again = await stream(repo, 'obj3', 'feat', { 'x.txt': 'x\n' });
    const ambiguous = await slipway(['worktree', 'discard', 'feat'], env(), repo);
    expect(ambiguous.code).toBe(2);
    expect(ambiguous.stderr).toContain('pick one with --objective');
    // Temporal cannot be reached here: whether obj3 still runs is unknown, so only --force discards.
    const unsure = await slipway(['worktree', 'discard', 'feat', '--objective', 'obj3'], env(), repo);
    expect(unsure.code).toBe(2);
    expect(unsure.stderr).toContain('could not ask Temporal whether objective obj3 still runs');
    expect(unsure.stderr).toContain('--force');
    expect(await exists(again.root)).toBe(true);
    const head = gitIn(repo, 'rev-parse', 'slipway/obj3/feat');
    const d = await slipway(['worktree', 'discard', 'feat', '--objective', 'obj3', '--force'], env(), repo);
    expect(d.code, d.stderr).toBe(0);
    expect(d.stdout).toContain('discarded slipway/obj3/feat (1 commit past its base');
    expect(await exists(again.root)).toBe(false);
    expect(gitIn(repo, 'branch', '--list', 'slipway/obj3/feat')).toBe('');
    // The branch went to the trash refs, and the printed command brings it back.
    const undo = /undo with: (git branch \S+ (\S+))/.exec(d.stdout);
    expect(undo?.[2]).toMatch(/^refs\/slipway-trash\/slipway\/obj3\/feat\/\d+$/);
    expect(gitIn(repo, 'rev-parse', undo![2])).toBe(head);
    gitIn(repo, 'branch', 'slipway/obj3/feat', undo![2]);
    expect(gitIn(repo, 'rev-parse', 'slipway/obj3/feat')).toBe(head);
    gitIn(repo, 'branch', '-D', 'slipway/obj3/feat');
    expect(gitIn(repo, 'branch', '--list', 'slipway/obj1/feat')).not.toBe('');
    expect(await exists(feat.root)).toBe(true);
  });
});

describe('slipway template', () => {
  let repo: string;
  const setupArgs = ['--setup', 'echo built >> .built', '--verify', 'test -f .built', '--verify', 'test -f node_modules/dep.js'];

  beforeAll(async () => {
    ({ repo } = makeRepo(parent, 'snap'));
    await fs.writeFile(path.join(repo, '.gitignore'), 'node_modules/\n.built\n');
    await fs.writeFile(path.join(repo, 'package-lock.json'), '{"v":1}\n');
    gitIn(repo, 'add', '-A');
    gitIn(repo, 'commit', '-q', '-m', 'lockfile');
    await fs.mkdir(path.join(repo, 'node_modules'));
    await fs.writeFile(path.join(repo, 'node_modules/dep.js'), 'dep\n');
  });

  it('creates, checks, reports staleness (lockfile, setup commands) and updates the template', async () => {
    const missing = await slipway(['template', 'check'], env(), repo);
    expect(missing.code).toBe(1);
    expect(missing.stdout).toContain('missing');

    const created = await slipway(['template', 'create', ...setupArgs], env(), repo);
    expect(created.code, created.stderr).toBe(0);
    const manifest = (await readTemplate(repo))!;
    expect(await fs.readFile(path.join(manifest.root, '.built'), 'utf8')).toBe('built\n');
    expect(await exists(path.join(manifest.root, 'node_modules/dep.js'))).toBe(true);
    expect((await slipway(['template', 'check'], env(), repo)).code).toBe(0);
    const again = await slipway(['template', 'create', ...setupArgs], env(), repo);
    expect(again.code).toBe(0);
    expect(again.stdout).toContain('a fresh template exists');

    // A sandbox with the same setup starts from the template: its files copied, setup only verified.
    const h = await provider.create({
      sandboxId: 'snap.one', repository: repo, group: 'snap', name: 'one', branch: 'slipway/snap/one', base: 'main',
      setup: { commands: ['echo built >> .built'], verify: ['test -f .built', 'test -f node_modules/dep.js'] },
    });
    expect(h.origin).toBe('template');
    expect(h.setup?.commandsRun).toBe(0);
    expect(await fs.readFile(path.join(h.root, '.built'), 'utf8')).toBe('built\n');
    await provider.destroy({ repository: repo, root: h.root });

    const otherSetup = await slipway(['template', 'check', '--setup', 'npm ci', '--json'], env(), repo);
    expect(otherSetup.code).toBe(1);
    expect(JSON.parse(otherSetup.stdout)).toMatchObject({ state: 'stale', reasons: ['project_setup commands changed'] });

    await fs.writeFile(path.join(repo, 'package-lock.json'), '{"v":2}\n');
    gitIn(repo, 'commit', '-qam', 'bump deps');
    const stale = await slipway(['template', 'check'], env(), repo);
    expect(stale.code).toBe(1);
    expect(stale.stdout).toContain('lockfile package-lock.json changed');
    const refused = await slipway(['template', 'create', ...setupArgs], env(), repo);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('slipway template update');

    const updated = await slipway(['template', 'update'], env(), repo);
    expect(updated.code, updated.stderr).toBe(0);
    expect(updated.stdout).toContain('lockfile package-lock.json changed');
    const now = (await readTemplate(repo))!;
    expect(now.id).not.toBe(manifest.id);
    expect(now.setup?.commands).toEqual(['echo built >> .built']); // the recorded setup
    expect(await exists(manifest.root)).toBe(false); // the old template is gone
    // The old name still works, and says it is the old name.
    const legacy = await slipway(['snapshot', 'check'], env(), repo);
    expect(legacy.code).toBe(0);
    expect(legacy.stderr).toContain('`slipway snapshot` is now `slipway template`');
    const noop = await slipway(['template', 'update'], env(), repo);
    expect(noop.stdout).toContain('already fresh');
    // Templates are locked worktrees of their own, never listed as sandboxes.
    expect(await provider.list(repo)).toEqual([]);
    expect(gitIn(repo, 'status', '--porcelain')).toBe('');
  });
});
