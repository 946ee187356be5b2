/** The compiled package (dist/), built before tests that run it; incremental, so cheap when current. */
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { withFileLock } from '../../lib/file-lock';
import { PROJECT_ROOT } from './repo';

export const COMPILED_BIN = path.join(PROJECT_ROOT, 'bin', 'slipway.cjs');

/**
 * Runs scripts/build.cjs, one test file at a time (they write the same dist/); `then` runs under
 * the same lock, for work that reads dist/ as a whole (packing it).
 */
export async function ensureBuilt<T>(then?: () => Promise<T>): Promise<T | undefined> {
  return withFileLock(
    path.join(PROJECT_ROOT, 'dist', '.build'),
    async () => {
      await promisify(execFile)(process.execPath, [path.join(PROJECT_ROOT, 'scripts', 'build.cjs'), '--quiet'], { cwd: PROJECT_ROOT });
      return then?.();
    },
    { waitMs: 300_000 },
  );
}
