/**
 * Files written whole and renamed into place, so a reader (or a crash) never sees half a file.
 * The scratch name is random and created exclusively (O_EXCL): a link someone planted under a
 * predictable name is never written through.
 */
import { randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';

/**
 * `mkdir -p` that holds against a concurrent remover of empty folders (a sandbox's destroy
 * removes its group's folders once empty): Node's recursive mkdir fails with ENOENT when a folder
 * it found existing (EEXIST) is gone when it checks it is a folder, and now and then with ENOTDIR
 * in the same race (4 in 120,000 calls here; a clean-clone CI hit it), so it is asked again. A
 * file truly in the way still fails, after the last try.
 */
export async function ensureDir(dir: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await fs.mkdir(dir, { recursive: true });
      return;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if ((code !== 'ENOENT' && code !== 'ENOTDIR') || attempt >= 20) throw e;
    }
  }
}

export async function writeFileAtomic(file: string, content: string | Buffer, opts: { mode?: number; mkdir?: boolean } = {}): Promise<void> {
  const tmp = `${file}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  for (let attempt = 1; ; attempt++) {
    if (opts.mkdir) await ensureDir(path.dirname(file));
    try {
      await fs.writeFile(tmp, content, { mode: opts.mode ?? 0o644, flag: 'wx' });
      break;
    } catch (e) {
      // The folder went between the mkdir and the write (see ensureDir): made again. The scratch
      // file in it then keeps it from going.
      if (!opts.mkdir || (e as NodeJS.ErrnoException).code !== 'ENOENT' || attempt >= 20) throw e;
    }
  }
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
