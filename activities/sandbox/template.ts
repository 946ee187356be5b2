/**
 * The prepared template of a repository: one worktree, detached at a base commit,
 * with the checkout's ignored files copied in and project setup done. New sandboxes and warm-pool
 * entries whose base has the same lockfiles and whose setup commands are the same copy their
 * ignored files from it (reflinks where the filesystem has them) and only verify, instead of
 * running setup again.
 *
 *   <repo>/.slipway/template.json        the current template's manifest (replaced atomically)
 *   <repo>/.slipway/templates/<id>/      template worktrees (locked, so `git worktree prune` keeps them)
 *
 * Stale when a lockfile changed (at the base, or in the checkout the ignored files came from)
 * or the setup commands changed. `slipway template create|check|update` drive it.
 */
import { writeJsonAtomic } from '../../lib/atomic-write';
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';
import { addWorktree, ensureSlipwayExcluded, git, resolveCommit } from '../../lib/git';
import type { BubblewrapConfinement } from './bubblewrap';
import { execInWorktree } from './exec';
import { populateWorktree } from './populate';
import { describeChanges, fingerprint, setupHash, trackedLockfiles, type FingerprintParts } from './fingerprint';
import type { ProjectSetup } from './provider';
import { runProjectSetup, type SetupResult } from './setup';
import { removeLockedWorktree } from './worktree-admin';

export const TEMPLATE_MANIFEST = `${SLIPWAY_DIR}/template.json`;
export const TEMPLATES_DIR = `${SLIPWAY_DIR}/templates`;
export const TEMPLATE_LOCK_REASON = 'slipway template';

export interface TemplateManifest {
  version: 1;
  id: string;
  root: string;
  /** What the user asked to build from (a branch name, or a commit). */
  baseRef: string;
  baseCommit: string;
  setup?: ProjectSetup;
  copyIgnored: boolean;
  confinement?: BubblewrapConfinement;
  fingerprint: { hash: string; parts: FingerprintParts };
  setupResult?: SetupResult;
  createdAt: string;
  durationMs: number;
}

const manifestFile = (repo: string) => path.join(repo, TEMPLATE_MANIFEST);

export async function readTemplate(repo: string): Promise<TemplateManifest | undefined> {
  try {
    return JSON.parse(await fs.readFile(manifestFile(repo), 'utf8')) as TemplateManifest;
  } catch {
    return undefined;
  }
}

async function exists(p: string): Promise<boolean> {
  return fs.lstat(p).then(
    () => true,
    () => false,
  );
}

/**
 * The template new sandboxes at `baseCommit` may copy from: present, made with the same setup,
 * copying ignored files, and with the same lockfiles as the base. `tracked` saves a git call
 * when the caller already listed the base's lockfiles.
 */
export async function usableTemplate(
  repo: string,
  baseCommit: string,
  opts: { setup?: ProjectSetup; copyIgnored: boolean; tracked?: Record<string, string> },
): Promise<TemplateManifest | undefined> {
  if (!opts.copyIgnored) return undefined;
  const manifest = await readTemplate(repo);
  if (!manifest || !manifest.copyIgnored) return undefined;
  if (manifest.fingerprint.parts.setup !== setupHash(opts.setup)) return undefined;
  const tracked = opts.tracked ?? (await trackedLockfiles(repo, baseCommit));
  if (JSON.stringify(tracked) !== JSON.stringify(manifest.fingerprint.parts.tracked)) return undefined;
  if (!(await exists(path.join(manifest.root, '.git')))) return undefined;
  return manifest;
}

export interface TemplateCheck {
  state: 'missing' | 'fresh' | 'stale';
  reasons: string[];
  manifest?: TemplateManifest;
  /** The base commit checked against (the manifest's base ref, resolved now). */
  baseCommit?: string;
}

/** Is the template stale? Lockfiles (at its base ref now, and in the checkout) and, when given, setup commands. */
export async function checkTemplate(repo: string, opts: { base?: string; setup?: ProjectSetup } = {}): Promise<TemplateCheck> {
  const manifest = await readTemplate(repo);
  if (!manifest) return { state: 'missing', reasons: ['no template: run `slipway template create`'] };
  const reasons: string[] = [];
  if (!(await exists(path.join(manifest.root, '.git')))) reasons.push(`the template worktree ${manifest.root} is gone`);
  const baseRef = opts.base ?? manifest.baseRef;
  const baseCommit = await resolveCommit(repo, baseRef).catch(() => undefined);
  if (!baseCommit) {
    reasons.push(`base "${baseRef}" no longer resolves to a commit`);
    return { state: 'stale', reasons, manifest };
  }
  const setup = opts.setup ?? manifest.setup;
  const now = await fingerprint(repo, baseCommit, { setup, copyIgnored: manifest.copyIgnored, source: repo });
  reasons.push(...describeChanges(manifest.fingerprint.parts, now.parts));
  return { state: reasons.length === 0 ? 'fresh' : 'stale', reasons, manifest, baseCommit };
}

export interface BuildTemplateOptions {
  base: string;
  setup?: ProjectSetup;
  copyIgnored?: boolean;
  confinement?: BubblewrapConfinement;
  signal?: AbortSignal;
  onProgress?: (line: string) => void;
}

/**
 * Builds a new template and makes it current (the manifest is replaced atomically), then removes
 * the previous one. A sandbox that was copying from the previous one at that moment ends up
 * with fewer files; its `verify` checks catch that and run setup.
 */
export async function buildTemplate(repository: string, opts: BuildTemplateOptions): Promise<TemplateManifest> {
  const started = Date.now();
  const repo = await fs.realpath(repository);
  await ensureSlipwayExcluded(repo);
  const baseCommit = await resolveCommit(repo, opts.base);
  const copyIgnored = opts.copyIgnored ?? true;
  const id = `${baseCommit.slice(0, 12)}-${randomBytes(3).toString('hex')}`;
  const root = path.join(repo, TEMPLATES_DIR, id);
  await fs.mkdir(path.dirname(root), { recursive: true });
  await addWorktree(repo, ['-q', '--no-checkout', '--detach', '--lock', '--reason', TEMPLATE_LOCK_REASON, root, baseCommit]);
  try {
    if (copyIgnored) opts.onProgress?.('checking out and copying ignored files from the checkout');
    await populateWorktree({ repo, root, commit: baseCommit, source: copyIgnored ? repo : undefined });
    let setupResult: SetupResult | undefined;
    if (opts.setup && (opts.setup.commands.length > 0 || opts.setup.verify.length > 0)) {
      setupResult = await runProjectSetup((req) => execInWorktree({ root, repository: repo, confinement: opts.confinement }, req), opts.setup, {
        signal: opts.signal,
        onProgress: opts.onProgress,
      });
    }
    const fp = await fingerprint(repo, baseCommit, { setup: opts.setup, copyIgnored, source: repo });
    const manifest: TemplateManifest = {
      version: 1,
      id,
      root,
      baseRef: opts.base,
      baseCommit,
      ...(opts.setup ? { setup: opts.setup } : {}),
      copyIgnored,
      ...(opts.confinement ? { confinement: opts.confinement } : {}),
      fingerprint: fp,
      ...(setupResult ? { setupResult } : {}),
      createdAt: new Date().toISOString(),
      durationMs: Date.now() - started,
    };
    await writeJsonAtomic(manifestFile(repo), manifest);
    await removeOldTemplates(repo, { keep: id, olderThanMs: 0 });
    return manifest;
  } catch (e) {
    await removeLockedWorktree(repo, root).catch(() => undefined);
    throw e;
  }
}

/**
 * Removes template worktrees other than the current one (and `keep`). `olderThanMs` leaves
 * recently replaced ones for sandboxes that may still be copying from them.
 */
export async function removeOldTemplates(repository: string, opts: { keep?: string; olderThanMs?: number } = {}): Promise<string[]> {
  const repo = await fs.realpath(repository);
  const current = (await readTemplate(repo))?.id;
  const dir = path.join(repo, TEMPLATES_DIR);
  const removed: string[] = [];
  for (const id of await fs.readdir(dir).catch(() => [] as string[])) {
    if (id === current || id === opts.keep) continue;
    const stat = await fs.stat(path.join(dir, id)).catch(() => undefined);
    if (stat && Date.now() - stat.mtimeMs < (opts.olderThanMs ?? 10 * 60_000)) continue;
    await removeLockedWorktree(repo, path.join(dir, id));
    removed.push(id);
  }
  return removed;
}

/** Removes the template altogether. */
export async function deleteTemplate(repository: string): Promise<void> {
  const repo = await fs.realpath(repository);
  await fs.rm(manifestFile(repo), { force: true });
  await removeOldTemplates(repo, { olderThanMs: 0 });
}

