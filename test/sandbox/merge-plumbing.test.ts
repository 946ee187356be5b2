/**
 * Merges by git's plumbing (docs/adr/0033): `merge-tree --write-tree` + `commit-tree` + a
 * compare-and-swap `update-ref`, with no merger worktree at all. Each case is played side by side
 * with the porcelain path (`git merge` in a merger worktree, as on a git older than 2.38) on the
 * same stream heads: same merge commit (tree, parents, message), same conflict report, the same
 * change-nothing and retry outcomes. Real git, real worktrees.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActivities, type MergeOutcome } from '../../activities';
import { LocalSandboxProvider, localSandboxRoot } from '../../activities/sandbox/local';
import { MERGER_SANDBOX_NAME } from '../../core/ids';
import { gitIn, makeRepo, tempDir } from './helpers';

describe('merges without a merger worktree', () => {
  let parent: string;
  let repo: string;
  let home: string | undefined;
  const sandboxes = new LocalSandboxProvider({ backgroundFill: false });
  const plumbing = createActivities({ sandboxes });
  const porcelain = createActivities({ sandboxes, mergeTree: false });
  /** The plumbing path's merger: a path where no worktree is. */
  let plain: string;
  /** The porcelain path's merger worktree, on its own integration branch from the same base. */
  let checkedOut: string;
  const tipOf = (group: string) => gitIn(repo, 'rev-parse', `slipway/${group}/integration`);
  /** The commit object without its author and committer lines (their times differ). */
  const shape = (commit: string) =>
    gitIn(repo, 'cat-file', 'commit', commit)
      .split('\n')
      .filter((l) => !/^(author|committer) /.test(l))
      .join('\n');
  let streams = 0;
  /** A stream's head: a sandbox of its own, `files` written and committed there. */
  const streamHead = async (files: Record<string, string>) => {
    const name = `s${++streams}`;
    const s = await sandboxes.create({ sandboxId: name, repository: repo, group: 'streams', name, branch: `slipway/streams/${name}`, base: 'main' });
    for (const [file, text] of Object.entries(files)) {
      await fs.mkdir(path.dirname(path.join(s.root, file)), { recursive: true });
      await fs.writeFile(path.join(s.root, file), text);
    }
    return { branch: s.branch, headCommit: (await plumbing.commitWork({ path: s.root, message: name })).head };
  };
  /** The same request on both paths, each onto its own integration branch's tip. */
  const both = async (head: { branch: string; headCommit: string }, message: string): Promise<[MergeOutcome, MergeOutcome]> => [
    await plumbing.mergeStream({ mergerPath: plain, ...head, message, expectedTip: tipOf('plain') }),
    await porcelain.mergeStream({ mergerPath: checkedOut, ...head, message, expectedTip: tipOf('porc') }),
  ];

  beforeAll(async () => {
    home = process.env.SLIPWAY_HOME;
    parent = tempDir('merge-plumbing');
    process.env.SLIPWAY_HOME = path.join(parent, 'home');
    ({ repo } = makeRepo(parent));
    gitIn(repo, 'branch', 'slipway/plain/integration', 'main');
    plain = localSandboxRoot(repo, 'plain', MERGER_SANDBOX_NAME);
    checkedOut = (await sandboxes.create({ sandboxId: 'porc', repository: repo, group: 'porc', name: MERGER_SANDBOX_NAME, branch: 'slipway/porc/integration', base: 'main' })).root;
  });
  afterAll(async () => {
    if (home === undefined) delete process.env.SLIPWAY_HOME;
    else process.env.SLIPWAY_HOME = home;
    await fs.rm(parent, { recursive: true, force: true });
  });

  it("makes git merge's merge commit: same tree, the tip then the stream's head as parents, the same message", async () => {
    const head = await streamHead({ 'one.txt': 'one\n', 'src/deep/two.txt': 'two\n' });
    const [tipA, tipB] = [tipOf('plain'), tipOf('porc')];
    // Whitespace git merge -F cleans up: leading and trailing blank lines, runs of them, trailing spaces.
    const message = '\n\nslipway: merge stream one  \n\n\n\n# kept: no editor strips comments\nbody\t \n\n';
    const [a, b] = await both(head, message);
    expect(a).toMatchObject({ status: 'merged', previous: tipA, alreadyMerged: false });
    expect(b).toMatchObject({ status: 'merged', previous: tipB, alreadyMerged: false });
    const [commitA, commitB] = [tipOf('plain'), tipOf('porc')];
    expect(a.status === 'merged' && a.commit).toBe(commitA);
    expect(gitIn(repo, 'rev-list', '--no-walk', '--parents', commitA)).toBe(`${commitA} ${tipA} ${head.headCommit}`);
    expect(shape(commitA)).toBe(shape(commitB));
    expect(gitIn(repo, 'log', '-1', '--format=%B', commitA)).toBe('slipway: merge stream one\n\n# kept: no editor strips comments\nbody');
    // No worktree was made for it.
    expect(existsSync(plain)).toBe(false);
  });

  it('reports a conflict as git merge does (the conflicted files) and moves nothing', async () => {
    const ours = await streamHead({ 'src/a.txt': 'one\ntwo\nours\n' });
    const theirs = await streamHead({ 'src/a.txt': 'one\ntwo\ntheirs\n', 'clean.txt': 'fine\n' });
    const landed = await both(ours, 'merge ours');
    expect(landed.map((m) => m.status)).toEqual(['merged', 'merged']);
    const [tipA, tipB] = [tipOf('plain'), tipOf('porc')];
    const [a, b] = await both(theirs, 'merge theirs');
    expect(a).toMatchObject({ status: 'conflict', files: ['src/a.txt'] });
    expect(b).toMatchObject({ status: 'conflict', files: ['src/a.txt'] });
    expect(a.status === 'conflict' && a.details).toMatch(/CONFLICT \(content\): Merge conflict in src\/a\.txt/);
    expect([tipOf('plain'), tipOf('porc')]).toEqual([tipA, tipB]);
  });

  it('drops a merge that changes nothing, and finds a merge again on a retried attempt (never a second merge)', async () => {
    const first = await streamHead({ 'same.txt': 'same\n' });
    const twin = await streamHead({ 'same.txt': 'same\n' });
    const [a] = await both(first, 'merge first');
    expect(a.status).toBe('merged');
    const tip = tipOf('plain');
    const [unchangedA, unchangedB] = await both(twin, 'merge twin');
    expect(unchangedA).toEqual(unchangedB);
    expect(unchangedA).toMatchObject({ status: 'no_changes', summary: expect.stringContaining('changes nothing on the integration branch') });
    expect(tipOf('plain')).toBe(tip);
    // A retried attempt (its worker died after update-ref, before it reported).
    const again = await plumbing.mergeStream({ mergerPath: plain, ...first, message: 'merge first', expectedTip: a.status === 'merged' ? a.previous : '' });
    expect(again).toEqual({ ...a, alreadyMerged: true });
    expect(tipOf('plain')).toBe(tip);
  });

  it('refuses an integration branch moved outside the merge queue, and a head git cannot merge is not a conflict', async () => {
    const head = await streamHead({ 'refused.txt': 'x\n' });
    const tip = tipOf('plain');
    const refused = await plumbing.mergeStream({ mergerPath: plain, ...head, message: 'm', expectedTip: gitIn(repo, 'rev-parse', 'main') }).catch((e: Error) => e);
    expect((refused as Error).message).toMatch(/not at .* where the merge queue left it/);
    const missing = await plumbing.mergeStream({ mergerPath: plain, branch: 'x', headCommit: 'f'.repeat(40), message: 'm', expectedTip: tip }).catch((e: Error) => e);
    expect((missing as Error).message).toMatch(/merging f{10}.* failed/);
    expect(tipOf('plain')).toBe(tip);
  });

  it("a batch retried after a killed attempt undoes that attempt's merges and makes them again, one merge commit per stream (ADR 0031, 3)", async () => {
    const heads = [await streamHead({ 'b1.txt': '1\n' }), await streamHead({ 'b2.txt': '2\n' }), await streamHead({ 'b3.txt': '3\n' })];
    const start = tipOf('plain');
    const items = heads.map((h, i) => ({ ...h, message: `merge b${i + 1}` }));
    // The killed attempt: two merges made, nothing reported.
    let tip = start;
    for (const item of items.slice(0, 2)) {
      const m = await plumbing.mergeStream({ mergerPath: plain, ...item, expectedTip: tip });
      tip = m.status === 'merged' ? m.commit : tip;
    }
    const batch = await plumbing.mergeBatch({ mergerPath: plain, expectedTip: start, items, gates: [] });
    expect(batch.merges.map((m) => m.status === 'merged' && !m.alreadyMerged)).toEqual([true, true, true]);
    const line = gitIn(repo, 'rev-list', '--first-parent', '--parents', `${start}..slipway/plain/integration`).split('\n').reverse();
    expect(line.map((l) => l.split(' ')[2])).toEqual(heads.map((h) => h.headCommit));
    expect(line[0]!.split(' ')[1]).toBe(start);
    expect(existsSync(plain)).toBe(false);
  });

  it('a batch whose gates fail is reverted in the merger worktree the gates ran in, which follows the ref', async () => {
    const withTree = localSandboxRoot(repo, 'gated', MERGER_SANDBOX_NAME);
    await sandboxes.create({ sandboxId: 'gated', repository: repo, group: 'gated', name: MERGER_SANDBOX_NAME, branch: 'slipway/gated/integration', base: 'main' });
    const heads = [await streamHead({ 'g1.txt': '1\n' }), await streamHead({ 'g2.txt': '2\n' })];
    const start = tipOf('gated');
    const items = heads.map((h, i) => ({ ...h, message: `merge g${i + 1}` }));
    // The gate sees both streams' files: the worktree was brought to the merged tree.
    const passed = await plumbing.mergeBatch({ mergerPath: withTree, expectedTip: start, items: items.slice(0, 1), gates: [{ name: 'sees', command: 'test -f g1.txt', timeout_seconds: 30 }] });
    expect(passed.gates?.passed).toBe(true);
    const tip = tipOf('gated');
    const failed = await plumbing.mergeBatch({ mergerPath: withTree, expectedTip: tip, items: items.slice(1), gates: [{ name: 'no', command: 'test -f g2.txt && touch leftover && exit 3', timeout_seconds: 30 }] });
    expect(failed).toMatchObject({ gates: { passed: false }, reset: true });
    expect(tipOf('gated')).toBe(tip);
    expect(gitIn(withTree, 'status', '--porcelain', '--untracked-files=all')).toBe('');
    expect(existsSync(path.join(withTree, 'g2.txt'))).toBe(false);
    expect(existsSync(path.join(withTree, 'g1.txt'))).toBe(true);
  });

  it('prepareObjective makes the integration branch alone when asked (withoutMerger), and not when merges need a worktree', async () => {
    const made = await plumbing.prepareObjective({ objectiveId: 'alone', repository: repo, baseBranch: 'main', deferMerger: true, withoutMerger: true });
    expect(made).toMatchObject({ withoutMerger: true, integrationTip: gitIn(repo, 'rev-parse', 'main') });
    expect(tipOf('alone')).toBe(made.baseCommit);
    expect(existsSync(made.mergerPath)).toBe(false);
    // A retried prepare finds its branch.
    expect(await plumbing.prepareObjective({ objectiveId: 'alone', repository: repo, baseBranch: 'main', deferMerger: true, withoutMerger: true })).toEqual(made);
    // A git without merge-tree --write-tree: the workflow makes the merger worktree as before.
    const older = await porcelain.prepareObjective({ objectiveId: 'older', repository: repo, baseBranch: 'main', deferMerger: true, withoutMerger: true });
    expect(older.withoutMerger).toBeUndefined();
    expect(gitIn(repo, 'branch', '--list', 'slipway/older/integration')).toBe('');
    // finishObjective with no merger worktree: the branch stays, nothing fails.
    expect(await plumbing.finishObjective({ repository: repo, objectiveId: 'alone' })).toEqual({ integrationHead: made.baseCommit });
  });
});

describe('hostile trees: attributes a stream commits choose nothing on the host', () => {
  let parent: string;
  const sandboxes = new LocalSandboxProvider({ backgroundFill: false });
  const activities = createActivities({ sandboxes });
  afterAll(async () => {
    await fs.rm(parent, { recursive: true, force: true });
  });

  it("a merge driver of the repository's own config, named by a stream's .gitattributes, never runs in a merge", async () => {
    parent = tempDir('merge-attributes');
    const { repo } = makeRepo(parent);
    const marker = path.join(parent, 'driver-ran');
    // The user's config defines a driver (the stream cannot add config: its git state is its own).
    gitIn(repo, 'config', 'merge.slipwaytest.driver', `touch ${marker}; exit 1`);
    const head = async (name: string, text: string) => {
      const s = await sandboxes.create({ sandboxId: name, repository: repo, group: 'attr', name, branch: `slipway/attr/${name}`, base: 'main' });
      await fs.writeFile(path.join(s.root, '.gitattributes'), '* merge=slipwaytest\n');
      await fs.writeFile(path.join(s.root, 'src/a.txt'), text);
      return { branch: s.branch, headCommit: (await activities.commitWork({ path: s.root, message: name })).head };
    };
    const [first, second] = [await head('first', 'one\ntwo\nfirst\n'), await head('second', 'one\ntwo\nsecond\n')];
    gitIn(repo, 'branch', 'slipway/attr/integration', 'main');
    const mergerPath = localSandboxRoot(repo, 'attr', MERGER_SANDBOX_NAME);
    const landed = await activities.mergeStream({ mergerPath, ...first, message: 'merge first', expectedTip: gitIn(repo, 'rev-parse', 'main') });
    expect(landed.status).toBe('merged');
    // The integration branch now carries the stream's .gitattributes naming the driver; the next
    // merge conflicts in a file it covers: git's own merge decides, the driver is not run.
    const conflicted = await activities.mergeStream({ mergerPath, ...second, message: 'merge second', expectedTip: landed.status === 'merged' ? landed.commit : '' });
    expect(conflicted).toMatchObject({ status: 'conflict', files: ['src/a.txt'] });
    expect(existsSync(marker)).toBe(false);
  });
});
