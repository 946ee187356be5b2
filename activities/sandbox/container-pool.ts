/**
 * The warm pool of container sandboxes (ADR 0025): running containers made ahead per repository,
 * image and settings (network, limits, readable paths), with an empty workspace, so a create
 * skips `<engine> run` and only has to claim one.
 *
 *   <repo>/.slipway/containers/.pool/<key>-<rand>/        an entry's workspace (its container's /workspace)
 *   <repo>/.slipway/containers/.pool/<key>-<rand>.in/     its bundle folder (/run/slipway/in)
 *   <repo>/.slipway/containers/.pool/<key>-<rand>.ready   ready to claim: its container, image, key
 *   <repo>/.slipway/containers/.pool/.fill-<key>.lock     one filler per key at a time (O_EXCL)
 *
 * Claiming takes the entry's lock: `rename(2)` of its `.ready` marker to `.claimed`, which of
 * any number of concurrent claimers (threads, processes) exactly one wins; the losers get ENOENT
 * and try the next entry. Only the winner then moves the workspace and bundle folders to the
 * sandbox's places and renames the container to the sandbox's container name. An engine
 * re-resolves a bind mount's source on every start (restore after suspend), so the entry's old
 * paths stay behind as symlinks to the new ones (Slipway's own, outside anything mounted), and
 * `.pool/<id>.json` links to the sandbox's record, which is how `list` finds it from the labels.
 *
 * Entries made from another image than the one now asked for (the sandbox image was rebuilt,
 * or a new template image) are retired by the next fill.
 */
import { createHash, randomBytes } from 'node:crypto';
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { ensureDir, readJson, writeJsonAtomic } from '../../lib/atomic-write';
import { git } from '../../lib/git';
import { CONTAINER_IN, CONTAINER_WORKSPACE, engine, sandboxRunArgs, type ContainerEngine, type ContainerSettings } from './container-engine';
import { PREPARE_FROM_BUNDLE_SCRIPT } from './git-transport';

export const CONTAINER_POOL_DIR = '.pool';

export interface ContainerPoolEntry {
  version: 1;
  id: string;
  key: string;
  engine: ContainerEngine;
  image: string;
  container: string;
  createdAt: string;
  /** The commit its workspace holds checked out, with every branch and tag of the repository at fill time (absent: an empty workspace). */
  base?: string;
}

export interface ContainerPoolSpec {
  kind: ContainerEngine;
  image: string;
  settings: ContainerSettings;
}

/** The pool of a repository's container sandboxes: `<repo>/.slipway/containers/.pool`. */
export const containerPoolDir = (containersDir: string) => path.join(containersDir, CONTAINER_POOL_DIR);

/** Entries are interchangeable when engine, image and settings are the same. */
export function containerPoolKey(spec: ContainerPoolSpec): string {
  const s = spec.settings;
  return createHash('sha256')
    .update(JSON.stringify({ engine: spec.kind, image: spec.image, network: s.network, limits: s.limits ?? {}, readable: [...(s.readable ?? [])].sort() }))
    .digest('hex')
    .slice(0, 16);
}

async function readyEntries(dir: string): Promise<ContainerPoolEntry[]> {
  const names = (await fs.readdir(dir).catch(() => [] as string[])).filter((n) => n.endsWith('.ready'));
  const entries = await Promise.all(names.map((n) => readJson<ContainerPoolEntry>(path.join(dir, n))));
  return entries.filter((e): e is ContainerPoolEntry => e !== undefined);
}

/** The ready entries of a key (for tests and the bench). */
export async function containerPoolEntries(containersDir: string, key?: string): Promise<ContainerPoolEntry[]> {
  return (await readyEntries(containerPoolDir(containersDir))).filter((e) => key === undefined || e.key === key);
}

async function removeEntry(dir: string, e: Pick<ContainerPoolEntry, 'id' | 'engine' | 'container'>): Promise<void> {
  await engine(e.engine, ['rm', '-f', '-t', '0', e.container], { allowFail: true });
  await fs.rm(path.join(dir, e.id), { recursive: true, force: true });
  await fs.rm(path.join(dir, `${e.id}.in`), { recursive: true, force: true });
}

/**
 * Claims a ready entry of `key` for a sandbox: its folders become `target.root` and
 * `target.inDir` (which must not exist), its container is renamed `target.container`. Returns
 * the entry, or undefined when none is ready.
 */
export async function claimContainerPoolEntry(
  containersDir: string,
  key: string,
  target: { root: string; inDir: string; recordFile: string; container: string },
): Promise<ContainerPoolEntry | undefined> {
  const dir = containerPoolDir(containersDir);
  const entries = (await readyEntries(dir)).filter((e) => e.key === key);
  // Start at a random entry so concurrent claimers spread out instead of all queueing on the first.
  const offset = Math.floor(Math.random() * entries.length);
  for (let i = 0; i < entries.length; i++) {
    const e = entries[(offset + i) % entries.length];
    const claimed = path.join(dir, `${e.id}.claimed`);
    try {
      await fs.rename(path.join(dir, `${e.id}.ready`), claimed);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue; // another claimer holds it
      throw err;
    }
    try {
      await ensureDir(path.dirname(target.root));
      await fs.rename(path.join(dir, e.id), target.root);
      await fs.rename(path.join(dir, `${e.id}.in`), target.inDir);
      await fs.symlink(target.root, path.join(dir, e.id));
      await fs.symlink(target.inDir, path.join(dir, `${e.id}.in`));
      await fs.symlink(target.recordFile, path.join(dir, `${e.id}.json`));
      await engine(e.engine, ['rename', e.container, target.container]);
    } catch {
      // The entry was broken (its container removed outside Slipway): drop it, try the next.
      await releaseClaimedEntry(containersDir, e.id, { ...e, container: target.container });
      await removeEntry(dir, e);
      await fs.rm(target.root, { recursive: true, force: true });
      await fs.rm(target.inDir, { recursive: true, force: true });
      continue;
    }
    await fs.rm(claimed, { force: true });
    return e;
  }
  return undefined;
}

/** Removes what a claimed entry left in the pool folder (destroy of its sandbox). */
export async function releaseClaimedEntry(containersDir: string, id: string, e?: Pick<ContainerPoolEntry, 'engine' | 'container'>): Promise<void> {
  const dir = containerPoolDir(containersDir);
  if (e) await engine(e.engine, ['rm', '-f', '-t', '0', e.container], { allowFail: true });
  // The entry's old paths are symlinks by now (or its folders, if the claim broke off): never followed.
  for (const suffix of ['', '.in', '.json', '.claimed']) await fs.rm(path.join(dir, `${id}${suffix}`), { force: true, recursive: true });
}

/**
 * Tops the pool of `spec` up to `size` ready entries, and retires entries of the same engine
 * made from another image. One filler per key at a time; a second returns at once.
 */
export async function fillContainerPool(repo: string, containersDir: string, spec: ContainerPoolSpec, size: number, base?: string): Promise<{ made: number; retired: number }> {
  const dir = containerPoolDir(containersDir);
  await ensureDir(dir);
  const key = containerPoolKey(spec);
  const lock = path.join(dir, `.fill-${key}.lock`);
  let handle: fs.FileHandle;
  try {
    handle = await fs.open(lock, constants.O_CREAT | constants.O_EXCL | constants.O_WRONLY);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST' && !(await staleLock(lock))) return { made: 0, retired: 0 };
    await fs.rm(lock, { force: true });
    return fillContainerPool(repo, containersDir, spec, size, base);
  }
  try {
    await handle.writeFile(JSON.stringify({ pid: process.pid, startedAt: new Date().toISOString() }));
    await handle.close();
    let retired = 0;
    const entries = await readyEntries(dir);
    for (const e of entries) {
      if (e.engine !== spec.kind || e.image === spec.image) continue;
      // Claim it first, so no create takes it while it is being removed.
      const ok = await fs.rename(path.join(dir, `${e.id}.ready`), path.join(dir, `${e.id}.claimed`)).then(() => true, () => false);
      if (!ok) continue;
      await removeEntry(dir, e);
      await fs.rm(path.join(dir, `${e.id}.claimed`), { force: true });
      retired++;
    }
    let made = 0;
    for (let have = entries.filter((e) => e.key === key).length; have < size; have++) {
      const rand = randomBytes(6).toString('hex');
      const id = `${key}-${rand}`;
      const root = path.join(dir, id);
      const inDir = path.join(dir, `${id}.in`);
      await fs.mkdir(root);
      await fs.mkdir(inDir);
      const container = `slipway-pool-${rand}`;
      const labels = { 'slipway.pool': key, 'slipway.root': root, 'slipway.repository': repo };
      try {
        await engine(spec.kind, sandboxRunArgs(spec.kind, { name: container, labels, settings: spec.settings, root, inDir, image: spec.image }));
      } catch (e) {
        await removeEntry(dir, { id, engine: spec.kind, container });
        throw e;
      }
      // The workspace prepared at the base: a claim then only brings what changed since (ADR 0030).
      const prepared = base !== undefined && (await prepareEntry(repo, spec.kind, container, inDir, base));
      const entry: ContainerPoolEntry = { version: 1, id, key, engine: spec.kind, image: spec.image, container, createdAt: new Date().toISOString(), ...(prepared ? { base } : {}) };
      await writeJsonAtomic(path.join(dir, `${id}.ready`), entry);
      made++;
    }
    return { made, retired };
  } finally {
    await fs.rm(lock, { force: true });
  }
}

/** Fetches the repository's branches and tags into an entry's workspace and checks out `base`; false when that failed (the entry stays empty, a claim starts it cold). */
async function prepareEntry(repo: string, kind: ContainerEngine, container: string, inDir: string, base: string): Promise<boolean> {
  const bundle = path.join(inDir, 'prepare.bundle');
  try {
    await git(repo, ['bundle', 'create', '-q', bundle, '--branches', '--tags']);
    const r = await engine(kind, ['exec', '--workdir', CONTAINER_WORKSPACE, '--env', 'HOME=/root', container, '/bin/sh', '-c', PREPARE_FROM_BUNDLE_SCRIPT, 'prepare', `${CONTAINER_IN}/prepare.bundle`, base], { allowFail: true });
    if (r.code === 0) return true;
    await engine(kind, ['exec', '--workdir', CONTAINER_WORKSPACE, container, '/bin/sh', '-c', 'rm -rf .git ./* ./.[!.]* 2>/dev/null; true'], { allowFail: true });
    return false;
  } catch {
    return false;
  } finally {
    await fs.rm(bundle, { force: true });
  }
}

/** A fill lock whose process is gone (this host), or older than an hour. */
async function staleLock(lock: string): Promise<boolean> {
  const info = await readJson<{ pid: number; startedAt: string }>(lock);
  if (!info) return (await fs.stat(lock).then((s) => Date.now() - s.mtimeMs, () => Infinity)) > 60_000;
  if (Date.now() - Date.parse(info.startedAt) > 3600_000) return true;
  try {
    process.kill(info.pid, 0);
    return false;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code !== 'EPERM';
  }
}

/** Removes every entry of the pool (tests, and `slipway` cleanup of a repository). */
export async function drainContainerPool(containersDir: string): Promise<number> {
  const dir = containerPoolDir(containersDir);
  let removed = 0;
  for (const e of await readyEntries(dir)) {
    const ok = await fs.rename(path.join(dir, `${e.id}.ready`), path.join(dir, `${e.id}.claimed`)).then(() => true, () => false);
    if (!ok) continue;
    await removeEntry(dir, e);
    await fs.rm(path.join(dir, `${e.id}.claimed`), { force: true });
    removed++;
  }
  return removed;
}
