/**
 * A workspace disk quota for local sandboxes (`disk_mb`, ADR 0006): the sandbox's worktree is
 * its own ext4 filesystem, a sparse image file loop-mounted at the worktree's path.
 *
 *   <repo>/.slipway/disks/<group>/<name>.img   the image (sparse: it takes what is written)
 *   <repo>/.slipway/worktrees/<group>/<name>   its mount point, the worktree
 *
 * A command that fills it gets ENOSPC at the quota; the host's disk and other sandboxes are not
 * touched. Being its own filesystem, the workspace also shows as `/` in the sandbox's
 * /proc/self/mountinfo instead of its host path.
 *
 * Lifecycle: made and mounted before `git worktree add` on a cold create (warm-pool entries are
 * moved into place by rename, which a mount point refuses, so a sandbox with a disk limit is
 * never pooled); unmounted and deleted on destroy and suspend (the snapshot keeps the files);
 * a restore fills a new image from the restored files; mounted again when missing (after a
 * reboot) before a command runs; swept with its sandbox by the janitor, which destroys it.
 *
 * It needs root (mount), loop devices and mkfs.ext4. Without them a sandbox asking for a disk
 * limit is refused, naming the field: never silently unlimited.
 */
import { execFile } from 'node:child_process';
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { SLIPWAY_DIR } from '../../core/ids';
import { findExecutable } from './bubblewrap';

const execFileAsync = promisify(execFile);

export const DISKS_DIR = `${SLIPWAY_DIR}/disks`;

export class DiskQuotaUnavailableError extends Error {
  constructor(reason: string) {
    super(`disk_mb: a workspace disk limit needs root, loop devices and mkfs.ext4 (a loop-mounted ext4 image per sandbox), and ${reason}`);
    this.name = 'DiskQuotaUnavailableError';
  }
}

export function diskImagePath(repository: string, group: string, name: string): string {
  return path.join(repository, DISKS_DIR, group, `${name}.img`);
}

let tools: Promise<{ mkfs: string; mount: string; umount: string }> | undefined;
/** The tools, or DiskQuotaUnavailableError saying what is missing (checked once per process). */
export function requireDiskQuota(): Promise<{ mkfs: string; mount: string; umount: string }> {
  // Asked every time (cheap): the tools are found once, but a process may drop root later.
  if (process.getuid?.() !== 0) return Promise.reject(new DiskQuotaUnavailableError('Slipway does not run as root here'));
  tools ??= (async () => {
    const mkfs = findExecutable('mkfs.ext4', `${process.env.PATH ?? ''}:/usr/sbin:/sbin`);
    const mount = findExecutable('mount', `${process.env.PATH ?? ''}:/usr/bin:/bin`);
    const umount = findExecutable('umount', `${process.env.PATH ?? ''}:/usr/bin:/bin`);
    if (!mkfs) throw new DiskQuotaUnavailableError('mkfs.ext4 is not installed (apt-get install e2fsprogs)');
    if (!mount || !umount) throw new DiskQuotaUnavailableError('mount/umount are not installed (apt-get install mount)');
    await fs.access('/dev/loop-control', constants.R_OK | constants.W_OK).catch(() => {
      throw new DiskQuotaUnavailableError('this host has no loop devices (/dev/loop-control)');
    });
    return { mkfs, mount, umount };
  })();
  tools.catch(() => (tools = undefined));
  return tools;
}

/**
 * True when a loop device is mounted at `dir` (this process's mount table): a sandbox disk.
 * Other mounts (a worktree folder on a filesystem of its own) are none of Slipway's business.
 */
export async function isMountPoint(dir: string): Promise<boolean> {
  const table = await fs.readFile('/proc/self/mountinfo', 'utf8').catch(() => '');
  const unescape = (field: string) => field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
  const want = path.resolve(dir);
  return table.split('\n').some((line) => {
    const fields = line.split(' ');
    const dash = fields.indexOf('-');
    return dash > 4 && unescape(fields[4]!) === want && (fields[dash + 2] ?? '').startsWith('/dev/loop');
  });
}

async function run(command: string, args: string[]): Promise<void> {
  try {
    await execFileAsync(command, args, { timeout: 120_000, encoding: 'utf8' });
  } catch (e) {
    const err = e as Error & { stderr?: string };
    throw new Error(`${path.basename(command)} ${args[0] ?? ''} failed: ${(err.stderr || err.message).trim()}`);
  }
}

/**
 * Makes an image of `bytes` and mounts it at `root`, which must be missing or empty; root is
 * left an empty folder (lost+found removed) for `git worktree add`. A leftover image is replaced.
 */
export async function mountNewDisk(image: string, root: string, bytes: number): Promise<void> {
  const t = await requireDiskQuota();
  await fs.mkdir(path.dirname(image), { recursive: true });
  await fs.rm(image, { force: true });
  const handle = await fs.open(image, 'wx', 0o600);
  try {
    await handle.truncate(bytes);
  } finally {
    await handle.close();
  }
  // -m 0: the sandbox gets all of it (reserved blocks would only favour Slipway's own git);
  // no journal: a scratch workspace, and 4 MiB more for the files.
  await run(t.mkfs, ['-q', '-F', '-m', '0', '-O', '^has_journal', '-E', 'root_owner=0:0', image]);
  await fs.mkdir(root, { recursive: true });
  await run(t.mount, ['-o', 'loop,nosuid,nodev', image, root]);
  await fs.rm(path.join(root, 'lost+found'), { recursive: true, force: true });
}

/** Mounts an existing image again where it belongs (after a reboot); a no-op while mounted. */
export async function ensureDiskMounted(image: string, root: string): Promise<void> {
  if (!(await fs.lstat(image).then(() => true, () => false))) return;
  if (await isMountPoint(root)) return;
  const t = await requireDiskQuota();
  await fs.mkdir(root, { recursive: true });
  await run(t.mount, ['-o', 'loop,nosuid,nodev', image, root]);
}

/** Unmounts `root` when a disk is mounted there (lazily when a process still holds it). */
export async function unmountDisk(root: string): Promise<void> {
  if (!(await isMountPoint(root))) return;
  const t = await requireDiskQuota();
  await run(t.umount, [root]).catch(() => run(t.umount, ['-l', root]));
}

/** Unmounts `root` and deletes the image. Idempotent. */
export async function releaseDisk(image: string, root: string): Promise<void> {
  await unmountDisk(root);
  await fs.rm(image, { force: true });
  await fs.rmdir(path.dirname(image)).catch(() => undefined);
}

/**
 * Moves the files at `root` (a plain folder) onto a new image of `bytes` mounted there: for a
 * restore, which writes the files first. Fails with ENOSPC, leaving the plain folder, when they
 * no longer fit.
 */
export async function moveOntoNewDisk(image: string, root: string, bytes: number): Promise<void> {
  const staging = `${image}.mnt`;
  await fs.rm(staging, { recursive: true, force: true });
  await mountNewDisk(image, staging, bytes);
  const t = await requireDiskQuota();
  try {
    await run('cp', ['-a', '--reflink=auto', '--', `${root}/.`, `${staging}/`]);
  } catch (e) {
    await run(t.umount, [staging]).catch(() => undefined);
    await fs.rm(image, { force: true });
    await fs.rmdir(staging).catch(() => undefined);
    throw e;
  }
  await run(t.umount, [staging]);
  await fs.rmdir(staging);
  // Emptied, then covered: the files now live only on the image.
  for (const entry of await fs.readdir(root)) await fs.rm(path.join(root, entry), { recursive: true, force: true });
  await run(t.mount, ['-o', 'loop,nosuid,nodev', image, root]);
}
