/**
 * A builder's agent session, carried to wherever the stream's next run happens. After a run, the
 * session's files (Claude Code's `projects/<cwd>/<session>.jsonl`, Codex's rollout file, pi's session
 * file, OpenCode's whole SQLite database; where each lives is the provider's `sessionLocation`) are copied out of the agent's home into
 * the stream's store in the repository, `.slipway/agent-sessions/<objective>/<stream>/<provider>/<session>/`,
 * never into workflow history. Before a run that resumes the session, when the agent's home does not
 * have it (a new sandbox with a private home, a cleaned home, another worker), they are copied back,
 * into the folder the CLI will look in for the cwd the agent sees.
 *
 * The files were written by the agent, inside the sandbox: hostile. Only regular files are read,
 * never through a symlink (O_NOFOLLOW, and links are not walked), at most MAX_FILES of at most
 * MAX_BYTES in all, and only paths the provider says belong to the session (no `..`, no absolute
 * path). Restoring writes only new files (O_EXCL | O_NOFOLLOW) into real directories under the
 * provider's session folder, never through a link the agent may have planted there.
 */
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';
import type { AgentProviderKind } from '../../core/objective-schema';
import type { SessionLocation } from '../../agents/provider';
import { isInside } from '../sandbox/paths';

/** At most this many files and bytes per session: a session is a few JSONL files, not a disk image. */
export const SESSION_CARRY_LIMITS = { maxFiles: 64, maxBytes: 64 * 1024 * 1024, maxDepth: 6 } as const;

const SAFE_NAME = /^[A-Za-z0-9._-]{1,200}$/;
const safeName = (name: string) => SAFE_NAME.test(name) && !name.startsWith('.');

export class SessionCarryError extends Error {}

/** Every carried session of an objective (the janitor removes it with the objective's sandboxes). */
export const objectiveSessionsDir = (repository: string, objectiveId: string) => path.join(repository, SLIPWAY_DIR, 'agent-sessions', objectiveId);

/** The store folder of one session of one stream; undefined when an id is not a plain name (the session id comes from agent output). */
export function sessionStoreDir(repository: string, objectiveId: string, streamId: string, provider: AgentProviderKind, sessionId: string): string | undefined {
  if (![objectiveId, streamId, sessionId].every(safeName)) return undefined;
  return path.join(objectiveSessionsDir(repository, objectiveId), streamId, provider, sessionId);
}

/** `rel` is a plain relative path: no empty, `.` or `..` component, no absolute path. */
function plainRelative(rel: string): boolean {
  return rel.length > 0 && !path.isAbsolute(rel) && rel.split('/').every((c) => c !== '' && c !== '.' && c !== '..');
}

/** Regular files below `root` (not following links), relative, `/`-separated, for which `keep` holds. */
async function walk(root: string, keep: (rel: string) => boolean): Promise<string[]> {
  const found: string[] = [];
  const visit = async (dir: string, rel: string, depth: number) => {
    let entries;
    try {
      entries = await fs.readdir(dir, { withFileTypes: true });
    } catch {
      return; // missing, or not a directory
    }
    for (const entry of entries) {
      const childRel = rel ? `${rel}/${entry.name}` : entry.name;
      // Dirent types come from lstat: a symlink is neither a directory nor a file here.
      if (entry.isDirectory() && depth < SESSION_CARRY_LIMITS.maxDepth) await visit(path.join(dir, entry.name), childRel, depth + 1);
      else if (entry.isFile() && keep(childRel)) found.push(childRel);
    }
  };
  const top = await fs.lstat(root).catch(() => undefined);
  if (top?.isDirectory()) await visit(root, '', 1);
  return found.sort();
}

/** Reads a regular file without following a link, refusing more than `budget` bytes. */
async function readBounded(file: string, budget: number): Promise<Buffer> {
  const handle = await fs.open(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw new SessionCarryError(`${file} is not a regular file`);
    if (st.size > budget) throw new SessionCarryError(`the session is larger than ${SESSION_CARRY_LIMITS.maxBytes} bytes`);
    const data = await handle.readFile();
    if (data.length > budget) throw new SessionCarryError(`the session is larger than ${SESSION_CARRY_LIMITS.maxBytes} bytes`);
    return data;
  } finally {
    await handle.close();
  }
}

/** The session's files in the agent's home, as `rel -> content`; throws SessionCarryError past the limits. */
export async function readSession(root: string, belongs: (rel: string) => boolean): Promise<Map<string, Buffer>> {
  const rels = await walk(root, (rel) => plainRelative(rel) && belongs(rel));
  if (rels.length > SESSION_CARRY_LIMITS.maxFiles) throw new SessionCarryError(`the session has ${rels.length} files, at most ${SESSION_CARRY_LIMITS.maxFiles} are carried`);
  const files = new Map<string, Buffer>();
  let budget: number = SESSION_CARRY_LIMITS.maxBytes;
  for (const rel of rels) {
    const data = await readBounded(path.join(root, ...rel.split('/')), budget);
    budget -= data.length;
    files.set(rel, data);
  }
  return files;
}

/**
 * Copies the session's files from the agent's home into `store` (replacing an earlier capture).
 * Returns how many files were kept; 0 (and the store untouched) when the home has none.
 */
export async function captureSession(location: SessionLocation, store: string): Promise<number> {
  const files = await readSession(location.root, location.belongs);
  if (files.size === 0) return 0;
  const staging = `${store}.tmp-${process.pid}-${Date.now()}`;
  await fs.rm(staging, { recursive: true, force: true });
  try {
    for (const [rel, data] of files) {
      const target = path.join(staging, ...rel.split('/'));
      await fs.mkdir(path.dirname(target), { recursive: true });
      await fs.writeFile(target, data, { mode: 0o600, flag: 'wx' });
    }
    await fs.rm(store, { recursive: true, force: true });
    await fs.rename(staging, store);
  } catch (e) {
    await fs.rm(staging, { recursive: true, force: true });
    throw e;
  }
  return files.size;
}

/** Creates (or accepts) each directory from `root` down to `dir`, refusing a component that is a link or not a directory. */
async function realDirs(root: string, dir: string): Promise<void> {
  const parts = path.relative(root, dir).split(path.sep).filter(Boolean);
  let current = root;
  for (const part of ['', ...parts]) {
    current = part ? path.join(current, part) : current;
    const st = await fs.lstat(current).catch(() => undefined);
    if (!st) {
      await fs.mkdir(current, { mode: 0o700 });
      continue;
    }
    if (st.isSymbolicLink() || !st.isDirectory()) throw new SessionCarryError(`${current} is not a plain directory`);
  }
}

/**
 * Puts the stored session back into the agent's home when the home does not have it. `cwd`: the
 * working directory as the agent sees it (the sandbox path, or /workspace when confined).
 * Returns what happened: `present` (nothing to do), `restored`, or `none` (nothing stored).
 */
export async function restoreSession(location: SessionLocation, store: string, cwd: () => Promise<string>): Promise<'present' | 'restored' | 'none'> {
  if ((await walk(location.root, (rel) => plainRelative(rel) && location.belongs(rel))).length > 0) return 'present';
  const stored = await readSession(store, () => true);
  if (stored.size === 0) return 'none';
  const at = await cwd();
  await fs.mkdir(path.dirname(location.root), { recursive: true });
  for (const [rel, data] of stored) {
    const placed = location.place(rel, at);
    if (!plainRelative(placed) || !location.belongs(placed)) throw new SessionCarryError(`stored file ${rel} does not belong to the session`);
    const target = path.join(location.root, ...placed.split('/'));
    if (!isInside(location.root, target)) throw new SessionCarryError(`stored file ${rel} would leave ${location.root}`);
    await realDirs(location.root, path.dirname(target));
    const handle = await fs.open(target, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
    try {
      await handle.writeFile(data);
    } finally {
      await handle.close();
    }
  }
  return 'restored';
}
