/**
 * The warm pool of container sandboxes (container-pool.ts, ADR 0025) on real podman: entries
 * claimed under a lock by concurrent creates (none twice), refilled in the background, retired
 * when the image changes; a pooled sandbox is a sandbox like any other (suspend and restore,
 * list, collect, destroy).
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { containerName, ContainerSandboxProvider, CONTAINERS_DIR, defaultSandboxImage } from '../../activities/sandbox/container';
import { containerPoolDir, containerPoolEntries, containerPoolKey, drainContainerPool } from '../../activities/sandbox/container-pool';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { exists, gitIn, makeRepo, podman, podmanOk, sandboxRequest, tempDir } from './helpers';

const containerId = (name: string) => podman('inspect', '--type', 'container', '--format', '{{.ID}}', name);
const containerGone = (name: string) => !podmanOk('inspect', '--type', 'container', '--format', '{{.ID}}', name);

describe('container warm pool (podman)', () => {
  let parent: string;
  let repo: string;
  let containers: string;
  const settings = { network: false, limits: { pids: 128 } };
  const provider = new ContainerSandboxProvider({ engine: 'podman', defaults: settings });
  const image = defaultSandboxImage()!;
  const alias = `${image.split(':')[0]}:pool-test-${process.pid}`;
  const key = containerPoolKey({ kind: 'podman', image, settings });
  const made: SandboxHandle[] = [];

  beforeAll(async () => {
    parent = tempDir('cpool');
    ({ repo } = makeRepo(parent));
    containers = path.join(repo, CONTAINERS_DIR);
  });

  afterAll(async () => {
    await provider.whenPoolIdle();
    for (const h of made) await provider.destroy({ repository: repo, root: h.root }).catch(() => undefined);
    if (containers) await drainContainerPool(containers);
    try {
      podman('rmi', alias);
    } catch {
      // never tagged
    }
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('concurrent creates claim each pooled container at most once; the pool refills in the background', async () => {
    expect(await provider.fillWarmPool({ repository: repo, base: 'main', size: 3 })).toMatchObject({ made: 3 });
    const pooled = await containerPoolEntries(containers, key);
    expect(pooled).toHaveLength(3);
    const pooledIds = new Set(pooled.map((e) => containerId(e.container)));

    const handles = await Promise.all([1, 2, 3, 4, 5].map((i) => provider.create({ ...sandboxRequest(repo, `c${i}`, { group: 'pool' }), warmPool: 3 })));
    made.push(...handles);
    expect(handles.map((h) => h.origin).sort()).toEqual(['cold', 'cold', 'pool', 'pool', 'pool']);
    const ids = handles.map((h) => containerId(containerName(h.root)));
    expect(new Set(ids).size).toBe(5);
    // The pooled sandboxes run exactly the three pooled containers, one each.
    expect(new Set(handles.filter((h) => h.origin === 'pool').map((h) => containerId(containerName(h.root))))).toEqual(pooledIds);
    // Each has a workspace of its own, on its own branch.
    await Promise.all(handles.map((h) => provider.writeFile(h, 'mine.txt', h.sandboxId)));
    for (const h of handles) {
      const r = await provider.exec(h, { command: '/bin/sh', args: ['-c', 'cat mine.txt; echo; git symbolic-ref --short HEAD; ls'] });
      expect(r.stdout.split('\n').slice(0, 2)).toEqual([h.sandboxId, h.branch]);
      expect(r.stdout).toContain('README.md');
    }

    await provider.whenPoolIdle();
    const refilled = await containerPoolEntries(containers, key);
    expect(refilled).toHaveLength(3);
    expect(refilled.some((e) => pooledIds.has(containerId(e.container)))).toBe(false);
  });

  it('a pooled sandbox suspends and restores (its old mount paths lead to its own), is listed under its own root, collects, and destroy leaves nothing', async () => {
    const h = made.find((m) => m.origin === 'pool')!;
    const record = JSON.parse(await fs.readFile(`${h.root}.json`, 'utf8')) as { pooledAs: string };
    const dir = containerPoolDir(containers);
    expect((await fs.lstat(path.join(dir, record.pooledAs))).isSymbolicLink()).toBe(true);
    await provider.suspend!(h, { templateIgnored: false });
    expect(podman('inspect', '--format', '{{.State.Status}}', containerName(h.root))).toBe('exited');
    await provider.restore!(h, { templateIgnored: false });
    expect((await provider.exec(h, { command: 'cat', args: ['mine.txt'] })).stdout).toBe(h.sandboxId);
    expect((await provider.list(repo)).map((s) => s.root).sort()).toEqual(made.map((m) => m.root).sort());
    expect((await provider.exec(h, { command: '/bin/sh', args: ['-c', 'git add mine.txt && git -c user.name=a -c user.email=a@a commit -qm mine && git rev-parse HEAD'] })).exitCode).toBe(0);
    const { head } = await provider.collect(h);
    expect(gitIn(repo, 'rev-parse', `refs/heads/${h.branch}`)).toBe(head);

    await provider.destroy({ repository: repo, root: h.root });
    made.splice(made.indexOf(h), 1);
    expect(containerGone(containerName(h.root))).toBe(true);
    for (const suffix of ['', '.in', '.json', '.claimed']) expect(await exists(path.join(dir, `${record.pooledAs}${suffix}`))).toBe(false);
    expect(await exists(h.root)).toBe(false);
  });

  it('entries of another image are retired by the next fill', async () => {
    const before = await containerPoolEntries(containers, key);
    expect(before).toHaveLength(3);
    podman('tag', image, alias);
    const rebuilt = new ContainerSandboxProvider({ engine: 'podman', image: alias, defaults: settings });
    expect(await rebuilt.fillWarmPool({ repository: repo, base: 'main', size: 1 })).toEqual({ made: 1, retired: 3 });
    for (const e of before) expect(containerGone(e.container)).toBe(true);
    expect(await containerPoolEntries(containers, key)).toEqual([]);
    const h = await rebuilt.create({ ...sandboxRequest(repo, 'rebuilt', { group: 'pool' }), warmPool: 1 });
    made.push(h);
    expect(h.origin).toBe('pool');
    await rebuilt.whenPoolIdle();
  });
  it('entries hold the workspace prepared at the base; a claim after the repository moved on fetches only what is new and ends as a cold start does', async () => {
    await provider.whenPoolIdle();
    await drainContainerPool(containers);
    const base = gitIn(repo, 'rev-parse', 'main');
    expect(await provider.fillWarmPool({ repository: repo, base: 'main', size: 1 })).toMatchObject({ made: 1 });
    const [entry] = await containerPoolEntries(containers, key);
    expect(entry!.base).toBe(base);
    // Checked out at the base inside the running container already, before any claim.
    expect(podman('exec', '--workdir', '/workspace', entry!.container, 'git', 'rev-parse', 'HEAD')).toBe(base);

    // The repository moves on: a new commit on main, a new branch and tag, a branch deleted.
    gitIn(repo, 'branch', 'doomed', 'main');
    gitIn(repo, 'commit', '-q', '--allow-empty', '-m', 'after the fill');
    gitIn(repo, 'branch', 'fresh', 'main');
    gitIn(repo, 'tag', 'v-after', 'main');
    gitIn(repo, 'branch', '-D', 'doomed');
    const pooled = await provider.create({ ...sandboxRequest(repo, 'prepared', { group: 'pool' }), warmPool: 1 });
    made.push(pooled);
    expect(pooled.origin).toBe('pool');
    const inDir = `${pooled.root}.in`;
    // Only the new commits travelled: no full bundle of the repository, an incremental one instead.
    expect(await exists(path.join(inDir, 'base.bundle'))).toBe(false);
    expect(gitIn(repo, 'bundle', 'list-heads', path.join(inDir, 'update.bundle'))).not.toContain('doomed');
    expect(gitIn(repo, 'bundle', 'verify', '-q', path.join(inDir, 'update.bundle'))).toBeDefined();
    // The same state as a cold start: every branch and tag as the repository has them, the branch checked out, clean.
    const cold = await provider.create(sandboxRequest(repo, 'cold-twin', { group: 'pool' }));
    made.push(cold);
    expect(cold.origin).toBe('cold');
    const state = async (h: SandboxHandle) =>
      (await provider.exec(h, { command: '/bin/sh', args: ['-c', 'git for-each-ref --format="%(refname) %(objectname)" refs/heads refs/tags | grep -v "^refs/heads/slipway/"; git rev-parse HEAD; git status --porcelain; git config user.email'] })).stdout;
    const preparedState = await state(pooled);
    expect(preparedState).toBe(await state(cold));
    expect(preparedState).toContain('refs/heads/fresh');
    expect(preparedState).toContain('refs/tags/v-after');
    expect(preparedState).not.toContain('doomed');
    expect((await provider.exec(pooled, { command: 'git', args: ['symbolic-ref', '--short', 'HEAD'] })).stdout.trim()).toBe(pooled.branch);
    expect(pooled.headCommit).toBe(gitIn(repo, 'rev-parse', 'main'));
    await provider.whenPoolIdle();
  });
});
