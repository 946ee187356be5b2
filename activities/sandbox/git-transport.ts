/**
 * Git as the transport (ADR 0012): how a sandbox that is not a directory of the user's repository
 * gets its starting point and hands its work back, through git bundles alone. Provider-agnostic:
 * a provider supplies a command that runs inside its sandbox (`podman exec ...`), nothing else.
 *
 * In: the repository's owner bundles the sandbox's branch with read-only copies of the
 * repository's branches and tags (what a local confined sandbox sees in its packed-refs); git
 * inside the sandbox fetches it into a repository of its own and checks the branch out.
 *
 * Out: git inside the sandbox bundles HEAD (minus the commits the repository has) onto its
 * stdout. Everything in that stream is hostile. Outside, Slipway caps its size, parses the
 * bundle header itself (one ref, HEAD or the sandbox's branch; prerequisites the repository has),
 * indexes the pack with `index-pack --strict` into a quarantine object directory (git's own
 * receive-pack pattern), checks there that the head is a commit, complete and a descendant of
 * the sandbox's base, and only then moves the pack into the repository and the branch (named by
 * Slipway's record, never by the bundle) to the head. A refused bundle leaves the repository's
 * refs and objects as they were.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, promises as fs } from 'node:fs';
import path from 'node:path';
import { git, gitEnv, gitMaybe, GIT_HARDENING, GIT_TIMEOUT_MS, isAncestor, rawGit } from '../../lib/git';
import { killProcessGroup } from '../process';
import { MAX_COLLECT_PACK_BYTES, OBJECT_ID } from './sandbox-git';

/** Largest bundle header (ref and prerequisite lines) Slipway reads. */
const MAX_HEADER_BYTES = 1024 * 1024;

export class BundleRefusedError extends Error {
  constructor(message: string) {
    super(`the sandbox's bundle was refused: ${message}`);
    this.name = 'BundleRefusedError';
  }
}

/** A command run inside the sandbox (the provider's exec wrapper), writing to its stdout. */
export interface SandboxCommand {
  command: string;
  args: string[];
  env: NodeJS.ProcessEnv;
  cwd: string;
}

/**
 * Writes the starting bundle for `branch` (which must exist in the repository) to `file`: the
 * branch, and the repository's branches and tags as read-only copies. Trusted git, on the
 * repository, with the usual hardening.
 */
export async function makeBaseBundle(repository: string, branch: string, file: string): Promise<void> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${randomBytes(4).toString('hex')}.tmp`;
  await git(repository, ['bundle', 'create', '-q', tmp, `refs/heads/${branch}`, '--branches', '--tags']);
  await fs.rename(tmp, file);
}

/**
 * The shell script that starts a sandbox from a base bundle, run inside it in the workspace:
 * `sh -c SCRIPT start <bundle> <branch> <name> <email>`. Idempotent: a workspace that has a
 * repository already is left as it is.
 */
export const START_FROM_BUNDLE_SCRIPT = [
  'set -eu',
  'bundle=$1; branch=$2',
  '[ -e .git ] && exit 0',
  'git init -q',
  'git config user.name "$3"; git config user.email "$4"',
  // Every branch and tag of the repository, the sandbox's own branch among them.
  'git fetch -q --no-tags --update-head-ok "$bundle" "refs/heads/*:refs/heads/*" "refs/tags/*:refs/tags/*"',
  'git symbolic-ref HEAD "refs/heads/$branch"',
  'git reset -q --hard',
].join('\n');

/**
 * Prepares a pooled container's workspace ahead of any claim (ADR 0030): every branch and tag of
 * the repository from a bundle, the base commit checked out (detached). `sh -c SCRIPT prepare <bundle> <base>`.
 */
export const PREPARE_FROM_BUNDLE_SCRIPT = [
  'set -eu',
  'bundle=$1; base=$2',
  'git init -q',
  'git fetch -q --no-tags "$bundle" "refs/heads/*:refs/heads/*" "refs/tags/*:refs/tags/*"',
  'git -c advice.detachedHead=false checkout -q --detach "$base"',
].join('\n');

/**
 * Starts a sandbox in a prepared workspace: fetches what the repository gained since the
 * preparation (an incremental bundle, `-` when there is nothing new), sets every branch and tag to
 * the repository's (`<refs file>`: `<refname> <oid>` lines), and checks out the sandbox's branch:
 * the same state START_FROM_BUNDLE_SCRIPT makes. Exit 3 when the workspace cannot be brought
 * there (the caller starts it from a full bundle instead).
 * `sh -c SCRIPT claim <bundle|-> <refs file> <branch> <name> <email>`
 */
export const START_PREPARED_SCRIPT = [
  'set -eu',
  'bundle=$1; refs=$2; branch=$3',
  '[ -d .git ] || exit 3',
  'git config user.name "$4"; git config user.email "$5"',
  '[ "$bundle" = - ] || git fetch -q --no-tags --update-head-ok "$bundle" "+refs/heads/*:refs/heads/*" "+refs/tags/*:refs/tags/*" || exit 3',
  'git for-each-ref --format="delete %(refname)" refs/heads refs/tags | git update-ref --stdin || exit 3',
  'sed "s/^/create /" "$refs" | git update-ref --stdin || exit 3',
  'git symbolic-ref HEAD "refs/heads/$branch"',
  'git reset -q --hard || exit 3',
].join('\n');

/** The script that bundles the sandbox's HEAD onto stdout, leaving out `known` commits it has: `sh -c SCRIPT collect <known...>`. */
export const BUNDLE_HEAD_SCRIPT = [
  'set -eu',
  'not=""',
  'for k in "$@"; do if git cat-file -e "$k^{commit}" 2>/dev/null; then not="$not ^$k"; fi; done',
  `exec git ${GIT_HARDENING.join(' ')} bundle create -q - HEAD $not`,
].join('\n');

/** The parsed header of a bundle. */
export interface BundleHeader {
  version: 2 | 3;
  prerequisites: string[];
  refs: Array<{ oid: string; name: string }>;
  /** Byte offset of the pack. */
  packOffset: number;
}

/** Parses a bundle's header; throws BundleRefusedError for anything but a well-formed v2/v3 header. */
export function parseBundleHeader(data: Buffer): BundleHeader {
  const end = data.indexOf('\n\n');
  if (end < 0 || end > MAX_HEADER_BYTES) throw new BundleRefusedError('no bundle header (or one over 1 MiB)');
  const lines = data.subarray(0, end).toString('utf8').split('\n');
  const first = lines.shift();
  const version = first === '# v2 git bundle' ? 2 : first === '# v3 git bundle' ? 3 : undefined;
  if (!version) throw new BundleRefusedError(`not a git bundle (first line ${JSON.stringify(first?.slice(0, 40))})`);
  const prerequisites: string[] = [];
  const refs: Array<{ oid: string; name: string }> = [];
  for (const line of lines) {
    if (version === 3 && line.startsWith('@')) {
      // Only the object format is known; a filter (a partial bundle) or anything else is refused.
      if (!/^@object-format=(sha1|sha256)$/.test(line)) throw new BundleRefusedError(`unknown capability ${JSON.stringify(line.slice(0, 60))}`);
      continue;
    }
    if (line.startsWith('-')) {
      const oid = line.slice(1).split(' ')[0];
      if (!OBJECT_ID.test(oid)) throw new BundleRefusedError(`bad prerequisite line ${JSON.stringify(line.slice(0, 80))}`);
      prerequisites.push(oid);
      continue;
    }
    const m = /^([0-9a-f]{40}|[0-9a-f]{64}) (\S+)$/.exec(line);
    if (!m) throw new BundleRefusedError(`bad ref line ${JSON.stringify(line.slice(0, 80))}`);
    refs.push({ oid: m[1], name: m[2] });
  }
  return { version, prerequisites, refs, packOffset: end + 2 };
}

export interface ImportBundleOptions {
  /** The branch the work goes to (from Slipway's record, never from the bundle). */
  branch: string;
  /** The sandbox's base: the head must descend from it. */
  baseCommit: string;
  maxBytes?: number;
  timeoutMs?: number;
  signal?: AbortSignal;
}

/**
 * Runs `producer` (git bundle inside the sandbox), checks its bundle as described at the top of
 * this file, and on success moves `refs/heads/<branch>` in the repository to the bundled head.
 */
export async function importBundle(repository: string, producer: SandboxCommand, opts: ImportBundleOptions): Promise<{ head: string }> {
  const objects = path.resolve(repository, await git(repository, ['rev-parse', '--git-path', 'objects']));
  // Inside objects/ so the accepted pack moves in by rename; removed whatever happens.
  const quarantine = path.join(objects, `slipway-incoming-${randomBytes(6).toString('hex')}`);
  await fs.mkdir(path.join(quarantine, 'objects', 'pack'), { recursive: true });
  try {
    const file = path.join(quarantine, 'bundle');
    await receive(producer, file, opts);
    const fd = await fs.open(file, 'r');
    let head: Buffer;
    try {
      head = Buffer.alloc(Math.min((await fd.stat()).size, MAX_HEADER_BYTES + 2));
      await fd.read(head, 0, head.length, 0);
    } finally {
      await fd.close();
    }
    const header = parseBundleHeader(head);
    if (header.refs.length !== 1) throw new BundleRefusedError(`it must carry exactly one ref, it carries ${header.refs.length}`);
    const [ref] = header.refs;
    if (ref.name !== 'HEAD' && ref.name !== `refs/heads/${opts.branch}`) throw new BundleRefusedError(`its ref ${JSON.stringify(ref.name)} is neither HEAD nor refs/heads/${opts.branch}`);
    for (const p of header.prerequisites) {
      if ((await gitMaybe(repository, ['cat-file', '-e', `${p}^{commit}`])) === undefined) throw new BundleRefusedError(`it needs commit ${p}, which the repository does not have`);
    }
    const env = { GIT_OBJECT_DIRECTORY: path.join(quarantine, 'objects'), GIT_ALTERNATE_OBJECT_DIRECTORIES: objects };
    await indexPack(repository, file, header.packOffset, env, opts);
    const inQuarantine = (args: string[]) => rawGit(repository, [...GIT_HARDENING, ...args], env).then(() => true, () => false);
    if (!(await inQuarantine(['cat-file', '-e', `${ref.oid}^{commit}`]))) throw new BundleRefusedError(`its head ${ref.oid} is not a commit it carries or the repository has`);
    // Every object the head reaches is there (rev-list fails on a missing one).
    if (!(await inQuarantine(['rev-list', '--objects', '--quiet', ref.oid, '--not', ...header.prerequisites, opts.baseCommit]))) {
      throw new BundleRefusedError(`the history of ${ref.oid} is incomplete`);
    }
    if (!(await inQuarantine(['merge-base', '--is-ancestor', opts.baseCommit, ref.oid]))) {
      throw new BundleRefusedError(`its head ${ref.oid} does not descend from the sandbox's base ${opts.baseCommit}`);
    }
    await migrate(path.join(quarantine, 'objects', 'pack'), path.join(objects, 'pack'));
    await git(repository, ['update-ref', '-m', 'slipway: collected from its sandbox (bundle)', `refs/heads/${opts.branch}`, ref.oid]);
    return { head: ref.oid };
  } finally {
    await fs.rm(quarantine, { recursive: true, force: true });
  }
}

/** The producer's stdout into `file`, capped; its failure, the cap, a timeout or an abort reject. */
function receive(producer: SandboxCommand, file: string, opts: ImportBundleOptions): Promise<void> {
  const maxBytes = opts.maxBytes ?? MAX_COLLECT_PACK_BYTES;
  return new Promise((resolve, reject) => {
    const child = spawn(producer.command, producer.args, { cwd: producer.cwd, env: producer.env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const out = createWriteStream(file, { flags: 'wx' });
    let bytes = 0;
    let failure: Error | undefined;
    let stderr = '';
    const stop = (why: Error) => {
      failure ??= why;
      killProcessGroup(child.pid);
    };
    const timer = setTimeout(() => stop(new Error('collect timed out')), opts.timeoutMs ?? GIT_TIMEOUT_MS);
    const onAbort = () => stop(new Error('collect cancelled'));
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    child.stdout.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > maxBytes) stop(new BundleRefusedError(`it exceeds ${maxBytes} bytes`));
    });
    child.stdout.pipe(out);
    child.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4000)));
    child.on('error', (e) => stop(e));
    let code: number | null = null;
    let pending = 2;
    const done = () => {
      if (--pending > 0) return;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      if (failure) reject(failure);
      else if (code !== 0) reject(new Error(`bundling the sandbox's work failed (exit ${code}): ${stderr.trim()}`));
      else resolve();
    };
    child.on('close', (c) => {
      code = c;
      done();
    });
    out.on('close', done);
    out.on('error', (e) => stop(e));
  });
}

/** `index-pack --stdin --strict` of the bundle's pack into the quarantine object directory. */
function indexPack(repository: string, file: string, offset: number, env: Record<string, string>, opts: ImportBundleOptions): Promise<void> {
  return new Promise((resolve, reject) => {
    const sink = spawn('git', [...GIT_HARDENING, '-C', repository, 'index-pack', '--stdin', '--strict', '--fix-thin'], { env: gitEnv(env), detached: true, stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    const timer = setTimeout(() => killProcessGroup(sink.pid), opts.timeoutMs ?? GIT_TIMEOUT_MS);
    sink.stderr.on('data', (c: Buffer) => (err = (err + c.toString()).slice(-4000)));
    sink.stdin.on('error', () => undefined);
    createReadStream(file, { start: offset }).pipe(sink.stdin);
    sink.on('error', reject);
    sink.on('close', (code) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new BundleRefusedError(`index-pack refused its pack (exit ${code}): ${err.trim()}`));
    });
  });
}

/** Moves accepted packs into the repository: the pack before its index, as git's own migration does. */
async function migrate(from: string, to: string): Promise<void> {
  const names = await fs.readdir(from);
  const rank = (n: string) => (n.endsWith('.pack') ? 0 : n.endsWith('.idx') ? 2 : 1);
  for (const name of names.sort((a, b) => rank(a) - rank(b))) {
    await fs.rename(path.join(from, name), path.join(to, name)).catch(async (e: NodeJS.ErrnoException) => {
      // The same pack already there (an identical collect raced this one): nothing to move.
      if (e.code !== 'EEXIST') throw e;
    });
  }
}

/**
 * A remote sandbox's collect before any bundle: a head the repository already has only moves the
 * branch (after the descent check an import makes); otherwise the commits both sides may have,
 * which the sandbox's bundle leaves out.
 */
export async function collectKnownHead(repository: string, record: { startCommit: string; branch: string }, head: string, extra: string[] = []): Promise<{ collected: true } | { collected: false; known: string[] }> {
  if ((await gitMaybe(repository, ['cat-file', '-e', `${head}^{commit}`])) !== undefined) {
    if (!(await isAncestor(repository, record.startCommit, head))) throw new BundleRefusedError(`its head ${head} does not descend from the sandbox's base ${record.startCommit}`);
    await git(repository, ['update-ref', '-m', 'slipway: collected from its sandbox', `refs/heads/${record.branch}`, head]);
    return { collected: true };
  }
  const tip = await gitMaybe(repository, ['rev-parse', '--verify', '--quiet', `refs/heads/${record.branch}^{commit}`]);
  return { collected: false, known: [...new Set([record.startCommit, tip, ...extra])].filter((k): k is string => !!k && OBJECT_ID.test(k)) };
}
