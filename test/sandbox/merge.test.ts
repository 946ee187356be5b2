/**
 * The merge activity: long texts travel by file (never argv), failures are classified by what
 * happened (a conflict only when files conflict), and no-change merges are not merges.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createActivities } from '../../activities';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { gitIn, makeRepo, tempDir } from './helpers';

describe('mergeStream', () => {
  let parent: string;
  let repo: string;
  let merger: SandboxHandle;
  let stream: SandboxHandle;
  const sandboxes = new LocalSandboxProvider({ backgroundFill: false });
  const activities = createActivities({ sandboxes });

  beforeAll(async () => {
    parent = tempDir('merge');
    ({ repo } = makeRepo(parent));
    merger = await sandboxes.create({ sandboxId: 'm', repository: repo, group: 'obj', name: '_merger', branch: 'slipway/obj/integration', base: 'main' });
    stream = await sandboxes.create({ sandboxId: 's', repository: repo, group: 'obj', name: 'one', branch: 'slipway/obj/one', base: 'main' });
  });
  afterAll(async () => {
    await fs.rm(parent, { recursive: true, force: true });
  });

  it('merges with a 3 MB message (the objective text), which no argv could carry', async () => {
    await fs.writeFile(path.join(stream.root, 'one.txt'), 'one\n');
    const { head } = await activities.commitWork({ path: stream.root, message: 'one' });
    const message = `slipway: merge stream one\n\n${'x'.repeat(3 * 1024 * 1024)}`;
    const merged = await activities.mergeStream({ mergerPath: merger.root, branch: stream.branch, headCommit: head, message, expectedTip: merger.headCommit });
    expect(merged.status).toBe('merged');
    expect(Number(gitIn(repo, 'cat-file', '-s', 'slipway/obj/integration'))).toBeGreaterThan(3 * 1024 * 1024);
  });

  it('reports a failure that is not a conflict as what it is, never as a conflict', async () => {
    const missing = 'f'.repeat(40);
    const failed = await activities.mergeStream({ mergerPath: merger.root, branch: 'x', headCommit: missing, message: 'm' }).catch((e: Error) => e);
    expect(failed).toBeInstanceOf(Error);
    expect((failed as Error).message).toMatch(/merging f{10}.* failed/);
    expect((failed as Error).message).not.toMatch(/conflict/);
  });

  it('reports a stream head that brings nothing as no_changes', async () => {
    const tip = gitIn(repo, 'rev-parse', 'slipway/obj/integration');
    const outcome = await activities.mergeStream({ mergerPath: merger.root, branch: 'slipway/obj/integration', headCommit: gitIn(repo, 'rev-parse', 'main'), message: 'm' });
    expect(outcome.status).toBe('no_changes');
    expect(gitIn(repo, 'rev-parse', 'slipway/obj/integration')).toBe(tip);
  });
});

describe('mergeWithGates', () => {
  let parent: string;
  let repo: string;
  let merger: SandboxHandle;
  const sandboxes = new LocalSandboxProvider({ backgroundFill: false });
  const activities = createActivities({ sandboxes });
  const integration = () => gitIn(repo, 'rev-parse', 'slipway/obj2/integration');
  const streamHead = async (name: string) => {
    const s = await sandboxes.create({ sandboxId: name, repository: repo, group: 'obj2', name, branch: `slipway/obj2/${name}`, base: 'main' });
    await fs.writeFile(path.join(s.root, `${name}.txt`), `${name}\n`);
    return { branch: s.branch, headCommit: (await activities.commitWork({ path: s.root, message: name })).head };
  };

  beforeAll(async () => {
    parent = tempDir('merge-gates');
    ({ repo } = makeRepo(parent));
    merger = await sandboxes.create({ sandboxId: 'm2', repository: repo, group: 'obj2', name: '_merger', branch: 'slipway/obj2/integration', base: 'main' });
  });
  afterAll(async () => {
    await fs.rm(parent, { recursive: true, force: true });
  });

  it('merges, runs the post-merge gates on the merged tree, and keeps the merge when they pass', async () => {
    const tip = integration();
    const head = await streamHead('pass');
    const done = await activities.mergeWithGates({ mergerPath: merger.root, ...head, message: 'merge pass', expectedTip: tip, gates: [{ name: 'sees', command: 'test -f pass.txt', timeout_seconds: 30 }] });
    expect(done.merge).toMatchObject({ status: 'merged', previous: tip, alreadyMerged: false });
    expect(done.gates).toEqual({ passed: true, failureReport: '' });
    expect(done.reset).toBeUndefined();
    expect(integration()).toBe(done.merge.status === 'merged' ? done.merge.commit : '');
  });

  it('reverts the merge when the gates fail, with their report', async () => {
    const tip = integration();
    const head = await streamHead('fail');
    const done = await activities.mergeWithGates({ mergerPath: merger.root, ...head, message: 'merge fail', expectedTip: tip, gates: [{ name: 'no', command: 'echo broken; exit 3', timeout_seconds: 30 }] });
    expect(done.merge.status).toBe('merged');
    expect(done.gates?.passed).toBe(false);
    expect(done.gates?.failureReport).toContain('broken');
    expect(done.reset).toBe(true);
    expect(integration()).toBe(tip);
  });

  it('run again after a crash past its merge (a retried attempt), finds the merge instead of making a second one', async () => {
    const tip = integration();
    const head = await streamHead('again');
    const request = { mergerPath: merger.root, ...head, message: 'merge again', expectedTip: tip, gates: [{ name: 'ok', command: 'true', timeout_seconds: 30 }] };
    // The first attempt merged, then its worker died in the gates: only the merge happened.
    const first = await activities.mergeStream(request);
    const retried = await activities.mergeWithGates(request);
    expect(retried.merge).toMatchObject({ status: 'merged', previous: tip, alreadyMerged: true });
    expect(retried.gates?.passed).toBe(true);
    expect(first.status === 'merged' && retried.merge.status === 'merged' && retried.merge.commit === first.commit).toBe(true);
    expect(gitIn(repo, 'rev-list', '--count', '--merges', `${tip}..slipway/obj2/integration`)).toBe('1');
  });
});
