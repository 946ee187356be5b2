/**
 * The worker's process spawner (ADR 0036). Node starts a process by fork + exec, and the fork
 * copies the page tables of the whole parent: a worker at 300 MB pays some 7 ms of CPU and blocks
 * its event loop 15-25 ms per git call. A small Node child with no imports beyond built-ins (about
 * 45 MB) starts the short-lived processes for it instead; the worker sends it one message per
 * process and gets back what `execFile` would have returned.
 *
 * It keeps what the direct call has: the caller's explicit environment (the spawner itself starts
 * with an empty one, so nothing of the worker's leaks in beyond what the caller passes; ADR 0027),
 * cwd, stdin input, maxBuffer (the process is killed and the call fails as execFile's does),
 * timeout and abort. Each process runs in its own process group, and a timeout or abort kills the
 * group. Only the worker starts one (`startSpawner`); elsewhere, or while it is down, calls run
 * `execFile` directly. A spawner that dies fails its calls in flight (like a killed process) and
 * is started again on the next call.
 */
import { execFile, spawn, type ChildProcess, type ExecFileException } from 'node:child_process';

export interface SpawnOptions {
  env: NodeJS.ProcessEnv;
  cwd?: string;
  /** Written to the process's stdin, which is then closed. */
  input?: string;
  maxBuffer: number;
  timeout?: number;
  killSignal?: NodeJS.Signals;
  signal?: AbortSignal;
}

export type SpawnCallback = (error: ExecFileException | null, stdout: string, stderr: string) => void;

/** The spawner's own program: built-ins only, so its fork of each process stays cheap. */
const SPAWNER_SOURCE = String.raw`
const cp = require('node:child_process');
const running = new Map();
// A terminal's Ctrl-C or a stop signalling the whole group is the worker's to handle: it still
// runs git during its shutdown grace and ends this process when it lets go of it.
for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(s, () => {});
// The worker is gone: its git processes (each in its own group) go too, not left orphaned.
process.on('disconnect', () => { for (const k of running.values()) k('disconnect'); process.exit(0); });
process.on('message', (m) => {
  if (m.t === 'abort') { const k = running.get(m.id); if (k) k('abort'); return; }
  if (m.t !== 'run') return;
  const out = [], err = [];
  let outLen = 0, errLen = 0, reason, done = false, timer, child;
  const finish = (r) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    running.delete(m.id);
    process.send({ t: 'done', id: m.id, reason, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8'), ...r });
  };
  const kill = (why) => {
    if (reason) return;
    reason = why;
    try { process.kill(-child.pid, m.killSignal); } catch { try { child.kill(m.killSignal); } catch {} }
  };
  try {
    child = cp.spawn(m.file, m.args, { cwd: m.cwd, env: m.env, detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (e) {
    return finish({ spawnError: { message: e.message, code: e.code, errno: e.errno, syscall: e.syscall, path: e.path } });
  }
  running.set(m.id, kill);
  child.on('error', (e) => { if (child.pid === undefined) finish({ spawnError: { message: e.message, code: e.code, errno: e.errno, syscall: e.syscall, path: e.path } }); });
  child.stdin.on('error', () => {});
  child.stdin.end(m.input ?? undefined);
  const collect = (chunks, name) => (d) => {
    const len = (name === 'stdout' ? (outLen += d.length) : (errLen += d.length));
    if (len <= m.maxBuffer) chunks.push(d);
    else if (!reason) {
      chunks.push(d.subarray(0, d.length - (len - m.maxBuffer)));
      kill('maxBuffer:' + name);
    }
  };
  child.stdout.on('data', collect(out, 'stdout'));
  child.stderr.on('data', collect(err, 'stderr'));
  if (m.timeout > 0) timer = setTimeout(() => kill('timeout'), m.timeout);
  child.on('close', (code, signal) => finish({ code, signal }));
});
`;

interface Done {
  t: 'done';
  id: number;
  reason?: string;
  stdout: string;
  stderr: string;
  code?: number | null;
  signal?: NodeJS.Signals | null;
  spawnError?: { message: string; code?: string; errno?: number; syscall?: string; path?: string };
}

interface Pending {
  /** The spawner running it: a dead one fails only its own calls. */
  via: ChildProcess;
  file: string;
  args: string[];
  callback: SpawnCallback;
  cleanup: () => void;
}

let spawner: ChildProcess | undefined;
let holders = 0;
/** Spawners in a row that died before answering any call: after 3, calls run directly. */
let deadOnArrival = 0;
let nextId = 1;
const pending = new Map<number, Pending>();

/**
 * Starts the spawner, or keeps the running one, until the returned release (a worker holds it
 * while it runs; several workers in one process share it). Calls made while nobody holds it go to
 * `execFile`; calls in flight when the last holder releases fail as if their process were killed.
 */
export function startSpawner(): () => void {
  holders++;
  ensureSpawner();
  let released = false;
  return () => {
    if (released) return;
    released = true;
    if (--holders > 0) return;
    spawner?.kill('SIGKILL');
    spawner = undefined;
  };
}

/** The spawner's process id (for tests and the bench), when one runs. */
export function spawnerPid(): number | undefined {
  return spawner?.pid;
}

function ensureSpawner(): ChildProcess | undefined {
  if (holders === 0 || deadOnArrival >= 3) return undefined;
  if (spawner?.connected) return spawner;
  try {
    const child = spawn(process.execPath, ['-e', SPAWNER_SOURCE], { env: {}, stdio: ['ignore', 'ignore', 'inherit', 'ipc'], serialization: 'json' });
    let answered = false;
    let ended = false;
    const gone = (): void => {
      if (!ended && !answered && holders > 0) deadOnArrival++;
      ended = true;
      if (spawner === child) spawner = undefined;
      for (const [id, p] of pending) {
        if (p.via !== child) continue;
        pending.delete(id);
        p.cleanup();
        p.callback(failure(p, { message: `the process spawner exited while ${p.file} ran`, code: null, signal: 'SIGKILL' }), '', '');
      }
    };
    child.on('error', gone);
    child.on('exit', gone);
    child.on('disconnect', gone);
    child.on('message', (m: Done) => {
      answered = true;
      deadOnArrival = 0;
      const p = pending.get(m.id);
      if (!p) return;
      pending.delete(m.id);
      p.cleanup();
      if (![...pending.values()].some((q) => q.via === child)) idle(child);
      p.callback(resultError(p, m), m.stdout, m.stderr);
    });
    child.unref();
    idle(child);
    spawner = child;
    return child;
  } catch {
    return undefined;
  }
}

/** An idle spawner keeps neither the worker's event loop nor a CLI alive. */
function idle(child: ChildProcess): void {
  (child.channel as { unref?: () => void } | undefined)?.unref?.();
}

function busy(child: ChildProcess): void {
  (child.channel as { ref?: () => void } | undefined)?.ref?.();
}

function failure(p: Pick<Pending, 'file' | 'args'>, f: { message: string; code: number | string | null; signal?: NodeJS.Signals | null; killed?: boolean }): ExecFileException {
  const e = new Error(f.message) as ExecFileException;
  e.code = f.code as ExecFileException['code'];
  e.killed = f.killed ?? false;
  e.signal = f.signal ?? undefined;
  e.cmd = [p.file, ...p.args].join(' ');
  return e;
}

/** The error execFile gives for the same outcome (the callers read `code` and the message). */
function resultError(p: Pending, m: Done): ExecFileException | null {
  if (m.spawnError) {
    const e = Object.assign(new Error(m.spawnError.message), m.spawnError) as ExecFileException;
    return e;
  }
  if (m.reason === 'abort') {
    const e = new Error('The operation was aborted') as ExecFileException;
    e.name = 'AbortError';
    e.code = 'ABORT_ERR';
    return e;
  }
  if (m.reason?.startsWith('maxBuffer:')) {
    const e = new RangeError(`${m.reason.slice('maxBuffer:'.length)} maxBuffer length exceeded`) as unknown as ExecFileException;
    e.code = 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER';
    return e;
  }
  if (m.code === 0 && !m.signal && !m.reason) return null;
  const cmd = [p.file, ...p.args].join(' ');
  return failure(p, { message: `Command failed: ${cmd}\n${m.stderr}`, code: m.code ?? null, signal: m.signal, killed: m.reason === 'timeout' });
}

/**
 * `execFile(file, args, options, callback)` through the spawner when one runs, else directly.
 * Output is utf-8 text; errors have execFile's shapes (exit `code`, AbortError, maxBuffer RangeError).
 */
export function spawnFile(file: string, args: string[], options: SpawnOptions, callback: SpawnCallback): void {
  const child = ensureSpawner();
  if (!child) {
    const c = execFile(file, args, { env: options.env, cwd: options.cwd, maxBuffer: options.maxBuffer, timeout: options.timeout, killSignal: options.killSignal, ...(options.signal ? { signal: options.signal } : {}) }, callback);
    // A process that exits before reading its input (git refusing its arguments) breaks the pipe:
    // its exit code is the answer, never an uncaught EPIPE.
    if (options.input !== undefined) c.stdin?.on('error', () => undefined).end(options.input);
    return;
  }
  if (options.signal?.aborted) {
    const e = new Error('The operation was aborted') as ExecFileException;
    e.name = 'AbortError';
    e.code = 'ABORT_ERR';
    queueMicrotask(() => callback(e, '', ''));
    return;
  }
  const id = nextId++;
  const onAbort = (): void => {
    if (spawner === child && child.connected) child.send({ t: 'abort', id });
  };
  options.signal?.addEventListener('abort', onAbort, { once: true });
  pending.set(id, { via: child, file, args, callback, cleanup: () => options.signal?.removeEventListener('abort', onAbort) });
  busy(child);
  child.send({ t: 'run', id, file, args, cwd: options.cwd, env: options.env, input: options.input, maxBuffer: options.maxBuffer, timeout: options.timeout ?? 0, killSignal: options.killSignal ?? 'SIGTERM' });
}
