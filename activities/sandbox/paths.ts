/**
 * Confines paths that come from outside (agents, API, config) to a sandbox root,
 * following symlinks: a link that points out of the sandbox is an escape too.
 *
 * The path is walked one component at a time, the way the kernel does it: every symlink
 * met on the way (dangling or not, in a parent directory or at the end) is expanded and
 * its target walked in turn, and `..` inside a link target climbs from where the link
 * really leads. A path is accepted only if every step stays inside the sandbox root.
 */
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';

export class PathEscapeError extends Error {
  constructor(readonly requested: string, reason: string) {
    super(`path "${requested}" is refused: ${reason}`);
    this.name = 'PathEscapeError';
  }
}

/** A working directory (an exec's or a session's cwd) that is not an existing folder of the sandbox. */
export class NotAFolderError extends Error {
  constructor(readonly requested: string, readonly reason: 'no such folder' | 'not a folder') {
    super(`cwd "${requested}" is not a folder in the sandbox (${reason})`);
    this.name = 'NotAFolderError';
  }
}

/** True if `candidate` is `root` or lies below it (both absolute and normalised). */
export const isInside = (root: string, candidate: string): boolean => {
  const rel = path.relative(root, candidate);
  return rel === '' || (rel !== '..' && !rel.startsWith(`..${path.sep}`) && !path.isAbsolute(rel));
};

export interface ResolveOptions {
  /**
   * Follow a symlink in the last component (default true). Deleting a path should not
   * follow it: the link itself is removed, never what it points to.
   */
  followFinalSymlink?: boolean;
}

/** Longest chain of symlinks followed before giving up (Linux uses 40 too). */
const MAX_LINK_HOPS = 40;

/**
 * Resolves `requested` (relative to root) to an absolute path whose real location is inside
 * root. Existing components come back with every symlink resolved; components that do not
 * exist yet are appended as they are.
 */
export async function resolveInside(root: string, requested: string, options: ResolveOptions = {}): Promise<string> {
  if (requested.includes('\0')) throw new PathEscapeError(requested, 'it contains a NUL byte');
  if (path.isAbsolute(requested)) throw new PathEscapeError(requested, 'absolute paths are not allowed; use a path relative to the sandbox root');
  const realRoot = await fs.realpath(root);
  const lexical = path.resolve(realRoot, requested);
  if (!isInside(realRoot, lexical)) throw new PathEscapeError(requested, 'it leads outside the sandbox');
  const rel = path.relative(realRoot, lexical);
  const pending = rel === '' ? [] : rel.split(path.sep);
  const follow = options.followFinalSymlink ?? true;
  const escape = () => new PathEscapeError(requested, 'a symbolic link leads outside the sandbox');

  let current = realRoot;
  let hops = 0;
  while (pending.length > 0) {
    const part = pending.shift()!;
    if (part === '' || part === '.') continue;
    if (part === '..') {
      current = path.dirname(current);
      if (!isInside(realRoot, current)) throw escape();
      continue;
    }
    const next = path.join(current, part);
    let stat;
    try {
      stat = await fs.lstat(next);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' && code !== 'ENOTDIR') throw e;
      // Nothing below this point exists yet, so nothing below it can be a link. A `..` after
      // a missing directory fails in the kernel too; do not guess where it would lead.
      if (pending.includes('..')) {
        throw Object.assign(new Error(`ENOENT: no such file or directory, '${requested}'`), { code: 'ENOENT' });
      }
      return path.join(next, ...pending);
    }
    if (stat.isSymbolicLink() && (pending.length > 0 || follow)) {
      if (++hops > MAX_LINK_HOPS) throw new PathEscapeError(requested, 'too many levels of symbolic links');
      const target = await fs.readlink(next);
      if (path.isAbsolute(target)) {
        // Absolute targets must name the sandbox by its real path; anything else is outside.
        if (target !== realRoot && !target.startsWith(realRoot + path.sep)) throw escape();
        current = realRoot;
        pending.unshift(...target.slice(realRoot.length).split(path.sep));
      } else {
        pending.unshift(...target.split(path.sep));
      }
      continue;
    }
    current = next;
  }
  return current;
}

/** Open flags that refuse to follow a symlink in the last component (guards against swaps). */
export const NOFOLLOW = constants.O_NOFOLLOW ?? 0;

/**
 * A non-host provider's local record folder for a sandbox: `<repo>/<dir>/<group>/<name>`, where
 * `dir` is the provider's folder under `.slipway/` (containers/, daytona/, kubernetes/).
 */
export function providerSandboxRoot(dir: string, repository: string, group: string, name: string): string {
  return path.join(repository, dir, group, name);
}

/** `<repo>/<dir>/<group>/<name>` -> its parts, or undefined for a path of another provider. */
export function parseProviderRoot(dir: string, root: string): { repository: string; group: string; name: string } | undefined {
  const groupDir = path.dirname(root);
  const providerDir = path.dirname(groupDir);
  const slipwayDir = path.dirname(providerDir);
  if (path.join(path.basename(slipwayDir), path.basename(providerDir)) !== path.normalize(dir)) return undefined;
  return { repository: path.dirname(slipwayDir), group: path.basename(groupDir), name: path.basename(root) };
}
