/**
 * A worker's stable id (docs/adr/0013-worker-ownership.md): `SLIPWAY_WORKER_ID` (or
 * `slipway worker --id`), else the one kept in `$SLIPWAY_HOME/worker-id`, else a new one written
 * there. Kept so a restarted worker polls its own queue again and picks up the sandboxes it holds.
 */
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { WORKER_ID_PATTERN } from '../core/ids';
import { writeFileAtomic } from './atomic-write';

export const WORKER_ID_FILE = 'worker-id';

export class WorkerIdError extends Error {}

export function checkWorkerId(id: string, source: string): string {
  if (!WORKER_ID_PATTERN.test(id)) {
    throw new WorkerIdError(`${source}: worker id "${id}" is not valid (letters, digits, ".", "_" and "-", starting with a letter or digit, at most 63 characters)`);
  }
  return id;
}

/** A new id: the host name (cut to what an id may hold) and a random suffix, so two workers on one host differ. */
export function newWorkerId(hostname = os.hostname()): string {
  const host = hostname.replace(/[^A-Za-z0-9.-]/g, '-').replace(/^[^A-Za-z0-9]+/, '').slice(0, 48) || 'worker';
  return `${host}-${randomBytes(4).toString('hex')}`;
}

export async function resolveWorkerId(home: string, override?: string): Promise<string> {
  if (override !== undefined && override !== '') return checkWorkerId(override, 'SLIPWAY_WORKER_ID');
  const file = path.join(home, WORKER_ID_FILE);
  const kept = await fs.readFile(file, 'utf8').then(
    (text) => text.trim(),
    (e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT') return undefined;
      throw e;
    },
  );
  if (kept !== undefined) return checkWorkerId(kept, file);
  // Two workers starting at once on one home agree on one id: the first file written wins.
  const scratch = `${file}.${newWorkerId('new')}`;
  await writeFileAtomic(scratch, `${newWorkerId()}\n`, { mkdir: true });
  try {
    await fs.link(scratch, file).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e;
    });
  } finally {
    await fs.rm(scratch, { force: true });
  }
  return checkWorkerId((await fs.readFile(file, 'utf8')).trim(), file);
}
