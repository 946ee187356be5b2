/**
 * A secret kept in a file that is made once and then only read (the preview link key, the SSH
 * host key): mode 0600 in a 0700 folder, created with O_EXCL so two processes starting at the
 * same time end up with the first one's secret.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';

export async function readOrCreateSecret(file: string, make: () => Buffer, check?: (content: Buffer) => string | undefined): Promise<Buffer> {
  const read = async () => {
    const content = await fs.readFile(file);
    const problem = check?.(content);
    if (problem) throw new Error(`${file}: ${problem}; delete it to make a new one`);
    return content;
  };
  try {
    return await read();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  await fs.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
  const content = make();
  try {
    await fs.writeFile(file, content, { mode: 0o600, flag: 'wx' });
    return content;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return read();
    throw e;
  }
}
