/**
 * Confines paths that come from outside (agents, API, config) to a sandbox root,
 * following symlinks: a link that points out of the sandbox is an escape too.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';

export class PathEscapeError extends Error {
  constructor(readonly requested: string, reason: string) {
    super(`path "${requested}" is refused: ${reason}`);
    this.name = 'PathEscapeError';
  }
}

const isInside = (root: string, candidate: string) => {
  const rel = path.relative(root, candidate);
  return rel === '' || (!rel.startsWith('..') && !path.isAbsolute(rel));
};

/** Resolves `requested` (relative to root) to an absolute path whose real location is inside root. */
export async function resolveInside(root: string, requested: string): Promise<string> {
  if (requested.includes('\0')) throw new PathEscapeError(requested, 'it contains a NUL byte');
  if (path.isAbsolute(requested)) throw new PathEscapeError(requested, 'absolute paths are not allowed; use a path relative to the sandbox root');
  const realRoot = await fs.realpath(root);
  const lexical = path.resolve(realRoot, requested);
  if (!isInside(realRoot, lexical)) throw new PathEscapeError(requested, 'it leads outside the sandbox');
  // Walk up to the deepest existing ancestor and check where it really is.
  let probe = lexical;
  const rest: string[] = [];
  for (;;) {
    try {
      const real = await fs.realpath(probe);
      if (!isInside(realRoot, real)) throw new PathEscapeError(requested, 'a symbolic link leads outside the sandbox');
      return path.join(real, ...rest);
    } catch (e) {
      if (e instanceof PathEscapeError) throw e;
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
      // A dangling symlink: refuse if its target is outside.
      const link = await fs.readlink(probe).catch(() => undefined);
      if (link !== undefined) {
        const target = path.resolve(path.dirname(probe), link);
        if (!isInside(realRoot, target)) throw new PathEscapeError(requested, 'a symbolic link leads outside the sandbox');
      }
      rest.unshift(path.basename(probe));
      probe = path.dirname(probe);
    }
  }
}
