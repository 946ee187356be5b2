/**
 * Fills a worktree added with `--no-checkout`: the checkout of its tracked files and the copy of
 * the ignored files (dependencies) run at the same time, since they write different paths. An
 * ignored entry that the commit also tracks something at or under (a `dist/` tracked on the
 * branch, say) is copied after the checkout, merging, so tracked files always win.
 */
import { git, rawGit } from '../../lib/git';
import { copyIgnoredFiles, listIgnoredToCopy, type CopyIgnoredResult, type CopyMethod, type IgnoredListing } from './copy-ignored';

const strip = (entry: string) => (entry.endsWith('/') ? entry.slice(0, -1) : entry);

/** Entries (git's --directory form) under or at which `commit` tracks something. */
async function trackedUnder(repo: string, commit: string, entries: string[]): Promise<Set<string>> {
  const found = new Set<string>();
  for (let i = 0; i < entries.length; i += 200) {
    const chunk = entries.slice(i, i + 200);
    const out = await rawGit(repo, ['ls-tree', '-r', '-z', '--name-only', '--full-tree', commit, '--', ...chunk.map(strip)]);
    const tracked = out.split('\0').filter(Boolean);
    if (tracked.length === 0) continue;
    for (const entry of chunk) {
      const dir = entry.endsWith('/') ? entry : `${entry}/`;
      if (tracked.some((t) => t === strip(entry) || t.startsWith(dir))) found.add(entry);
    }
  }
  return found;
}

export interface PopulateOptions {
  repo: string;
  /** The worktree, added with --no-checkout. */
  root: string;
  /** The commit its HEAD is at. */
  commit: string;
  /** Where ignored files come from (the checkout or a template); absent: none are copied. */
  source?: string;
  /** Honour `.worktreeinclude` in the source (false for templates). */
  useIncludeFile?: boolean;
  method?: CopyMethod;
  /** The source's listing, when the caller started it already (while the worktree was added). */
  listing?: Promise<IgnoredListing>;
}

export async function populateWorktree(opts: PopulateOptions): Promise<CopyIgnoredResult | undefined> {
  const checkout = () => git(opts.root, ['reset', '--hard', '-q']);
  if (!opts.source) {
    await checkout();
    return undefined;
  }
  const started = Date.now();
  const listing = await (opts.listing ?? listIgnoredToCopy(opts.source, { useIncludeFile: opts.useIncludeFile }));
  const later = listing.paths.length > 0 ? await trackedUnder(opts.repo, opts.commit, listing.paths) : new Set<string>();
  const now = listing.paths.filter((p) => !later.has(p));
  const [, first] = await Promise.all([
    checkout(),
    copyIgnoredFiles(opts.source, opts.root, { method: opts.method, listing: { paths: now, limitedByIncludeFile: listing.limitedByIncludeFile } }),
  ]);
  if (later.size === 0) return { ...first, durationMs: Date.now() - started };
  const second = await copyIgnoredFiles(opts.source, opts.root, { method: opts.method, listing: { paths: [...later], limitedByIncludeFile: listing.limitedByIncludeFile } });
  return {
    paths: [...first.paths, ...second.paths].sort(),
    warnings: [...first.warnings, ...second.warnings],
    method: first.method,
    limitedByIncludeFile: listing.limitedByIncludeFile,
    durationMs: Date.now() - started,
  };
}
