/**
 * The warm pool: ready worktrees per repository, base commit and fingerprint (lockfiles, setup
 * commands, what is copied), with ignored files copied and project setup done, so a create only
 * has to claim one, move it into place and put it on the stream's branch.
 *
 *   <repo>/.slipway/pool/<key>-<rand>/          an entry: a worktree, detached at the base, locked
 *   <repo>/.slipway/pool/<key>-<rand>.building  while it is being made (pid, host, start)
 *   <repo>/.slipway/pool/<key>-<rand>.ready     once it is ready (its base commit and fingerprint)
 *   <repo>/.slipway/pool/.fill-<key>.lock       one filler per key at a time (O_EXCL)
 *
 * with `<key>` = 12 hex digits of the base commit + 10 of the fingerprint.
 *
 * Claiming is one `rename(2)` of the entry's folder to the sandbox's root: of several concurrent
 * claimers (threads, processes) exactly one gets a given entry; the others get ENOENT and try the
 * next. The entry is locked in git for its whole life in the pool, so a concurrent
 * `git worktree prune` cannot drop it while its folder and git's record of it disagree; the
 * claimer points git's record at the new place and unlocks it.
 *
 * Entries are stale when their base commit is an ancestor of the base now asked for (the branch
 * moved on), or their fingerprint differs at the same base (a lockfile or the setup changed); a
 * fill removes them before topping the pool up.
 */
import { ensureDir, readJson, writeJsonAtomic } from '../../lib/atomic-write';
import { randomBytes } from 'node:crypto';
import { constants, promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';
import { addWorktree, commonDirOf, git, gitMaybe, isAncestor } from '../../lib/git';
import type { BubblewrapConfinement } from './bubblewrap';
import type { CopyMethod } from './copy-ignored';
import { populateWorktree } from './populate';
import { execInWorktree } from './exec';
import type { ProjectSetup } from './provider';
import { runProjectSetup, type SetupResult } from './setup';
import { adminDirOf, relinkMovedWorktree, removeLockedWorktree } from './worktree-admin';

export const POOL_DIR = `${SLIPWAY_DIR}/pool`;
export const POOL_LOCK_REASON = 'slipway pool entry';

/** A building marker older than this is abandoned whatever its process looks like. */
const BUILD_ABANDONED_MS = 2 * 3600_000;
/** Leftovers (markers without folders, folders without markers) are removed once this old. */
const LEFTOVER_MS = 10 * 60_000;

export interface PoolEntryInfo {
  version: 1;
  id: string;
  baseCommit: string;
  fingerprint: string;
  /** Template the ignored files came from, if any. */
  template?: string;
  setup?: SetupResult;
  createdAt: string;
  readyAt: string;
  durationMs: number;
}

interface BuildingInfo {
  pid: number;
  host: string;
  startedAt: string;
}

export interface PoolSpec {
  baseCommit: string;
  fingerprint: string;
  /** Folder ignored files are copied from: the checkout, or the prepared template. */
  source?: string;
  /** Set when `source` is a template: copy all of its ignored files, and setup only verifies. */
  template?: string;
  copyIgnored: boolean;
  setup?: ProjectSetup;
  confinement?: BubblewrapConfinement;
  copyMethod?: CopyMethod;
}

export const poolDir = (repo: string) => path.join(repo, POOL_DIR);
export const poolKey = (baseCommit: string, fingerprint: string) => `${baseCommit.slice(0, 12)}-${fingerprint.slice(0, 10)}`;



function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** True while the process that wrote `info` may still be working on it. */
function holderAlive(info: BuildingInfo | undefined, maxAgeMs: number): boolean {
  if (!info) return false;
  if (Date.now() - Date.parse(info.startedAt) > maxAgeMs) return false;
  if (info.host !== os.hostname()) return true; // cannot tell: trust the age
  return processAlive(info.pid);
}

const mtimeAge = async (p: string) => {
  const stat = await fs.lstat(p).catch(() => undefined);
  return stat ? Date.now() - stat.mtimeMs : Infinity;
};

/**
 * Claims a ready entry for `baseCommit` and `fingerprint` by renaming its folder to `target`
 * (which must not exist). Returns the entry, now a plain (unlocked, detached) worktree at
 * `target`, or undefined when none is ready.
 */
export async function claimPoolEntry(repo: string, spec: Pick<PoolSpec, 'baseCommit' | 'fingerprint'>, target: string): Promise<PoolEntryInfo | undefined> {
  const dir = poolDir(repo);
  const prefix = `${poolKey(spec.baseCommit, spec.fingerprint)}-`;
  const names = (await fs.readdir(dir).catch(() => [] as string[])).filter((n) => n.startsWith(prefix) && n.endsWith('.ready'));
  if (names.length === 0) return undefined;
  // Start at a random entry so concurrent claimers spread out instead of all racing for the first.
  const offset = Math.floor(Math.random() * names.length);
  let groupGone = 0;
  for (let i = 0; i < names.length; i++) {
    const id = names[(offset + i) % names.length].slice(0, -'.ready'.length);
    try {
      // Made for each try: a destroy removes the group folder once it is empty.
      await ensureDir(path.dirname(target));
      await fs.rename(path.join(dir, id), target);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' && groupGone++ < 20 && !(await fs.stat(path.dirname(target)).then(() => true, () => false))) {
        i -= 1; // the group folder went, not the entry: the same entry again
        continue;
      }
      if (code === 'ENOENT') continue; // someone else claimed (or removed) it
      throw e;
    }
    await relinkMovedWorktree(target, { unlock: true });
    const marker = path.join(dir, `${id}.ready`);
    const info = (await readJson<PoolEntryInfo>(marker)) ?? {
      version: 1 as const,
      id,
      baseCommit: spec.baseCommit,
      fingerprint: spec.fingerprint,
      createdAt: '',
      readyAt: '',
      durationMs: 0,
    };
    await fs.rm(marker, { force: true });
    return info;
  }
  return undefined;
}

/** Entries of the pool: ready ones (with their info) and ones being built. */
export async function listPool(repo: string): Promise<{ ready: PoolEntryInfo[]; building: Array<{ id: string; info?: BuildingInfo; alive: boolean }> }> {
  const dir = poolDir(repo);
  const names = await fs.readdir(dir).catch(() => [] as string[]);
  const ready: PoolEntryInfo[] = [];
  const building: Array<{ id: string; info?: BuildingInfo; alive: boolean }> = [];
  for (const name of names) {
    if (name.endsWith('.ready')) {
      const info = await readJson<PoolEntryInfo>(path.join(dir, name));
      if (info && (await fs.lstat(path.join(dir, info.id)).catch(() => undefined))) ready.push(info);
    } else if (name.endsWith('.building')) {
      const info = await readJson<BuildingInfo>(path.join(dir, name));
      building.push({ id: name.slice(0, -'.building'.length), info, alive: holderAlive(info, BUILD_ABANDONED_MS) });
    }
  }
  return { ready, building };
}

/** Takes the per-key fill lock (O_EXCL); steals it from a dead holder. Undefined: someone else fills. */
async function acquireFillLock(repo: string, key: string): Promise<(() => Promise<void>) | undefined> {
  const file = path.join(poolDir(repo), `.fill-${key}.lock`);
  await fs.mkdir(path.dirname(file), { recursive: true });
  for (let tries = 0; tries < 2; tries++) {
    try {
      const handle = await fs.open(file, constants.O_CREAT | constants.O_EXCL | constants.O_WRONLY, 0o644);
      const info: BuildingInfo = { pid: process.pid, host: os.hostname(), startedAt: new Date().toISOString() };
      await handle.writeFile(JSON.stringify(info));
      await handle.close();
      return () => fs.rm(file, { force: true });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      const holder = await readJson<BuildingInfo>(file);
      // A lock file still empty is being written right now.
      if (!holder && (await mtimeAge(file)) < 10_000) return undefined;
      if (holderAlive(holder, BUILD_ABANDONED_MS)) return undefined;
      await fs.rm(file, { force: true });
    }
  }
  return undefined;
}

/** Makes one entry. Throws when setup fails (the entry is removed). */
export async function buildPoolEntry(repo: string, spec: PoolSpec, opts: { signal?: AbortSignal } = {}): Promise<PoolEntryInfo> {
  const started = Date.now();
  const dir = poolDir(repo);
  const id = `${poolKey(spec.baseCommit, spec.fingerprint)}-${randomBytes(4).toString('hex')}`;
  const root = path.join(dir, id);
  const buildingMarker = path.join(dir, `${id}.building`);
  await fs.mkdir(dir, { recursive: true });
  await writeJsonAtomic(buildingMarker, { pid: process.pid, host: os.hostname(), startedAt: new Date().toISOString() } satisfies BuildingInfo);
  try {
    await addWorktree(repo, ['-q', '--no-checkout', '--detach', '--lock', '--reason', POOL_LOCK_REASON, root, spec.baseCommit]);
    await populateWorktree({
      repo,
      root,
      commit: spec.baseCommit,
      source: spec.copyIgnored ? (spec.source ?? repo) : undefined,
      useIncludeFile: spec.template === undefined,
      method: spec.copyMethod,
    });
    let setup: SetupResult | undefined;
    if (spec.setup && (spec.setup.commands.length > 0 || spec.setup.verify.length > 0)) {
      setup = await runProjectSetup((req) => execInWorktree({ root, repository: repo, confinement: spec.confinement }, req), spec.setup, {
        signal: opts.signal,
        skipFirstCommands: spec.template !== undefined,
      });
    }
    const info: PoolEntryInfo = {
      version: 1,
      id,
      baseCommit: spec.baseCommit,
      fingerprint: spec.fingerprint,
      ...(spec.template ? { template: spec.template } : {}),
      ...(setup ? { setup } : {}),
      createdAt: new Date(started).toISOString(),
      readyAt: new Date().toISOString(),
      durationMs: Date.now() - started,
    };
    await writeJsonAtomic(path.join(dir, `${id}.ready`), info);
    return info;
  } catch (e) {
    await removeLockedWorktree(repo, root).catch(() => undefined);
    throw e;
  } finally {
    await fs.rm(buildingMarker, { force: true });
  }
}

/** Removes one entry (ready or abandoned): folder first (atomic against claimers), then its markers. */
async function removeEntry(repo: string, id: string): Promise<boolean> {
  const dir = poolDir(repo);
  const removed = await removeLockedWorktree(repo, path.join(dir, id));
  await fs.rm(path.join(dir, `${id}.ready`), { force: true });
  await fs.rm(path.join(dir, `${id}.building`), { force: true });
  return removed;
}

export interface PoolSweepResult {
  removedStale: string[];
  removedAbandoned: string[];
  removedLeftovers: string[];
}

/**
 * Removes what should not be in the pool: entries whose builder died, leftovers of crashed claims,
 * and, given the base and fingerprint now wanted, stale entries (older base it moved on from,
 * or another fingerprint at the same base). `all`: every entry (the pool is being emptied).
 */
export async function sweepPool(
  repo: string,
  current?: { baseCommit: string; fingerprint: string },
  opts: { all?: boolean; /** Ready entries older than this go too (the janitor: unused for days). */ readyOlderThanMs?: number } = {},
): Promise<PoolSweepResult> {
  const dir = poolDir(repo);
  const result: PoolSweepResult = { removedStale: [], removedAbandoned: [], removedLeftovers: [] };
  const names = await fs.readdir(dir).catch(() => [] as string[]);
  const ancestorCache = new Map<string, boolean>();
  const known = new Set<string>();
  for (const name of names) {
    if (name.endsWith('.building')) {
      const id = name.slice(0, -'.building'.length);
      known.add(id);
      const info = await readJson<BuildingInfo>(path.join(dir, name));
      if (!info && (await mtimeAge(path.join(dir, name))) < 10_000) continue; // being written
      if (!holderAlive(info, BUILD_ABANDONED_MS)) {
        await removeEntry(repo, id);
        result.removedAbandoned.push(id);
      }
    } else if (name.endsWith('.ready')) {
      const id = name.slice(0, -'.ready'.length);
      known.add(id);
      const info = await readJson<PoolEntryInfo>(path.join(dir, name));
      const folder = await fs.lstat(path.join(dir, id)).catch(() => undefined);
      if (!folder || !info) {
        // Claimed a moment ago (the claimer removes the marker next), or a claim that died.
        if ((await mtimeAge(path.join(dir, name))) > 60_000) {
          await fs.rm(path.join(dir, name), { force: true });
          if (folder) await removeEntry(repo, id);
          result.removedLeftovers.push(id);
        }
        continue;
      }
      let stale = opts.all === true || (opts.readyOlderThanMs !== undefined && Date.now() - Date.parse(info.readyAt) > opts.readyOlderThanMs);
      if (!stale && current) {
        if (info.baseCommit === current.baseCommit) stale = info.fingerprint !== current.fingerprint;
        else {
          let older = ancestorCache.get(info.baseCommit);
          if (older === undefined) {
            older = await isAncestor(repo, info.baseCommit, current.baseCommit);
            ancestorCache.set(info.baseCommit, older);
          }
          stale = older;
        }
      }
      // The commit itself may be gone (a rewritten branch, gc): nothing can use the entry.
      if (!stale && (await gitMaybe(repo, ['cat-file', '-e', `${info.baseCommit}^{commit}`])) === undefined) stale = true;
      if (stale && (await removeEntry(repo, id))) result.removedStale.push(id);
    }
  }
  // Folders without a marker: a crashed remover, or a builder that died before writing its marker.
  for (const name of names) {
    if (name.startsWith('.') || name.includes('.') || known.has(name)) continue;
    if ((await mtimeAge(path.join(dir, name))) < LEFTOVER_MS) continue;
    await removeLockedWorktree(repo, path.join(dir, name));
    result.removedLeftovers.push(name);
  }
  await releaseOrphanedLocks(repo);
  return result;
}

/**
 * A claimer that died between renaming an entry and pointing git at the new place leaves git's
 * record of the entry locked and pointing at nothing: unlock it so prune can drop it.
 */
async function releaseOrphanedLocks(repo: string): Promise<void> {
  const admins = path.join(await commonDirOf(repo, { fresh: true }), 'worktrees');
  let released = false;
  for (const id of await fs.readdir(admins).catch(() => [] as string[])) {
    const lockFile = path.join(admins, id, 'locked');
    const reason = await fs.readFile(lockFile, 'utf8').catch(() => undefined);
    if (reason?.trim() !== POOL_LOCK_REASON) continue;
    const gitdir = (await fs.readFile(path.join(admins, id, 'gitdir'), 'utf8').catch(() => '')).trim();
    if (!gitdir || (await fs.lstat(gitdir).catch(() => undefined))) continue;
    if ((await mtimeAge(lockFile)) < LEFTOVER_MS) continue;
    await fs.rm(lockFile, { force: true });
    released = true;
  }
  if (released) await gitMaybe(repo, ['worktree', 'prune']);
}

/**
 * Tops the pool up to `size` ready (or building) entries for the spec, after removing stale ones.
 * One filler per key across processes; returns the entries made (0 when another filler holds the key).
 */
export async function fillPool(repo: string, spec: PoolSpec, size: number, opts: { signal?: AbortSignal; log?: (line: string) => void } = {}): Promise<{ made: number; sweep?: PoolSweepResult }> {
  const key = poolKey(spec.baseCommit, spec.fingerprint);
  const release = await acquireFillLock(repo, key);
  if (!release) return { made: 0 };
  let made = 0;
  try {
    const sweep = await sweepPool(repo, { baseCommit: spec.baseCommit, fingerprint: spec.fingerprint });
    for (;;) {
      if (opts.signal?.aborted) break;
      const { ready, building } = await listPool(repo);
      const have = ready.filter((e) => e.baseCommit === spec.baseCommit && e.fingerprint === spec.fingerprint).length +
        building.filter((b) => b.alive && b.id.startsWith(`${key}-`)).length;
      if (have >= size) break;
      await buildPoolEntry(repo, spec, opts);
      made++;
    }
    return { made, sweep };
  } finally {
    await release();
  }
}

/** Removes every entry and leftover of the pool. */
export async function emptyPool(repo: string): Promise<PoolSweepResult> {
  return sweepPool(repo, undefined, { all: true });
}

export { adminDirOf };
