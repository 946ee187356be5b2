/**
 * Copies the git-ignored files of the user's checkout (node_modules, build caches, .env)
 * into a fresh worktree, so agents do not start cold.
 *
 * What: every ignored path git reports for the repository root, or, when the root has a
 * `.worktreeinclude` file (gitignore syntax), only the ignored paths that file matches.
 * `.slipway/` (Slipway's own worktrees and state) and `.git` are never copied, nor nested git
 * repositories and worktrees (a folder holding a `.git`, at any depth: other tools' worktrees,
 * vendored clones), nor the folders of `DEFAULT_COPY_EXCLUDES`. An ignored folder that holds one
 * of those is copied entry by entry around it.
 *
 * How: copy-on-write clones where the filesystem has them (reflink on btrfs/XFS, clonefile
 * on APFS), a plain copy otherwise, and never hard links: a hard link would let an agent's
 * edit in its worktree change the user's file. Symlinks are copied as symlinks, verbatim.
 * Files already present in the worktree (tracked there) are left as they are.
 */
import { rawGit } from '../../lib/git';
import { execFile, spawn } from 'node:child_process';
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { SLIPWAY_DIR } from '../../core/ids';

const execFileAsync = promisify(execFile);

export const WORKTREE_INCLUDE_FILE = '.worktreeinclude';

export type CopyMethod = 'gnu-cp' | 'node';

export interface CopyIgnoredResult {
  /** Top-level paths copied (relative to the repository root; directories end with "/"). */
  paths: string[];
  /** Paths that could not be copied, with the reason. Copying is best effort. */
  warnings: string[];
  method: CopyMethod;
  /** True when `.worktreeinclude` limited what was copied. */
  limitedByIncludeFile: boolean;
  durationMs: number;
}

async function lsFilesIgnored(repo: string, excludeArgs: string[]): Promise<string[]> {
  const stdout = await rawGit(repo, ['ls-files', '-z', '--others', '--ignored', '--directory', ...excludeArgs]);
  return stdout.split('\0').filter((p) => p !== '');
}

/** `dir` ("a/b/") covers `p` when p is dir itself or lies below it; a file covers only itself. */
const covers = (dir: string, p: string) => dir === p || (dir.endsWith('/') && p.startsWith(dir));

/** Drops entries that another (directory) entry already covers. */
export function collapse(entries: Iterable<string>): string[] {
  const sorted = [...new Set(entries)].sort();
  const out: string[] = [];
  for (const entry of sorted) {
    const last = out[out.length - 1];
    if (last !== undefined && covers(last, entry)) continue;
    out.push(entry);
  }
  return out;
}

/**
 * Paths both lists cover: an ignored path inside an included directory, or an included
 * path inside an ignored directory. Both lists use git's `--directory` form.
 */
export function intersect(ignored: string[], included: string[]): string[] {
  const out: string[] = [];
  for (const inc of included) {
    for (const ign of ignored) {
      if (covers(ign, inc)) out.push(inc);
      else if (covers(inc, ign)) out.push(ign);
    }
  }
  return collapse(out);
}

const isSlipwayOrGit = (p: string) => {
  const first = p.split('/')[0];
  return first === SLIPWAY_DIR || p.split('/').some((part) => part === '.git');
};

/**
 * Ignored folders that are never copied: other tools' worktrees and per-checkout state, which
 * are neither dependencies nor caches and grow with every run of those tools. (Nested
 * repositories and worktrees are found wherever they are; these go even without a `.git`.)
 */
export const DEFAULT_COPY_EXCLUDES = ['.sandcastle/', '.worktrees/', '.claude/worktrees/'] as const;

export interface IgnoredListing {
  paths: string[];
  limitedByIncludeFile: boolean;
  /** Folders left out: nested repositories and worktrees, and `DEFAULT_COPY_EXCLUDES` present. */
  excluded?: string[];
}

/** Roots ("a/b/") of the git repositories and worktrees nested in the ignored folders `dirs`. */
async function nestedRepositories(repo: string, dirs: string[]): Promise<string[]> {
  if (dirs.length === 0) return [];
  // find -P: never follows links; -prune: does not descend into a .git it found.
  const { stdout } = await execFileAsync('find', ['-P', ...dirs.map((d) => path.join(repo, d)), '-name', '.git', '-prune', '-print0'], { maxBuffer: 64 * 1024 * 1024 }).catch(
    (e: { stdout?: string }) => ({ stdout: e.stdout ?? '' }), // an unreadable folder: what was found still counts
  );
  return stdout
    .split('\0')
    .filter((p) => p !== '')
    .map((p) => `${path.relative(repo, path.dirname(p))}/`);
}

/**
 * `paths` without `excluded` (both in git's `--directory` form): a path inside an excluded one
 * goes; a folder holding an excluded one is replaced by its entries, recursively, around it.
 */
export async function withoutExcluded(repo: string, paths: string[], excluded: string[]): Promise<string[]> {
  const out: string[] = [];
  for (const p of paths) {
    if (excluded.some((x) => covers(x, p))) continue;
    const inside = excluded.filter((x) => covers(p, x));
    if (inside.length === 0) {
      out.push(p);
      continue;
    }
    const entries = await fs.readdir(path.join(repo, p), { withFileTypes: true }).catch(() => []);
    const children = entries.map((d) => `${p}${d.name}${d.isDirectory() ? '/' : ''}`);
    out.push(...(await withoutExcluded(repo, children, inside)));
  }
  return out;
}

/** The ignored paths of `repo` that a new worktree should receive. */
export async function listIgnoredToCopy(repo: string, opts: { useIncludeFile?: boolean } = {}): Promise<IgnoredListing> {
  const ignored = (await lsFilesIgnored(repo, ['--exclude-standard'])).filter((p) => !isSlipwayOrGit(p));
  let chosen = collapse(ignored);
  let limitedByIncludeFile = false;
  if (opts.useIncludeFile !== false) {
    const includeFile = path.join(repo, WORKTREE_INCLUDE_FILE);
    const includeStat = await fs.stat(includeFile).catch(() => undefined);
    if (includeStat?.isFile()) {
      const included = await lsFilesIgnored(repo, [`--exclude-from=${includeFile}`]);
      chosen = intersect(ignored, included).filter((p) => !isSlipwayOrGit(p));
      limitedByIncludeFile = true;
    }
  }
  const defaults: string[] = [];
  for (const x of DEFAULT_COPY_EXCLUDES) {
    if (chosen.some((p) => covers(p, x) || covers(x, p)) && (await fs.lstat(path.join(repo, x)).then((st) => st.isDirectory(), () => false))) defaults.push(x);
  }
  const nested = await nestedRepositories(repo, chosen.filter((p) => p.endsWith('/') && !defaults.some((x) => covers(x, p))));
  const excluded = collapse([...defaults, ...nested]);
  if (excluded.length === 0) return { paths: chosen, limitedByIncludeFile };
  return { paths: await withoutExcluded(repo, chosen, excluded), limitedByIncludeFile, excluded };
}

/** Bytes under `p` (files and links as they are, links not followed). */
async function sizeOf(p: string): Promise<number> {
  const st = await fs.lstat(p).catch(() => undefined);
  if (!st) return 0;
  if (!st.isDirectory()) return st.size;
  const entries = await fs.readdir(p).catch(() => [] as string[]);
  let total = 0;
  for (const e of entries) total += await sizeOf(path.join(p, e));
  return total;
}

/** What a cold create would copy from `repo` and how big each path is (`slipway template check`). */
export async function describeIgnoredCopy(repo: string): Promise<{ paths: Array<{ path: string; bytes: number }>; totalBytes: number; excluded: string[]; limitedByIncludeFile: boolean }> {
  const listing = await listIgnoredToCopy(repo);
  const paths = await Promise.all(listing.paths.map(async (p) => ({ path: p, bytes: await sizeOf(path.join(repo, p)) })));
  return { paths, totalBytes: paths.reduce((sum, p) => sum + p.bytes, 0), excluded: listing.excluded ?? [], limitedByIncludeFile: listing.limitedByIncludeFile };
}

let gnuCp: Promise<boolean> | undefined;
/** GNU cp copies trees of small files faster than Node's fs.cp and knows --reflink=auto. */
export function hasGnuCp(): Promise<boolean> {
  gnuCp ??= execFileAsync('cp', ['--version'], { encoding: 'utf8' })
    .then(({ stdout }) => stdout.includes('GNU coreutils'))
    .catch(() => false);
  return gnuCp;
}

function runCp(args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn('cp', args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => {
      if (stderr.length < 8192) stderr += c.toString('utf8');
    });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(stderr.trim() || `cp exited with ${code}`))));
  });
}

/** Node's copy: reflink when the filesystem can, a plain copy otherwise; links verbatim. */
async function nodeCopy(src: string, dest: string): Promise<void> {
  await fs.cp(src, dest, {
    recursive: true,
    force: false,
    errorOnExist: false,
    verbatimSymlinks: true,
    preserveTimestamps: true,
    mode: constants.COPYFILE_FICLONE,
  });
}

export interface CopyIgnoredOptions {
  /** Force a copy method (tests and benchmarks); default: GNU cp when present, else Node. */
  method?: CopyMethod;
  /**
   * Honour the source's `.worktreeinclude` (default true). False when copying from a prepared
   * template, which holds only what was chosen already plus what project setup made.
   */
  useIncludeFile?: boolean;
  /** What to copy, when the caller listed it already (listIgnoredToCopy of `repo`). */
  listing?: IgnoredListing;
}

/** Copies the ignored files of `repo` into the worktree at `dest`. */
export async function copyIgnoredFiles(repo: string, dest: string, options: CopyIgnoredOptions = {}): Promise<CopyIgnoredResult> {
  const started = Date.now();
  const { paths, limitedByIncludeFile } = options.listing ?? (await listIgnoredToCopy(repo, { useIncludeFile: options.useIncludeFile }));
  const method: CopyMethod = options.method ?? ((await hasGnuCp()) ? 'gnu-cp' : 'node');
  const warnings: string[] = [];
  const copied: string[] = [];

  // GNU cp takes many sources per call when they share a destination folder and none of
  // them exists there yet; everything else goes through Node's merging copy.
  const batches = new Map<string, Array<{ entry: string; src: string }>>();
  for (const entry of paths) {
    const rel = entry.endsWith('/') ? entry.slice(0, -1) : entry;
    const src = path.join(repo, rel);
    const target = path.join(dest, rel);
    const exists = await fs.lstat(target).then(
      () => true,
      () => false,
    );
    if (method === 'gnu-cp' && !exists) {
      const dir = path.dirname(target);
      batches.set(dir, [...(batches.get(dir) ?? []), { entry, src }]);
      continue;
    }
    try {
      await fs.mkdir(path.dirname(target), { recursive: true });
      await nodeCopy(src, target);
      copied.push(entry);
    } catch (e) {
      warnings.push(`${entry}: ${(e as Error).message}`);
    }
  }
  for (const [dir, sources] of batches) {
    await fs.mkdir(dir, { recursive: true });
    for (let i = 0; i < sources.length; i += 200) {
      const chunk = sources.slice(i, i + 200);
      // -R -P: recurse, copy symlinks as symlinks. No -a/--preserve=links: never hard links.
      try {
        await runCp(['-R', '-P', '--preserve=mode,timestamps', '--reflink=auto', '--', ...chunk.map((c) => c.src), dir + path.sep]);
        copied.push(...chunk.map((c) => c.entry));
      } catch (e) {
        warnings.push(`${chunk.map((c) => c.entry).join(', ')}: ${(e as Error).message}`);
      }
    }
  }
  copied.sort();
  return { paths: copied, warnings, method, limitedByIncludeFile, durationMs: Date.now() - started };
}
