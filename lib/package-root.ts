/**
 * The folder of Slipway's own package.json: the repository when run from source, the installed
 * package when run from dist/ (compiled code sits one level deeper there, so a fixed `..` from
 * __dirname would be wrong in one of the two).
 */
import { existsSync } from 'node:fs';
import path from 'node:path';

function findPackageRoot(from: string): string {
  for (let dir = from; ; dir = path.dirname(dir)) {
    if (existsSync(path.join(dir, 'package.json'))) return dir;
    if (path.dirname(dir) === dir) throw new Error(`no package.json above ${from}`);
  }
}

export const PACKAGE_ROOT = findPackageRoot(__dirname);
