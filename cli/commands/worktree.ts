/**
 * `slipway worktree list|review|merge|discard`: one stream's work, the way users of worktree
 * tools expect. They operate on the repository in the current directory (or `--repo`), locally,
 * like git: streams are the `slipway/<objective>/<stream>` branches, with their worktree while
 * the stream runs.
 *
 *   list                      streams, their worktrees, commits ahead of their base
 *   review <stream> [-- path] the commits and the diff against the stream's base (and the worktree's uncommitted changes)
 *   merge <stream> --strategy ff|squash|merge
 *                             into the user's current branch, only when the checkout is clean (else exit 2, nothing changed)
 *   discard <stream>          remove the worktree and the branch (refused while the objective runs, unless --force)
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import { BRANCH_PREFIX, integrationBranch, objectiveWorkflowId } from '../../core/ids';
import { currentBranch, git, gitMaybe, gitWithIdentity, listWorktrees, rawGit, repositoryRoot, resolveCommit, trashBranch } from '../../lib/git';
import { locateWorktree, trustedWorktreeArgs } from '../../activities/sandbox/sandbox-git';
import { LocalSandboxProvider, localSandboxRoot, readSandboxRecord, sandboxRecordPath } from '../../activities/sandbox/local';
import { readRegistry } from '../../activities/sandbox/registry';
import { CliError, EXIT } from '../exit-codes';
import { GROUP_DESCRIPTIONS } from '../verbs';
import { openRuntime } from '../runtime';

/** The repository: `--repo`, else the one holding the current directory (its main checkout, not a Slipway worktree). */
export async function resolveRepo(repo: string | undefined): Promise<string> {
  const dir = path.resolve(repo ?? process.cwd());
  const top = await repositoryRoot(dir).catch(() => undefined);
  if (!top) throw new CliError(`${dir} is not inside a git repository (use --repo)`);
  // From inside a Slipway worktree, act on the repository it belongs to.
  const common = path.resolve(top, await git(top, ['rev-parse', '--git-common-dir']));
  const main = (await listWorktrees(top))[0]?.path;
  const root = main && path.resolve(main, '.git') === common ? main : top;
  return fs.realpath(root);
}

/** Branch folders under slipway/ that belong to the sandbox service, not to objectives. */
const SERVICE_GROUPS = new Set(['sandboxes', 'warm']);

export interface StreamRef {
  objective: string;
  stream: string;
  branch: string;
  head: string;
  worktree?: string;
  base?: string;
  state?: string;
  origin?: string;
}

async function streams(repo: string): Promise<StreamRef[]> {
  const out = await rawGit(repo, ['for-each-ref', '--format=%(refname:short) %(objectname)', `refs/heads/${BRANCH_PREFIX}/`]);
  const worktrees = await listWorktrees(repo);
  const registry = await readRegistry().catch(() => undefined);
  const refs: StreamRef[] = [];
  for (const line of out.split('\n').filter(Boolean)) {
    const [branch, head] = line.split(' ');
    const parts = branch.split('/');
    if (parts.length !== 3 || SERVICE_GROUPS.has(parts[1])) continue;
    const [, objective, stream] = parts;
    const record = await readSandboxRecord(sandboxRecordPath(repo, objective, stream));
    const wt = worktrees.find((w) => w.branch === branch && !w.prunable);
    refs.push({
      objective,
      stream,
      branch,
      head,
      ...(wt ? { worktree: wt.path } : {}),
      base: record?.baseCommit ?? registry?.repositories[repo]?.objectives[objective]?.baseCommit,
      ...(record ? { state: record.state, origin: record.origin } : {}),
    });
  }
  return refs;
}

async function findStream(repo: string, stream: string, objective?: string): Promise<StreamRef> {
  const all = await streams(repo);
  const matches = all.filter((s) => s.stream === stream && (!objective || s.objective === objective));
  if (matches.length === 0) {
    const known = all.filter((s) => !objective || s.objective === objective).map((s) => `${s.objective}/${s.stream}`);
    throw new CliError(`no stream "${stream}"${objective ? ` in objective "${objective}"` : ''} in ${repo}${known.length ? ` (streams: ${known.join(', ')})` : ''}`);
  }
  if (matches.length > 1) {
    throw new CliError(`stream "${stream}" exists in several objectives (${matches.map((m) => m.objective).join(', ')}); pick one with --objective`);
  }
  return matches[0];
}

/** The commit a stream started from: its record, the registry, else where it meets the integration branch or HEAD. */
async function baseOf(repo: string, s: StreamRef): Promise<string> {
  if (s.base && (await gitMaybe(repo, ['cat-file', '-e', `${s.base}^{commit}`])) !== undefined) return s.base;
  const integration = integrationBranch(s.objective);
  const other = s.branch !== integration && (await gitMaybe(repo, ['rev-parse', '--verify', '--quiet', `refs/heads/${integration}`])) ? integration : 'HEAD';
  return (await gitMaybe(repo, ['merge-base', s.branch, other])) ?? (await resolveCommit(repo, 'HEAD'));
}

const ahead = async (repo: string, base: string, head: string) => Number(await git(repo, ['rev-list', '--count', `${base}..${head}`]));

export async function worktreeListCommand(opts: { repo?: string; objective?: string; json?: boolean }): Promise<number> {
  const repo = await resolveRepo(opts.repo);
  const rows = [];
  for (const s of (await streams(repo)).filter((s) => !opts.objective || s.objective === opts.objective)) {
    const base = await baseOf(repo, s);
    rows.push({ ...s, base, ahead: await ahead(repo, base, s.head), dirty: s.worktree ? await dirtyWorktree(repo, s.worktree) : false });
  }
  if (opts.json) {
    process.stdout.write(`${JSON.stringify(rows)}\n`);
    return EXIT.ok;
  }
  if (rows.length === 0) {
    process.stdout.write(`no Slipway streams in ${repo}\n`);
    return EXIT.ok;
  }
  for (const r of rows) {
    const where = r.worktree ? path.relative(repo, r.worktree) : '(no worktree)';
    process.stdout.write(
      `${r.objective.padEnd(28)} ${r.stream.padEnd(16)} ${String(r.ahead).padStart(3)} ahead of ${r.base.slice(0, 10)}  ${where}${r.dirty ? '  (uncommitted changes)' : ''}\n`,
    );
  }
  return EXIT.ok;
}

export async function worktreeReviewCommand(stream: string, paths: string[], opts: { repo?: string; objective?: string; stat?: boolean }): Promise<number> {
  const repo = await resolveRepo(opts.repo);
  const s = await findStream(repo, stream, opts.objective);
  const base = await baseOf(repo, s);
  const spec = paths.length > 0 ? ['--', ...paths] : [];
  const out: string[] = [];
  out.push(`stream ${s.stream} of ${s.objective}: branch ${s.branch} at ${s.head.slice(0, 12)}, base ${base.slice(0, 12)}`);
  out.push(`worktree: ${s.worktree ?? '(none: the stream has ended or was discarded)'}`);
  const log = await git(repo, ['log', '--reverse', '--format=%h %s', `${base}..${s.head}`, ...spec]);
  out.push('', `commits (${log ? log.split('\n').length : 0}):`, ...(log ? log.split('\n').map((l) => `  ${l}`) : ['  (none)']));
  out.push('', await git(repo, ['diff', '--stat', `${base}..${s.head}`, ...spec]) || '(no changes)');
  if (!opts.stat) {
    const diff = await rawGit(repo, ['diff', '--no-color', `${base}..${s.head}`, ...spec]);
    if (diff) out.push('', diff.trimEnd());
  }
  if (s.worktree) {
    const status = await git(s.worktree, [...(await wtArgs(repo, s.worktree)), 'status', '--porcelain', '--untracked-files=all', ...spec]).catch(() => '');
    if (status) {
      out.push('', 'uncommitted in the worktree (not part of the branch):', ...status.split('\n').map((l) => `  ${l}`));
      if (!opts.stat) {
        const wdiff = await rawGit(s.worktree, [...(await wtArgs(repo, s.worktree)), 'diff', '--no-color', 'HEAD', ...spec]).catch(() => '');
        if (wdiff) out.push('', wdiff.trimEnd());
      }
    }
  }
  process.stdout.write(`${out.join('\n')}\n`);
  return EXIT.ok;
}

/** Why the user's checkout cannot take a merge now, or undefined when it can. */
async function notMergeable(repo: string): Promise<string | undefined> {
  const branch = await currentBranch(repo);
  if (!branch) return 'the checkout has a detached HEAD; check out the branch to merge into';
  const gitDir = path.resolve(repo, await git(repo, ['rev-parse', '--git-dir']));
  for (const marker of ['MERGE_HEAD', 'CHERRY_PICK_HEAD', 'REVERT_HEAD', 'rebase-merge', 'rebase-apply', 'BISECT_LOG']) {
    if (await fs.lstat(path.join(gitDir, marker)).then(() => true, () => false)) return `an operation is in progress in the checkout (${marker})`;
  }
  // Untrimmed and NUL-separated: `git()` trims, which cut the first path's leading status column
  // (" M README.md" -> "EADME.md"), and -z leaves paths unquoted.
  const paths = porcelainPaths(await rawGit(repo, ['status', '--porcelain', '-z', '--untracked-files=normal']));
  if (paths.length > 0) {
    return `the checkout is not clean (${paths.length} changed or untracked path${paths.length === 1 ? '' : 's'}: ${paths.slice(0, 5).join(', ')}${paths.length > 5 ? ', ...' : ''}); commit or stash first`;
  }
  return undefined;
}

/** The paths of `git status --porcelain -z`: "XY path\0", with a rename's or copy's source after it. */
export function porcelainPaths(out: string): string[] {
  const fields = out.split('\0');
  const paths: string[] = [];
  for (let i = 0; i < fields.length; i++) {
    const entry = fields[i]!;
    if (entry.length < 4) continue;
    paths.push(entry.slice(3));
    if (entry[0] === 'R' || entry[0] === 'C') i++; // the source path follows
  }
  return paths;
}

export async function worktreeMergeCommand(stream: string, opts: { repo?: string; objective?: string; strategy?: string; message?: string }): Promise<number> {
  const strategy = opts.strategy ?? 'merge';
  if (!['ff', 'squash', 'merge'].includes(strategy)) throw new CliError(`--strategy must be ff, squash or merge, got "${strategy}"`);
  const repo = await resolveRepo(opts.repo);
  const s = await findStream(repo, stream, opts.objective);
  const refusal = await notMergeable(repo);
  if (refusal) throw new CliError(`refusing to merge ${s.branch}: ${refusal}. Nothing was changed.`, EXIT.badInput);
  const into = (await currentBranch(repo))!;
  const before = await resolveCommit(repo, 'HEAD');
  if (await gitMaybe(repo, ['merge-base', '--is-ancestor', s.head, before]).then((r) => r !== undefined)) {
    process.stdout.write(`${s.branch} is already contained in ${into}; nothing to merge\n`);
    return EXIT.ok;
  }
  const message = opts.message ?? `slipway: ${strategy === 'squash' ? 'squash' : 'merge'} stream ${s.stream} of objective ${s.objective}`;
  if (strategy === 'ff') {
    try {
      await git(repo, ['merge', '--ff-only', '-q', s.head]);
    } catch {
      throw new CliError(`cannot fast-forward ${into} to ${s.branch} (they have diverged); use --strategy merge or squash. Nothing was changed.`, EXIT.badInput);
    }
  } else {
    try {
      if (strategy === 'squash') {
        await gitWithIdentity(repo, ['merge', '--squash', '-q', s.head]);
        const log = await git(repo, ['log', '--reverse', '--format=- %s', `${before}..${s.head}`]);
        await gitWithIdentity(repo, ['commit', '-q', '--no-verify', '-m', `${message}\n\n${log}`]);
      } else {
        await gitWithIdentity(repo, ['merge', '--no-ff', '--no-edit', '-q', '-m', message, s.head]);
      }
    } catch (e) {
      const files = (await gitMaybe(repo, ['diff', '--name-only', '--diff-filter=U']))?.split('\n').filter(Boolean) ?? [];
      // The checkout was clean: put it back exactly as it was.
      await gitMaybe(repo, ['merge', '--abort']);
      await git(repo, ['reset', '--hard', '-q', before]);
      throw new CliError(
        `${strategy} of ${s.branch} into ${into} failed${files.length ? `: conflicts in ${files.join(', ')}` : `: ${(e as Error).message}`}. The checkout is back as it was.`,
        EXIT.runFailed,
      );
    }
  }
  const after = await resolveCommit(repo, 'HEAD');
  process.stdout.write(`merged ${s.branch} into ${into} (${strategy}): ${before.slice(0, 10)} -> ${after.slice(0, 10)}\n`);
  if (s.worktree && (await dirtyWorktree(repo, s.worktree))) {
    process.stdout.write(`note: ${s.worktree} has uncommitted changes that were not part of the branch\n`);
  }
  process.stdout.write(`remove the stream with: slipway worktree discard ${s.stream} --objective ${s.objective}\n`);
  return EXIT.ok;
}

/** Is the objective still running? Undefined when Temporal cannot be asked (quickly). */
async function objectiveRunning(objective: string): Promise<boolean | undefined> {
  const ask = (async () => {
    const runtime = await openRuntime({ startIfMissing: false });
    try {
      const d = await runtime.client.workflow.getHandle(objectiveWorkflowId(objective)).describe();
      return d.status.name === 'RUNNING';
    } catch (e) {
      if ((e as Error).name === 'WorkflowNotFoundError') return false;
      throw e;
    } finally {
      await runtime.close();
    }
  })();
  return Promise.race([ask.catch(() => undefined), new Promise<undefined>((r) => setTimeout(() => r(undefined), 8_000).unref())]);
}

export async function worktreeDiscardCommand(stream: string, opts: { repo?: string; objective?: string; force?: boolean }): Promise<number> {
  const repo = await resolveRepo(opts.repo);
  const s = await findStream(repo, stream, opts.objective);
  if (!opts.force) {
    const running = await objectiveRunning(s.objective);
    if (running) throw new CliError(`objective ${s.objective} is still running; discarding ${s.branch} would pull the sandbox from under it (use --force to do it anyway)`);
    if (running === undefined) {
      throw new CliError(`could not ask Temporal whether objective ${s.objective} still runs; if you know it has ended (or its server is gone), use --force`);
    }
  }
  const base = await baseOf(repo, s);
  const lost = await ahead(repo, base, s.head);
  const provider = new LocalSandboxProvider({ copyIgnored: false });
  const root = s.worktree ?? localSandboxRoot(repo, s.objective, s.stream);
  if (s.worktree || (await fs.lstat(root).then(() => true, () => false))) await provider.destroy({ repository: repo, root });
  const trash = await trashBranch(repo, s.branch, s.head);
  await fs.rm(sandboxRecordPath(repo, s.objective, s.stream), { force: true });
  process.stdout.write(
    `discarded ${s.branch} (${lost} commit${lost === 1 ? '' : 's'} past its base, last ${s.head.slice(0, 10)})${s.worktree ? ` and its worktree ${s.worktree}` : ''}; ` +
      `undo with: git branch ${s.branch} ${trash}\n`,
  );
  return EXIT.ok;
}

/** `slipway worktree ...` */
export function registerWorktreeCommands(program: Command, setExit: (code: number) => void): void {
  const wt = program.command('worktree').description(GROUP_DESCRIPTIONS.worktree);
  const repoOpt = (cmd: Command) => cmd.option('--repo <path>', 'repository (default: the one in the current directory)').option('--objective <id>', 'objective of the stream (needed when several have it)');
  repoOpt(wt.command('list').description('streams with their branches, worktrees and commits ahead of their base'))
    .option('--json', 'print JSON')
    .action(async (opts) => setExit(await worktreeListCommand(opts)));
  repoOpt(wt.command('review').description("a stream's commits and diff against its base (paths after --)"))
    .argument('<stream>')
    .argument('[paths...]')
    .option('--stat', 'only the summary, no patch')
    .action(async (stream: string, paths: string[], opts) => setExit(await worktreeReviewCommand(stream, paths, opts)));
  repoOpt(wt.command('merge').description("merge a stream into your current branch; refused unless your checkout is clean"))
    .argument('<stream>')
    .requiredOption('--strategy <strategy>', 'ff, squash or merge')
    .option('-m, --message <text>', 'commit message (squash, merge)')
    .action(async (stream: string, opts) => setExit(await worktreeMergeCommand(stream, opts)));
  repoOpt(wt.command('discard').description("remove a stream's worktree and branch"))
    .argument('<stream>')
    .option('--force', 'even while its objective runs')
    .action(async (stream: string, opts) => setExit(await worktreeDiscardCommand(stream, opts)));
}


/**
 * Git addresses a sandbox's worktree through the repository's record of it, never through the
 * worktree's own `.git` file, which its agent controls (ADR 0006). A confined sandbox's latest
 * commits reach the branch when Slipway collects them; until then they are not shown here.
 */
async function wtArgs(repo: string, worktree: string): Promise<string[]> {
  return trustedWorktreeArgs(await locateWorktree(repo, worktree));
}

async function dirtyWorktree(repo: string, worktree: string): Promise<boolean> {
  const out = await git(worktree, [...(await wtArgs(repo, worktree)), 'status', '--porcelain', '--untracked-files=all']).catch(() => '');
  return out.length > 0;
}
