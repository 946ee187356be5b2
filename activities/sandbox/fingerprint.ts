/**
 * What makes a prepared sandbox (warm-pool entry, template) stale: the dependency lockfiles,
 * the project setup commands, and what is copied in. Two sandboxes with the same fingerprint
 * at the same base commit are interchangeable.
 */
import { createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { rawGit } from '../../lib/git';
import { WORKTREE_INCLUDE_FILE } from './copy-ignored';
import type { ProjectSetup } from './provider';

/** Lockfiles looked for at the repository root. */
export const LOCKFILES = [
  'package-lock.json',
  'npm-shrinkwrap.json',
  'yarn.lock',
  'pnpm-lock.yaml',
  'bun.lock',
  'bun.lockb',
  'deno.lock',
  'Cargo.lock',
  'go.sum',
  'poetry.lock',
  'uv.lock',
  'Pipfile.lock',
  'pdm.lock',
  'requirements.txt',
  'Gemfile.lock',
  'composer.lock',
  'mix.lock',
  'pubspec.lock',
  'Podfile.lock',
  'flake.lock',
] as const;

const sha = (text: string | Buffer) => createHash('sha256').update(text).digest('hex');

/** name -> blob id of each lockfile tracked at `commit` (one git call). */
export async function trackedLockfiles(repo: string, commit: string): Promise<Record<string, string>> {
  const out = await rawGit(repo, ['ls-tree', '-z', commit, '--', ...LOCKFILES]);
  const found: Record<string, string> = {};
  for (const line of out.split('\0').filter(Boolean)) {
    // <mode> SP <type> SP <object> TAB <file>
    const [meta, name] = line.split('\t');
    const [, type, object] = meta.split(' ');
    if (type === 'blob') found[name] = object;
  }
  return found;
}

/** name -> content hash of each lockfile in a working folder (the user's checkout). */
export async function workingLockfiles(dir: string): Promise<Record<string, string>> {
  const found: Record<string, string> = {};
  await Promise.all(
    LOCKFILES.map(async (name) => {
      const content = await fs.readFile(path.join(dir, name)).catch(() => undefined);
      if (content) found[name] = sha(content);
    }),
  );
  return Object.fromEntries(Object.entries(found).sort(([a], [b]) => a.localeCompare(b)));
}

export function setupHash(setup: ProjectSetup | undefined): string {
  return sha(JSON.stringify({ commands: setup?.commands ?? [], verify: setup?.verify ?? [] })).slice(0, 16);
}

export interface FingerprintParts {
  /** Lockfiles at the base commit. */
  tracked: Record<string, string>;
  /** Lockfiles in the folder ignored files are copied from (its dependencies match these). */
  source: Record<string, string>;
  setup: string;
  copyIgnored: boolean;
  include: string;
}

/** The fingerprint of sandboxes made at `baseCommit` with these settings, copying ignored files from `source`. */
export async function fingerprint(
  repo: string,
  baseCommit: string,
  opts: { setup?: ProjectSetup; copyIgnored: boolean; source: string; tracked?: Record<string, string> },
): Promise<{ hash: string; parts: FingerprintParts }> {
  const [tracked, source, include] = await Promise.all([
    opts.tracked ?? trackedLockfiles(repo, baseCommit),
    opts.copyIgnored ? workingLockfiles(opts.source) : Promise.resolve({}),
    opts.copyIgnored ? fs.readFile(path.join(repo, WORKTREE_INCLUDE_FILE), 'utf8').catch(() => '') : Promise.resolve(''),
  ]);
  const parts: FingerprintParts = { tracked, source, setup: setupHash(opts.setup), copyIgnored: opts.copyIgnored, include: include ? sha(include).slice(0, 16) : '' };
  return { hash: sha(JSON.stringify(parts)), parts };
}

/** Human-readable differences between two fingerprints' parts. */
export function describeChanges(was: FingerprintParts, now: FingerprintParts): string[] {
  const out: string[] = [];
  const lockDiff = (label: string, a: Record<string, string>, b: Record<string, string>) => {
    for (const name of new Set([...Object.keys(a), ...Object.keys(b)])) {
      if (a[name] === b[name]) continue;
      out.push(`${label} ${name} ${a[name] === undefined ? 'appeared' : b[name] === undefined ? 'disappeared' : 'changed'}`);
    }
  };
  lockDiff('lockfile', was.tracked, now.tracked);
  lockDiff('checkout lockfile', was.source, now.source);
  if (was.setup !== now.setup) out.push('project_setup commands changed');
  if (was.copyIgnored !== now.copyIgnored) out.push('copy_ignored changed');
  if (was.include !== now.include) out.push(`${WORKTREE_INCLUDE_FILE} changed`);
  return out;
}
