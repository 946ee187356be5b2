/**
 * Files written whole and renamed into place, so a reader (or a crash) never sees half a file.
 * The scratch name is random and created exclusively (O_EXCL): a link someone planted under a
 * predictable name is never written through.
 */
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';

export async function writeFileAtomic(file: string, content: string | Buffer, opts: { mode?: number; mkdir?: boolean } = {}): Promise<void> {
  if (opts.mkdir) await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  await fs.writeFile(tmp, content, { mode: opts.mode ?? 0o644, flag: 'wx' });
  try {
    await fs.rename(tmp, file);
  } catch (e) {
    await fs.rm(tmp, { force: true });
    throw e;
  }
}

/** A JSON record written by writeJsonAtomic; undefined when it is absent or unreadable. */
export async function readJson<T>(file: string): Promise<T | undefined> {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

/** JSON, pretty-printed with a final newline (Slipway's records are read by people too). */
export function writeJsonAtomic(file: string, value: unknown, opts: { mode?: number; mkdir?: boolean } = {}): Promise<void> {
  return writeFileAtomic(file, `${JSON.stringify(value, null, 2)}\n`, opts);
}
