/**
 * A lock on a file shared by processes (the repository registry, the trust store), through
 * proper-lockfile: a `<file>.lock` folder made atomically, kept fresh while held, and taken over
 * when its holder died (stale after 10 s without an update).
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import lockfile from 'proper-lockfile';

export async function withFileLock<T>(file: string, work: () => Promise<T>, opts: { waitMs?: number } = {}): Promise<T> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const waitMs = opts.waitMs ?? 15_000;
  let release: () => Promise<void>;
  try {
    release = await lockfile.lock(file, {
      realpath: false,
      stale: 10_000,
      update: 2_000,
      retries: { retries: Math.ceil(waitMs / 50), minTimeout: 20, maxTimeout: 100, factor: 1.2, randomize: true },
    });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ELOCKED') throw new Error(`${file} is locked by another slipway process; try again`);
    throw e;
  }
  try {
    return await work();
  } finally {
    await release().catch(() => undefined);
  }
}
