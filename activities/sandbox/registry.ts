/**
 * The repositories Slipway has worked in, and the objectives it ran in each: what the janitor
 * sweeps. One small JSON file, `$SLIPWAY_HOME/repositories.json` (the data folder of
 * lib/settings.ts), written when an objective starts preparing and pruned by the janitor:
 *
 *   { "version": 1,
 *     "repositories": { "/abs/repo": { "addedAt": "...",
 *        "objectives": { "<id>": { "baseCommit": "...", "addedAt": "...",
 *                                  "temporal": { "cluster": "<cluster id>", "namespace": "default" } } } } } }
 *
 * `temporal` says which Temporal cluster and namespace run the objective: one `$SLIPWAY_HOME` can
 * serve workers of several servers, and a janitor only sweeps objectives of its own.
 *
 * Writers take `repositories.json.lock` (O_EXCL; a lock older than 30 s is broken) and replace
 * the file by rename, so concurrent workers on one machine never lose an entry.
 */
import { withFileLock } from '../../lib/file-lock';
import { writeJsonAtomic } from '../../lib/atomic-write';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { slipwaySettings } from '../../lib/settings';

/** Where an objective's workflows live: a Temporal cluster (its id) and namespace. */
export interface TemporalHome {
  cluster: string;
  namespace: string;
}

export interface RegistryObjective {
  baseCommit?: string;
  addedAt: string;
  temporal?: TemporalHome;
}

export interface RegistryRepository {
  addedAt: string;
  objectives: Record<string, RegistryObjective>;
}

export interface Registry {
  version: 1;
  repositories: Record<string, RegistryRepository>;
}

export const REGISTRY_FILE = 'repositories.json';

export function registryPath(env: NodeJS.ProcessEnv = process.env): string {
  return path.join(slipwaySettings(env).dataDir, REGISTRY_FILE);
}

const empty = (): Registry => ({ version: 1, repositories: {} });

export async function readRegistry(file = registryPath()): Promise<Registry> {
  try {
    const parsed = JSON.parse(await fs.readFile(file, 'utf8')) as Registry;
    return parsed && typeof parsed.repositories === 'object' ? parsed : empty();
  } catch {
    return empty();
  }
}

/** Reads, changes and writes the registry under its lock. */
export async function updateRegistry<T>(change: (registry: Registry) => T, file = registryPath()): Promise<T> {
  return withFileLock(file, async () => {
    const registry = await readRegistry(file);
    const result = change(registry);
    await writeJsonAtomic(file, registry);
    return result;
  });
}

/** Records that `objectiveId` runs in `repository` (idempotent). */
export async function registerObjective(
  repository: string,
  objectiveId: string,
  baseCommit?: string,
  file = registryPath(),
  temporal?: TemporalHome,
): Promise<void> {
  await updateRegistry((registry) => {
    const now = new Date().toISOString();
    const repo = (registry.repositories[repository] ??= { addedAt: now, objectives: {} });
    repo.objectives[objectiveId] ??= { addedAt: now, ...(baseCommit ? { baseCommit } : {}), ...(temporal ? { temporal } : {}) };
  }, file);
}

/** Drops an objective (the janitor swept it), and a repository once it has none left. */
export async function forgetObjective(repository: string, objectiveId: string, file = registryPath()): Promise<void> {
  await updateRegistry((registry) => {
    const repo = registry.repositories[repository];
    if (!repo) return;
    delete repo.objectives[objectiveId];
  }, file);
}

export async function forgetRepository(repository: string, file = registryPath()): Promise<void> {
  await updateRegistry((registry) => {
    delete registry.repositories[repository];
  }, file);
}
