/**
 * Git plumbing used by sandboxes and the merge queue. Every command runs with `-C <dir>`
 * on a Slipway worktree or on refs only, never on the user's working tree or index.
 */
import { writeFileAtomic } from './atomic-write';
import { Context } from '@temporalio/activity';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { isPayloadKeyVariable } from './payload-keys';
import { spawnFile } from './spawner';
import { SLIPWAY_DIR, SLIPWAY_STATE } from '../core/ids';
import { atLeast, parseVersion } from './version';

/** Identity for commits Slipway makes when the repository has none configured. */
export const SLIPWAY_GIT_IDENTITY = { name: 'Slipway', email: 'slipway@localhost' };

export class GitError extends Error {
  constructor(readonly args: string[], readonly exitCode: number | null, readonly stderr: string, readonly stdout?: string) {
    super(`git ${args.join(' ')} failed (exit ${exitCode}): ${stderr.trim()}`);
    this.name = 'GitError';
  }
}

/**
 * A git command whose exit status is its answer (`merge-base --is-ancestor`, `diff --quiet`): 0
 * yes, 1 no. Anything else (killed, timed out, a broken repository) is an error, never a "no".
 */
export function gitAnswer(call: Promise<unknown>): Promise<boolean> {
  return call.then(
    () => true,
    (e: unknown) => {
      if (e instanceof GitError && e.exitCode === 1) return false;
      throw e;
    },
  );
}

/**
 * Options on every git call Slipway makes. Slipway's git only ever runs on the user's repository
 * and its merger worktree (sandbox git runs inside the sandbox), and these neutralise what a
 * config could still make git execute (fsmonitor, hooks, ssh or ext transports), so a tampered
 * config cannot run code outside a sandbox.
 */
export const GIT_HARDENING = [
  '-c', 'core.fsmonitor=false',
  '-c', 'core.hooksPath=/dev/null',
  '-c', 'core.sshCommand=false',
  '-c', 'protocol.ext.allow=never',
  '-c', 'core.pager=cat',
];

/**
 * Inside an activity, its cancellation signal: a cancelled activity's git calls are killed with it.
 * Outside one (CLI, tests), none.
 */
function currentActivitySignal(): AbortSignal | undefined {
  try {
    return Context.current().cancellationSignal;
  } catch {
    return undefined;
  }
}

/** Longest a single git call may run before it is killed (a hung lock, a huge repository). */
export const GIT_TIMEOUT_MS = 10 * 60_000;

/**
 * The worker's environment without git's own variables (GIT_DIR, GIT_INDEX_FILE,
 * GIT_CONFIG_*, ...), which would redirect a call to another repository or config; commit
 * identity variables stay. `extra` is laid over it.
 */
export function gitEnv(extra: Record<string, string | undefined> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (k.startsWith('GIT_') && !/^GIT_(AUTHOR|COMMITTER)_(NAME|EMAIL)$/.test(k)) continue;
    // The history encryption keys never reach git (or a hook of the user's repository).
    if (isPayloadKeyVariable(k)) continue;
    env[k] = v;
  }
  return { ...env, ...extra, GIT_TERMINAL_PROMPT: '0' };
}

/**
 * Runs git and fails on a non-zero exit. (simple-git was tried first: it resolves some failing
 * commands, such as `rev-parse --verify --quiet` of a missing ref, as success; see ADR 0001.)
 * `env` holds only the variables to add (GIT_INDEX_FILE for a scratch index, identity).
 */
export function rawGit(dir: string, args: string[], env?: Record<string, string | undefined>, signal: AbortSignal | undefined = currentActivitySignal()): Promise<string> {
  return runGit(dir, args, { env, signal });
}

/** `rawGit` with `input` on git's stdin (`hash-object --stdin`, a `commit-tree` message): no scratch file. */
export function rawGitWithInput(dir: string, args: string[], input: string, env?: Record<string, string | undefined>): Promise<string> {
  return runGit(dir, args, { input, env, signal: currentActivitySignal() });
}

function runGit(dir: string, args: string[], opts: { env?: Record<string, string | undefined>; signal?: AbortSignal; input?: string }): Promise<string> {
  return new Promise((resolve, reject) => {
    // Through the worker's spawner when it runs (ADR 0036): a fork of the big worker per git call is what costs.
    spawnFile(
      'git',
      [...GIT_HARDENING, '-C', dir, ...args],
      { env: gitEnv(opts.env), maxBuffer: 64 * 1024 * 1024, timeout: GIT_TIMEOUT_MS, killSignal: 'SIGKILL', ...(opts.signal ? { signal: opts.signal } : {}), ...(opts.input !== undefined ? { input: opts.input } : {}) },
      (error, stdout, stderr) => {
        if (error) reject(new GitError(args, typeof error.code === 'number' ? error.code : null, stderr || error.message, stdout));
        else resolve(stdout);
      },
    );
  });
}

export async function git(dir: string, args: string[]): Promise<string> {
  return (await rawGit(dir, args)).trim();
}

/** Like `git` but returns undefined instead of throwing (for probes such as rev-parse). */
export async function gitMaybe(dir: string, args: string[]): Promise<string | undefined> {
  try {
    return await git(dir, args);
  } catch {
    return undefined;
  }
}

export async function isGitRepository(dir: string): Promise<boolean> {
  return (await gitMaybe(dir, ['rev-parse', '--git-dir'])) !== undefined;
}

export async function repositoryRoot(dir: string): Promise<string> {
  return git(dir, ['rev-parse', '--show-toplevel']);
}

export async function currentBranch(dir: string): Promise<string | undefined> {
  return gitMaybe(dir, ['symbolic-ref', '--quiet', '--short', 'HEAD']);
}

/**
 * A repository's common git dir, asked of git once per repository and process: every confined
 * exec and every lock clear needs it, and it does not change while Slipway works on the
 * repository. `fresh` asks git again (and keeps that answer): a caller that writes there, such as
 * `ensureSlipwayExcluded`, never trusts a cached answer that may have outlived a repository
 * deleted or made again at the same path (ADR 0018, 2026-11-29).
 */
const commonDirs = new Map<string, Promise<string>>();
export function commonDirOf(repo: string, opts: { fresh?: boolean } = {}): Promise<string> {
  const known = opts.fresh ? undefined : commonDirs.get(repo);
  if (known) return known;
  const asked = git(repo, ['rev-parse', '--git-common-dir']).then((out) => fs.realpath(path.resolve(repo, out)));
  // A failed answer is forgotten, unless a later one replaced it already.
  asked.catch(() => commonDirs.get(repo) === asked && commonDirs.delete(repo));
  commonDirs.set(repo, asked);
  return asked;
}

export async function resolveCommit(dir: string, ref: string): Promise<string> {
  return git(dir, ['rev-parse', '--verify', '--quiet', `${ref}^{commit}`]);
}

export async function branchExists(dir: string, branch: string): Promise<boolean> {
  return (await gitMaybe(dir, ['rev-parse', '--verify', '--quiet', `refs/heads/${branch}`])) !== undefined;
}

export async function isAncestor(dir: string, ancestor: string, descendant: string): Promise<boolean> {
  try {
    await rawGit(dir, ['merge-base', '--is-ancestor', ancestor, descendant]);
    return true;
  } catch {
    return false;
  }
}

/**
 * Keeps Slipway's state under `.slipway/` out of git through .git/info/exclude (the user's
 * .gitignore stays untouched), and only that: `.slipway/config.yaml` and `.slipway/blueprints/`
 * stay visible so a team can commit them. An older Slipway's `/.slipway/` line hid them all;
 * it is replaced.
 */
export async function ensureSlipwayExcluded(repository: string): Promise<void> {
  const commonDir = await commonDirOf(repository, { fresh: true });
  const excludeFile = path.join(commonDir, 'info', 'exclude');
  const wanted = SLIPWAY_STATE.map((entry) => `/${SLIPWAY_DIR}/${entry}`);
  const header = `# added by Slipway: its state under ${SLIPWAY_DIR}/ (${SLIPWAY_DIR}/config.yaml and ${SLIPWAY_DIR}/blueprints/ stay yours to commit)`;
  let current = '';
  try {
    current = await fs.readFile(excludeFile, 'utf8');
  } catch {
    await fs.mkdir(path.dirname(excludeFile), { recursive: true });
  }
  const lines = current.split('\n');
  const legacy = (l: string) => l.trim() === `/${SLIPWAY_DIR}/`;
  const present = new Set(lines.map((l) => l.trim()));
  const missing = wanted.filter((w) => !present.has(w));
  if (missing.length === 0 && !lines.some(legacy)) return;
  if (!lines.some(legacy)) {
    // Append what a newer Slipway added to the list.
    const prefix = current.length > 0 && !current.endsWith('\n') ? '\n' : '';
    const block = lines.some((l) => l.startsWith('# added by Slipway')) ? missing : [header, ...missing];
    await fs.appendFile(excludeFile, `${prefix}${block.join('\n')}\n`);
    return;
  }
  // Migrate: the old line (and the comment written with it) becomes the list, in its place.
  const out: string[] = [];
  for (const [i, l] of lines.entries()) {
    if (l.startsWith('# added by Slipway') && lines[i + 1] !== undefined && legacy(lines[i + 1]!)) continue;
    if (legacy(l)) {
      if (!out.includes(header)) out.push(header, ...missing);
      continue;
    }
    out.push(l);
  }
  // Written whole and renamed into place: a reader never sees a half-written exclude file.
  await writeFileAtomic(excludeFile, out.join('\n'));
}

/**
 * `user.name` and `user.email` as git resolves them for `dir` (every scope, the last value of each
 * wins, as `git config <key>` answers), read in one git call instead of one per key: identity is
 * read for every agent run, commit and merge (docs/adr/0018-orchestration-overhead.md,
 * 2026-11-29). Missing or empty: undefined.
 */
async function configuredIdentity(dir: string): Promise<{ name?: string; email?: string }> {
  // Exit 1 when neither is set. Any other failure (a missing folder, a broken config, a killed
  // git) leaves both unset too, as the two `git config <key>` calls did before.
  const out = await rawGit(dir, ['config', '-z', '--get-regexp', '^user\\.(name|email)$']).catch(() => '');
  const found: { name?: string; email?: string } = {};
  // `-z`: each entry is "key\nvalue\0", or "key\0" for a key without a value.
  for (const entry of out.split('\0')) {
    const nl = entry.indexOf('\n');
    const key = nl < 0 ? entry : entry.slice(0, nl);
    const value = nl < 0 ? '' : entry.slice(nl + 1).trim();
    if (key === 'user.name') found.name = value || undefined;
    else if (key === 'user.email') found.email = value || undefined;
  }
  return found;
}

/** The identity commits made for a repository carry: its configured one, else Slipway's. */
export async function commitIdentity(dir: string): Promise<{ name: string; email: string }> {
  const { name, email } = await configuredIdentity(dir);
  return { name: name ?? SLIPWAY_GIT_IDENTITY.name, email: email ?? SLIPWAY_GIT_IDENTITY.email };
}

/** That identity as the variables git reads, for commits made where the repository's config is not seen. */
export async function commitIdentityVariables(dir: string): Promise<Record<string, string>> {
  const { name, email } = await commitIdentity(dir);
  return { GIT_AUTHOR_NAME: name, GIT_COMMITTER_NAME: name, GIT_AUTHOR_EMAIL: email, GIT_COMMITTER_EMAIL: email };
}

/**
 * Environment that gives commits an identity when the repository has none and the worker's
 * environment names none either (its GIT_AUTHOR_* and GIT_COMMITTER_* win over Slipway's).
 */
export async function commitIdentityEnv(dir: string): Promise<Record<string, string>> {
  const { name, email } = await configuredIdentity(dir);
  const env: Record<string, string> = {};
  if (!email && !process.env.GIT_AUTHOR_EMAIL) env.GIT_AUTHOR_EMAIL = SLIPWAY_GIT_IDENTITY.email;
  if (!email && !process.env.GIT_COMMITTER_EMAIL) env.GIT_COMMITTER_EMAIL = SLIPWAY_GIT_IDENTITY.email;
  if (!name && !process.env.GIT_AUTHOR_NAME) env.GIT_AUTHOR_NAME = SLIPWAY_GIT_IDENTITY.name;
  if (!name && !process.env.GIT_COMMITTER_NAME) env.GIT_COMMITTER_NAME = SLIPWAY_GIT_IDENTITY.name;
  return env;
}

export async function gitWithIdentity(dir: string, args: string[]): Promise<string> {
  const env = await commitIdentityEnv(dir);
  return (await rawGit(dir, args, env)).trim();
}

export interface WorktreeEntry {
  path: string;
  head: string;
  branch?: string;
  prunable: boolean;
}

/**
 * `git worktree list` can fail while a concurrent `git worktree add` is half way (its admin folder
 * exists, but not yet its `gitdir`, `commondir` or `HEAD` file: "failed to read
 * .git/worktrees/<id>/commondir"), while a concurrent remove deletes a file git saw a moment
 * before (its `locked` marker: "failed to read '.git/worktrees/<id>/locked'"), or while a prune
 * removes an admin folder it is reading ("Invalid path '.git/worktrees/<id>': No such file or
 * directory"): that is transient, so try again briefly.
 */
export const HALF_ADDED_WORKTREE = /\/worktrees\/[^/\s']+(\/(gitdir|commondir|HEAD|locked)\b|': No such file or directory)/;
/** Runs `run` (a git command over the repository's worktrees) again while it fails on a half-added worktree. */
export async function retryHalfAddedWorktree<T>(run: (attempt: number) => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run(attempt);
    } catch (e) {
      if (attempt >= 8 || !(e instanceof GitError) || !HALF_ADDED_WORKTREE.test(e.stderr)) throw e;
      await new Promise((r) => setTimeout(r, 25 * attempt));
    }
  }
}

/** `git worktree add <args>`; it reads every other worktree's record, so it waits out half-added ones too. */
export function addWorktree(repository: string, args: string[]): Promise<string> {
  return retryHalfAddedWorktree(() => git(repository, ['worktree', 'add', ...args]));
}

function worktreeListOutput(repository: string): Promise<string> {
  return retryHalfAddedWorktree(() => git(repository, ['worktree', 'list', '--porcelain']));
}

export async function listWorktrees(repository: string): Promise<WorktreeEntry[]> {
  const out = await worktreeListOutput(repository);
  const entries: WorktreeEntry[] = [];
  let current: Partial<WorktreeEntry> | undefined;
  for (const line of out.split('\n')) {
    if (line.startsWith('worktree ')) {
      if (current?.path) entries.push({ prunable: false, head: '', ...current } as WorktreeEntry);
      current = { path: line.slice('worktree '.length) };
    } else if (current && line.startsWith('HEAD ')) current.head = line.slice(5);
    else if (current && line.startsWith('branch ')) current.branch = line.slice(7).replace(/^refs\/heads\//, '');
    else if (current && line.startsWith('prunable')) current.prunable = true;
  }
  if (current?.path) entries.push({ prunable: false, head: '', ...current } as WorktreeEntry);
  return entries;
}

/**
 * Where Slipway puts the branches it removes (the janitor's sweep, `slipway worktree discard`):
 * `refs/slipway-trash/<branch>/<ms since epoch>`. Their commits stay reachable, so a removal is
 * undone with `git branch <name> <trash ref>`; the janitor expires them after a while.
 */
export const TRASH_REF_PREFIX = 'refs/slipway-trash';

/** Moves `branch` (expected at `commit`) to the trash. Returns the trash ref. */
export async function trashBranch(repository: string, branch: string, commit: string, now = Date.now()): Promise<string> {
  const ref = `${TRASH_REF_PREFIX}/${branch}/${now}`;
  await rawGit(repository, ['update-ref', '-m', `slipway: trash ${branch}`, ref, commit, '']);
  // Deleted only if still at `commit`: a branch that moved meanwhile is left alone.
  await rawGit(repository, ['update-ref', '-m', 'slipway: moved to trash', '-d', `refs/heads/${branch}`, commit]).catch(async (e) => {
    await rawGit(repository, ['update-ref', '-d', ref]).catch(() => undefined);
    throw e;
  });
  return ref;
}

/** Trash refs older than `olderThanMs`, removed. Returns the refs removed. */
export async function expireTrash(repository: string, olderThanMs: number, now = Date.now()): Promise<string[]> {
  const refs = (await rawGit(repository, ['for-each-ref', '--format=%(refname)', `${TRASH_REF_PREFIX}/`])).split('\n').filter(Boolean);
  const removed: string[] = [];
  for (const ref of refs) {
    const at = Number(ref.slice(ref.lastIndexOf('/') + 1));
    if (!Number.isFinite(at) || now - at < olderThanMs) continue;
    await rawGit(repository, ['update-ref', '-d', ref]);
    removed.push(ref);
  }
  return removed;
}

/** The oldest git whose `merge-tree --write-tree` merges without a worktree (docs/adr/0033). */
export const MERGE_TREE_GIT = [2, 38] as const;

let mergeTreeProbe: Promise<boolean> | undefined;
/** Whether this host's git has `merge-tree --write-tree` (asked once per process). */
export function gitHasMergeTree(): Promise<boolean> {
  mergeTreeProbe ??= rawGit(path.parse(process.cwd()).root, ['version']).then(
    (out) => atLeast(parseVersion(out) ?? [0], MERGE_TREE_GIT),
    (e) => {
      // Not an answer (a cancelled activity killed it): asked again next time.
      mergeTreeProbe = undefined;
      throw e;
    },
  );
  return mergeTreeProbe;
}

/**
 * A commit message as `git merge -F` (and `git commit`) leave it without an editor: trailing
 * whitespace of each line, leading and trailing blank lines and runs of blank lines go (git's
 * `stripspace`, whitespace mode). `commit-tree` takes its message verbatim, so merges made with
 * it call this to keep the merge commit byte for byte what porcelain made.
 */
export function stripspace(message: string): string {
  const out: string[] = [];
  let gap = false;
  for (const raw of message.split('\n')) {
    const line = raw.replace(/[ \t\v\f\r]+$/, '');
    if (line === '') {
      gap = out.length > 0;
      continue;
    }
    if (gap) out.push('');
    gap = false;
    out.push(line);
  }
  return out.length > 0 ? `${out.join('\n')}\n` : '';
}

export type TreeMerge = { clean: true; tree: string } | { clean: false; files: string[]; details: string };

/**
 * Merges `theirs` into `ours` in git's object store only (`git merge-tree --write-tree`, the
 * merge `git merge` makes, ort strategy): nothing is checked out, no index or worktree is touched,
 * no hook runs. `pre`: the options that pick the git directory. A conflict gives the conflicted
 * paths and git's messages; anything else (a missing commit) throws.
 */
export async function mergeTrees(dir: string, pre: string[], ours: string, theirs: string): Promise<TreeMerge> {
  const args = [...pre, 'merge-tree', '--write-tree', '--name-only', '-z', ours, theirs];
  let out: string;
  let conflicted = false;
  try {
    out = await rawGit(dir, args);
  } catch (e) {
    // Exit 1 is a conflict only when git printed the merged tree; it is also "not something we can merge".
    if (!(e instanceof GitError) || e.exitCode !== 1 || !/^[0-9a-f]{40,64}\0/.test(e.stdout ?? '')) throw e;
    out = e.stdout!;
    conflicted = true;
  }
  const fields = out.split('\0');
  const tree = fields[0]!;
  if (!conflicted) return { clean: true, tree };
  // -z: the tree, each conflicted path, an empty field, then messages as <n>, n paths, type, text.
  let i = 1;
  const files: string[] = [];
  for (; i < fields.length && fields[i] !== ''; i++) if (!files.includes(fields[i]!)) files.push(fields[i]!);
  const messages: string[] = [];
  for (i++; i < fields.length; ) {
    const n = Number(fields[i]);
    if (!Number.isInteger(n) || n < 0) break;
    const text = fields[i + n + 2];
    if (text === undefined) break;
    messages.push(text.trimEnd());
    i += n + 3;
  }
  return { clean: false, files, details: messages.join('\n') };
}
