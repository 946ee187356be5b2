/**
 * File I/O on a local sandbox's tree without a resolve-then-open race, for paths that come from
 * outside (the files API, agents). The tree belongs to whoever runs commands in it, so every
 * entry may change between two system calls.
 *
 * Linux: the path is walked one component at a time from a descriptor of the sandbox root,
 * each step opened relative to the previous directory's descriptor (`/proc/self/fd/<dir>/<name>`
 * with O_PATH | O_NOFOLLOW: the kernel's openat), so a folder swapped for a symlink after a
 * check is never followed. Symlinks inside the tree are expanded by the walker itself, under
 * the rules of paths.ts (an absolute target must name the sandbox by its real path, `..`
 * never climbs above the root). O_PATH opens neither FIFOs nor devices (nothing blocks, no
 * driver runs); a read then re-opens the checked inode through its descriptor. Writes go to a
 * new file in the same directory and are renamed over the name, so they never write through a
 * hard link, a FIFO or a device. Before data moves, the directory's real path (read back from
 * `/proc/self/fd`) must still be inside the root.
 *
 * Elsewhere (no /proc): paths.ts resolution with O_NOFOLLOW on the last component, as before.
 */
import { constants as constants_buffer } from 'node:buffer';
import { randomBytes } from 'node:crypto';
import { constants, promises as fs, readFileSync, type Stats } from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { Readable } from 'node:stream';
import { isInside, NOFOLLOW, PathEscapeError, resolveInside } from './paths';

/** Linux O_PATH: a handle on a name that does not open the file (no FIFO wait, no device open). */
const O_PATH = 0o10000000;
const MAX_LINK_HOPS = 40;
/** Longest name of one path component, and of a whole path (Linux NAME_MAX, PATH_MAX). */
export const NAME_MAX_BYTES = 255;
export const PATH_MAX_BYTES = 4096;
/** Names the files API never touches: git's and Slipway's own state (hooks, config, grants). */
export const RESERVED_NAMES = ['.git', '.slipway'];
/** Largest file read into one Buffer. */
export const MAX_BUFFER_BYTES = constants_buffer.MAX_LENGTH;

export class FileTooLargeError extends Error {
  readonly code = 'EFBIG';
  constructor(
    readonly requested: string,
    readonly size: number,
    readonly limit: number,
  ) {
    super(`"${requested}" is ${size} bytes, over the limit of ${limit} bytes`);
    this.name = 'FileTooLargeError';
  }
}

export class NotRegularFileError extends Error {
  readonly code = 'ENOTREGULAR';
  constructor(
    readonly requested: string,
    readonly kind: string,
  ) {
    super(`"${requested}" is a ${kind}, not a regular file`);
    this.name = 'NotRegularFileError';
  }
}

export interface FileIoOptions {
  /** Refuse paths with a component named like these (case-insensitive), links expanded included. */
  reservedNames?: string[];
  /** Reads: largest file returned (FileTooLargeError beyond). */
  maxBytes?: number;
  /**
   * Reads: serve regular files with several names. Only for trees whose commands run under
   * bubblewrap, where a link cannot cross the tree's mount (EXDEV), so every other name is the
   * tenant's own (ADR 0006); honoured only while the kernel's fs.protected_hardlinks is on.
   * Default: refused, since an unconfined command can link any file of the host it may read.
   */
  allowHardLinks?: boolean;
  /** Reads: stream only these bytes (a chunk of a file read through a remote owner); the size and cap stay the whole file's. */
  range?: { start: number; length: number };
}

let protectedHardlinks: boolean | undefined;
/** fs.protected_hardlinks: nobody links a file they could not read and write themselves. */
function kernelProtectsHardlinks(): boolean {
  if (protectedHardlinks === undefined) {
    try {
      protectedHardlinks = readFileSync('/proc/sys/fs/protected_hardlinks', 'utf8').trim() === '1';
    } catch {
      protectedHardlinks = false;
    }
  }
  return protectedHardlinks;
}

const errno = (code: string, message: string) => Object.assign(new Error(`${code}: ${message}`), { code });
const fdPath = (fd: number, name?: string) => (name === undefined ? `/proc/self/fd/${fd}` : `/proc/self/fd/${fd}/${name}`);
const useProc = process.platform === 'linux';

/** Checks a requested path's shape before any file system call: clear errors, not ENAMETOOLONG from deep inside. */
export function checkRequestedPath(requested: string, opts: FileIoOptions = {}): void {
  if (requested.includes('\0')) throw new PathEscapeError(requested, 'it contains a NUL byte');
  if (path.isAbsolute(requested)) throw new PathEscapeError(requested, 'absolute paths are not allowed; use a path relative to the sandbox root');
  if (Buffer.byteLength(requested) > PATH_MAX_BYTES) throw errno('ENAMETOOLONG', `the path is longer than ${PATH_MAX_BYTES} bytes`);
  for (const part of requested.split('/')) {
    if (Buffer.byteLength(part) > NAME_MAX_BYTES) throw errno('ENAMETOOLONG', `a path component is longer than ${NAME_MAX_BYTES} bytes`);
    checkReserved(requested, part, opts);
  }
}

/**
 * Refuses a path resolved elsewhere (a remote sandbox, links followed there) whose components,
 * relative to the workspace, name a reserved folder: the same rule as the local walker's.
 */
export function checkReservedPath(requested: string, relative: string, opts: FileIoOptions): void {
  for (const part of relative.split('/')) checkReserved(requested, part, opts);
}

function checkReserved(requested: string, name: string, opts: FileIoOptions): void {
  const reserved = opts.reservedNames ?? [];
  if (reserved.includes(name.toLowerCase())) throw new PathEscapeError(requested, `"${name}" is off limits to the files API`);
}

const kindOf = (s: Stats) =>
  s.isFIFO() ? 'FIFO' : s.isCharacterDevice() ? 'character device' : s.isBlockDevice() ? 'block device' : s.isSocket() ? 'socket' : s.isSymbolicLink() ? 'symbolic link' : 'special file';

interface Walked {
  /** The directory holding the last component (an O_PATH descriptor). */
  dir: FileHandle;
  /** The last component's name; undefined when the path names the root itself. */
  name?: string;
  /** O_PATH descriptor of the last component when it exists (never a symlink when following). */
  target?: FileHandle;
  close(): Promise<void>;
}

/**
 * Walks `requested` from `realRoot`. `create`: missing folders are made on the way (owned like
 * their parent). `followFinal`: a symlink in the last component is expanded (reads, writes) or
 * kept (deletes).
 */
async function walk(realRoot: string, requested: string, opts: FileIoOptions & { create: boolean; followFinal: boolean }): Promise<Walked> {
  const escape = () => new PathEscapeError(requested, 'a symbolic link leads outside the sandbox');
  const lexical = path.resolve(realRoot, requested);
  if (!isInside(realRoot, lexical)) throw new PathEscapeError(requested, 'it leads outside the sandbox');
  const pending = requested.split('/').filter((p) => p !== '' && p !== '.');
  const rootFh = await fs.open(realRoot, O_PATH | constants.O_DIRECTORY | NOFOLLOW);
  const stack: FileHandle[] = [rootFh];
  const opened: FileHandle[] = [rootFh];
  const close = async () => {
    await Promise.all(opened.map((f) => f.close().catch(() => undefined)));
  };
  let hops = 0;
  try {
    while (pending.length > 0) {
      const part = pending.shift()!;
      if (part === '' || part === '.') continue;
      if (part === '..') {
        if (stack.length === 1) throw escape();
        stack.pop();
        continue;
      }
      checkReserved(requested, part, opts);
      const dir = stack[stack.length - 1]!;
      const last = pending.length === 0;
      let fh: FileHandle;
      try {
        fh = await fs.open(fdPath(dir.fd, part), O_PATH | NOFOLLOW);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code !== 'ENOENT') throw e;
        if (last) return { dir, name: part, close };
        // A `..` after a missing folder fails in the kernel too; do not guess where it would lead.
        if (!opts.create || pending.includes('..')) throw errno('ENOENT', `no such file or directory, '${requested}'`);
        await fs.mkdir(fdPath(dir.fd, part), 0o755).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'EEXIST') throw err;
        });
        await chownLike(fdPath(dir.fd, part), dir, true);
        fh = await fs.open(fdPath(dir.fd, part), O_PATH | NOFOLLOW);
      }
      opened.push(fh);
      const st = await fh.stat();
      if (st.isSymbolicLink() && (!last || opts.followFinal)) {
        if (++hops > MAX_LINK_HOPS) throw new PathEscapeError(requested, 'too many levels of symbolic links');
        // Read through the directory descriptor; whatever target is read, every step it leads to is checked again.
        const target = await fs.readlink(fdPath(dir.fd, part)).catch((e: NodeJS.ErrnoException) => {
          // Swapped for something else since the stat: the tree is being changed under us.
          if (e.code === 'EINVAL' || e.code === 'ENOENT') throw new PathEscapeError(requested, 'it changed while being resolved; try again');
          throw e;
        });
        if (path.isAbsolute(target)) {
          if (target !== realRoot && !target.startsWith(realRoot + path.sep)) throw escape();
          stack.length = 1;
          pending.unshift(...target.slice(realRoot.length).split('/'));
        } else {
          pending.unshift(...target.split('/'));
        }
        continue;
      }
      if (last) return { dir, name: part, target: fh, close };
      if (!st.isDirectory()) throw errno('ENOTDIR', `a parent of "${requested}" is not a directory`);
      stack.push(fh);
    }
    return { dir: stack[stack.length - 1]!, target: stack.length === 1 ? rootFh : stack[stack.length - 1], close };
  } catch (e) {
    await close();
    throw e;
  }
}

/** The directory descriptor must still lead inside the sandbox (it may have been moved). */
async function assertInside(realRoot: string, dir: FileHandle, requested: string): Promise<void> {
  const where = await fs.readlink(fdPath(dir.fd));
  if (!isInside(realRoot, where)) throw new PathEscapeError(requested, 'a folder on the way was moved outside the sandbox');
}

/** New files and folders belong to whoever owns the folder they are made in (the sandbox's user), not to this server. */
async function chownLike(target: string | FileHandle, dir: FileHandle, isPath: boolean, owner?: Stats): Promise<void> {
  if (process.getuid?.() !== 0) return;
  const st = owner ?? (await dir.stat());
  if (isPath) await fs.lchown(target as string, st.uid, st.gid).catch(() => undefined);
  else await (target as FileHandle).chown(st.uid, st.gid).catch(() => undefined);
}

export interface OpenedFile {
  size: number;
  stream: Readable;
  /** The file as opened: a chunked read checks that every chunk comes from the same version (device, inode, size, mtime). */
  version?: string;
}

/** Opens a regular file of the sandbox for reading: size checked against the cap, content streamed. */
export async function openSandboxFile(root: string, requested: string, opts: FileIoOptions = {}): Promise<OpenedFile> {
  checkRequestedPath(requested, opts);
  const realRoot = await fs.realpath(root);
  if (!useProc) {
    const fh = await fs.open(await resolveInside(realRoot, requested), constants.O_RDONLY | NOFOLLOW | constants.O_NONBLOCK);
    return checkedStream(fh, requested, opts);
  }
  const w = await walk(realRoot, requested, { ...opts, create: false, followFinal: true });
  try {
    if (!w.target) throw errno('ENOENT', `no such file or directory, '${requested}'`);
    const st = await w.target.stat();
    if (st.isDirectory()) throw errno('EISDIR', `"${requested}" is a directory`);
    if (!st.isFile()) throw new NotRegularFileError(requested, kindOf(st));
    // A second name may be a file the host shares, unless the tree is confined (see allowHardLinks).
    if (st.nlink > 1 && !(opts.allowHardLinks && kernelProtectsHardlinks())) throw new PathEscapeError(requested, 'it is a hard link (a file with several names)');
    if (opts.maxBytes !== undefined && st.size > opts.maxBytes) throw new FileTooLargeError(requested, st.size, opts.maxBytes);
    await assertInside(realRoot, w.dir, requested);
    // Re-open the very inode checked above, through its descriptor (no name lookup in the tree).
    const fh = await fs.open(fdPath(w.target.fd), constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
    const again = await fh.stat();
    if (again.ino !== st.ino || again.dev !== st.dev || !again.isFile()) {
      await fh.close();
      throw new PathEscapeError(requested, 'it changed while being opened');
    }
    return await checkedStream(fh, requested, opts, again);
  } finally {
    await w.close();
  }
}

async function checkedStream(fh: FileHandle, requested: string, opts: FileIoOptions, known?: Stats): Promise<OpenedFile> {
  const st = known ?? (await fh.stat());
  if (!st.isFile()) {
    await fh.close();
    throw st.isDirectory() ? errno('EISDIR', `"${requested}" is a directory`) : new NotRegularFileError(requested, kindOf(st));
  }
  if (opts.maxBytes !== undefined && st.size > opts.maxBytes) {
    await fh.close();
    throw new FileTooLargeError(requested, st.size, opts.maxBytes);
  }
  const version = `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}`;
  const start = Math.min(opts.range?.start ?? 0, st.size);
  const end = Math.min(st.size, opts.range ? start + opts.range.length : st.size);
  if (end <= start) {
    await fh.close();
    return { size: st.size, stream: Readable.from([]), version };
  }
  // The size at open time is what is sent: a file growing meanwhile cannot push past the cap.
  return { size: st.size, stream: fh.createReadStream({ start, end: end - 1 }), version };
}

/** One entry of a folder listing (the files API's `GET /files?path=`). */
export interface FileEntry {
  name: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  /** Bytes (a regular file's size; a folder's or link's as the file system reports it). */
  size: number;
}

/** Entries of a folder listing, by name, reserved names (`.git`, `.slipway`) left out. */
export function listedEntries(entries: FileEntry[], opts: FileIoOptions): FileEntry[] {
  const reserved = opts.reservedNames ?? [];
  return entries.filter((e) => !reserved.includes(e.name.toLowerCase())).sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** Lists a folder of the sandbox (links inside followed under the walker's rules; entries not followed). */
export async function listSandboxDir(root: string, requested: string, opts: FileIoOptions = {}): Promise<FileEntry[]> {
  checkRequestedPath(requested, opts);
  const realRoot = await fs.realpath(root);
  let dir: string;
  let w: Walked | undefined;
  if (!useProc) {
    dir = await resolveInside(realRoot, requested);
  } else {
    w = await walk(realRoot, requested, { ...opts, create: false, followFinal: true });
    if (!w.target) {
      await w.close();
      throw errno('ENOENT', `no such file or directory, '${requested}'`);
    }
    dir = fdPath(w.target.fd);
  }
  try {
    const st = await fs.stat(dir);
    if (!st.isDirectory()) throw errno('ENOTDIR', `"${requested}" is not a directory`);
    if (w) await assertInside(realRoot, w.target!, requested);
    const names = await fs.readdir(dir);
    const entries: FileEntry[] = [];
    for (const name of names) {
      const e = await fs.lstat(path.join(dir, name)).catch(() => undefined);
      if (!e) continue;
      entries.push({ name, type: e.isFile() ? 'file' : e.isDirectory() ? 'directory' : e.isSymbolicLink() ? 'symlink' : 'other', size: e.size });
    }
    return listedEntries(entries, opts);
  } finally {
    await w?.close();
  }
}

/** Reads a whole regular file (within the cap) into memory. */
/** `opts` with its size cap lowered to what one Buffer can hold: a clear error, not a crash, for a huge file read whole. */
export function bufferCapped(opts: FileIoOptions): FileIoOptions {
  return { ...opts, maxBytes: Math.min(opts.maxBytes ?? MAX_BUFFER_BYTES, MAX_BUFFER_BYTES) };
}

export async function readSandboxFile(root: string, requested: string, opts: FileIoOptions = {}): Promise<Buffer> {
  const { stream } = await openSandboxFile(root, requested, bufferCapped(opts));
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/** Writes a file (parent folders made as needed) by renaming a new file over the name. */
/** `content` may be a stream (a file staged by a chunked upload, ADR 0026): it is written to a temporary name and renamed into place all the same. */
export async function writeSandboxFile(root: string, requested: string, content: Buffer | string | Readable, opts: FileIoOptions = {}): Promise<void> {
  checkRequestedPath(requested, opts);
  const realRoot = await fs.realpath(root);
  if (!useProc) {
    const target = await resolveInside(realRoot, requested);
    await fs.mkdir(path.dirname(target), { recursive: true });
    await fs.writeFile(target, content, { flag: constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | NOFOLLOW });
    return;
  }
  const w = await walk(realRoot, requested, { ...opts, create: true, followFinal: true });
  try {
    if (w.name === undefined) throw errno('EISDIR', `"${requested}" is a directory`);
    const existing = w.target ? await w.target.stat() : undefined;
    if (existing?.isDirectory()) throw errno('EISDIR', `"${requested}" is a directory`);
    const mode = existing?.isFile() ? existing.mode & 0o777 : 0o644;
    const tmp = `.${w.name.slice(0, 200)}.${randomBytes(6).toString('hex')}.put`;
    const fh = await fs.open(fdPath(w.dir.fd, tmp), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | NOFOLLOW, mode);
    let renamed = false;
    try {
      await chownLike(fh, w.dir, false, existing?.isFile() ? existing : undefined);
      await fh.chmod(mode);
      if (content instanceof Readable) for await (const chunk of content) await fh.write(chunk as Buffer);
      else await fh.writeFile(content);
      await fh.close();
      await assertInside(realRoot, w.dir, requested);
      await fs.rename(fdPath(w.dir.fd, tmp), fdPath(w.dir.fd, w.name));
      renamed = true;
    } finally {
      await fh.close().catch(() => undefined);
      if (!renamed) await fs.unlink(fdPath(w.dir.fd, tmp)).catch(() => undefined);
    }
  } finally {
    await w.close();
  }
}

/** Deletes a file or a link (never what a link points to); what is gone already is fine. */
export async function deleteSandboxFile(root: string, requested: string, opts: FileIoOptions = {}): Promise<void> {
  checkRequestedPath(requested, opts);
  const realRoot = await fs.realpath(root);
  if (!useProc) {
    const target = await resolveInside(realRoot, requested, { followFinalSymlink: false });
    if (target === realRoot) throw new PathEscapeError(requested, 'the sandbox root itself cannot be deleted');
    await fs.rm(target, { force: true });
    return;
  }
  let w: Walked;
  try {
    w = await walk(realRoot, requested, { ...opts, create: false, followFinal: false });
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw e;
  }
  try {
    if (w.name === undefined) throw new PathEscapeError(requested, 'the sandbox root itself cannot be deleted');
    if (!w.target) return;
    if ((await w.target.stat()).isDirectory()) throw errno('EISDIR', `"${requested}" is a directory`);
    await assertInside(realRoot, w.dir, requested);
    await fs.unlink(fdPath(w.dir.fd, w.name)).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'ENOENT') throw e;
    });
  } finally {
    await w.close();
  }
}
