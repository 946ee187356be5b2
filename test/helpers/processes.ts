/** Process checks shared by the tests that kill things. */
import { readFileSync } from 'node:fs';
import { waitFor } from './cli';

/** Alive and not a zombie. */
export function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

/** Waits, checking often, until `cond` holds (a synchronous condition: a file, a process gone). */
export function waitUntil(cond: () => boolean, what: string, timeoutMs = 30_000): Promise<true> {
  return waitFor(async () => cond(), what, timeoutMs, 20);
}
