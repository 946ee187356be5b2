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
 * group. Plain sandbox commands come too (`runInSpawner`, for `runProcess`), under that function's
 * own rules: the output's tail kept, the group killed when the leader exits. Only the worker starts one (`startSpawner`); elsewhere, or while it is down, calls run
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
// A worker that let go meanwhile (its channel closed) gets nothing; the 'disconnect' handler
// above then kills what runs. Without the callback a late send would throw EPIPE and end this
// process before that handler ran, leaving its runs behind.
const send = (message) => { if (process.connected) process.send(message, () => {}); };
const spawnError = (e) => ({ message: e.message, code: e.code, errno: e.errno, syscall: e.syscall, path: e.path });
// One process for the worker, under one of two sets of rules. 'run' (git, spawnFile): execFile's,
// output up to maxBuffer or the process is killed. 'proc' (runProcess's sandbox commands): the
// tail of the output kept, as TailBuffer in activities/process.ts keeps it; the group killed
// (SIGKILL) when the leader exits, and pipes a daemon outside the group holds let go 2 s later.
function start(m) {
  const proc = m.t === 'proc';
  const out = { chunks: [], size: 0, truncated: false };
  const err = { chunks: [], size: 0, truncated: false };
  const signal = proc ? 'SIGKILL' : m.killSignal;
  let reason, done = false, timer, grace, child;
  const finish = (r) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    clearTimeout(grace);
    running.delete(m.id);
    const text = (t) => Buffer.concat(t.chunks).toString(proc ? 'base64' : 'utf8');
    send({ t: 'done', id: m.id, reason, stdout: text(out), stderr: text(err), stdoutTruncated: out.truncated, stderrTruncated: err.truncated, ...r });
  };
  const group = () => { try { process.kill(-child.pid, signal); } catch { try { child.kill(signal); } catch {} } };
  const kill = (why) => { reason ??= why; group(); };
  try {
    child = cp.spawn(m.file, m.args, { cwd: m.cwd, env: m.env, shell: m.shell ? '/bin/sh' : false, detached: true, stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (e) {
    return finish({ spawnError: spawnError(e) });
  }
  child.on('error', (e) => { if (child.pid === undefined) finish({ spawnError: spawnError(e) }); });
  // Out of descriptors (EMFILE): no pipes and no process; the error above answers the call.
  if (!child.stdin || !child.stdout || !child.stderr) return;
  running.set(m.id, kill);
  // The worker kills the group itself if this process dies before the run ends.
  if (child.pid !== undefined) send({ t: 'pid', id: m.id, pid: child.pid });
  child.stdin.on('error', () => {});
  child.stdin.end(m.input ?? undefined);
  const keep = (t, name) => (d) => {
    if (proc) {
      t.chunks.push(d);
      t.size += d.length;
      while (t.chunks.length > 1 && t.size - t.chunks[0].length >= m.keep) { t.size -= t.chunks.shift().length; t.truncated = true; }
      return;
    }
    t.size += d.length;
    if (t.size <= m.maxBuffer) t.chunks.push(d);
    else if (!reason) {
      t.chunks.push(d.subarray(0, d.length - (t.size - m.maxBuffer)));
      kill('maxBuffer:' + name);
    }
  };
  child.stdout.on('data', keep(out, 'stdout'));
  child.stderr.on('data', keep(err, 'stderr'));
  if (m.timeout > 0) timer = setTimeout(() => kill('timeout'), m.timeout);
  if (proc) {
    child.on('exit', () => {
      group();
      grace = setTimeout(() => { child.stdout.destroy(); child.stderr.destroy(); }, 2000);
    });
  }
  child.on('close', (code, sig) => {
    if (proc) group();
    finish({ code, signal: sig });
  });
}
process.on('message', (m) => {
  if (m.t === 'abort') { const k = running.get(m.id); if (k) k('abort'); return; }
  if (m.t === 'run' || m.t === 'proc') start(m);
});
`;

/** The process a call started (sent before its answer). */
interface Started {
  t: 'pid';
  id: number;
  pid: number;
}

interface Done {
  t: 'done';
  id: number;
  reason?: string;
  stdout: string;
  stderr: string;
  code?: number | null;
  signal?: NodeJS.Signals | null;
  spawnError?: { message: string; code?: string; errno?: number; syscall?: string; path?: string };
  /** `proc` runs: stdout and stderr are base64 of their tails, cut at the front when these are set. */
  stdoutTruncated?: boolean;
  stderrTruncated?: boolean;
}

interface Pending {
  /** The spawner running it: a dead one fails only its own calls. */
  via: ChildProcess;
  file: string;
  args: string[];
  /** Its process, once the spawner said: killed here if the spawner dies first. */
  pid?: number;
  /** Its answer came. */
  settle: (m: Done) => void;
  /** The spawner died while it ran. */
  died: (message: string) => void;
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
    const child = spawner;
    spawner = undefined;
    if (!child) return;
    // Told to go (its channel closed), it kills what it runs and exits; SIGKILL if it does not.
    if (child.connected) child.disconnect();
    setTimeout(() => child.kill('SIGKILL'), 1_000).unref();
  };
}

/** The processes of calls in flight whose start the spawner has reported (for tests and diagnostics). */
export function spawnerRuns(): number[] {
  return [...pending.values()].flatMap((p) => (p.pid === undefined ? [] : [p.pid]));
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
    const failCalls = (): void => {
      for (const [id, p] of pending) {
        if (p.via !== child) continue;
        pending.delete(id);
        p.cleanup();
        // A spawner that was killed (not told to stop) could not kill what it ran. A run it had
        // not yet reported (killed within moments of starting it) is out of reach here.
        if (p.pid !== undefined) killProcessGroup(p.pid);
        p.died(`the process spawner exited while ${p.file} ran`);
      }
    };
    const gone = (): void => {
      if (!ended && !answered && holders > 0) deadOnArrival++;
      ended = true;
      if (spawner === child) spawner = undefined;
      // What it sent before it died (a run's pid) is read before its channel closes ('disconnect'):
      // its calls fail then, or a second later if the channel never says so.
      if (child.connected) setTimeout(failCalls, 1_000).unref();
      else failCalls();
    };
    child.on('error', gone);
    child.on('exit', gone);
    child.on('disconnect', gone);
    child.on('message', (m: Done | Started) => {
      answered = true;
      deadOnArrival = 0;
      const p = pending.get(m.id);
      if (!p) return;
      if (m.t === 'pid') {
        p.pid = m.pid;
        return;
      }
      pending.delete(m.id);
      p.cleanup();
      if (![...pending.values()].some((q) => q.via === child)) idle(child);
      p.settle(m);
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
function resultError(p: Pick<Pending, 'file' | 'args'>, m: Done): ExecFileException | null {
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
  const call = { file, args };
  submit(child, { t: 'run', file, args, cwd: options.cwd, env: options.env, input: options.input, maxBuffer: options.maxBuffer, timeout: options.timeout ?? 0, killSignal: options.killSignal ?? 'SIGTERM' }, options.signal, {
    settle: (m) => callback(resultError(call, m), m.stdout, m.stderr),
    died: (message) => callback(failure(call, { message, code: null, signal: 'SIGKILL' }), '', ''),
  });
}

/** Sends one call to `child`, with its abort, and keeps it pending until its answer or the spawner's death. */
function submit(child: ChildProcess, message: { t: 'run' | 'proc'; file: string; args: string[] } & Record<string, unknown>, signal: AbortSignal | undefined, answer: Pick<Pending, 'settle' | 'died'>): void {
  const id = nextId++;
  const onAbort = (): void => {
    if (spawner === child && child.connected) child.send({ t: 'abort', id });
  };
  signal?.addEventListener('abort', onAbort, { once: true });
  pending.set(id, { via: child, file: message.file, args: message.args, ...answer, cleanup: () => signal?.removeEventListener('abort', onAbort) });
  busy(child);
  child.send({ ...message, id });
}

/** The spawner died while a `runInSpawner` call ran (its process group was killed). */
export class SpawnerDied extends Error {
  override readonly name = 'SpawnerDied';
}

/** SIGKILL to a process group, or to the process if it has none of its own; gone is fine. */
export function killProcessGroup(pid: number | undefined, signal: NodeJS.Signals = 'SIGKILL'): void {
  if (!pid) return;
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      /* already gone */
    }
  }
}

/** A sandbox command for `runProcess` (activities/process.ts), which keeps its own semantics through the spawner. */
export interface ProcessRequest {
  file: string;
  args: string[];
  /** `file` is a command line for /bin/sh. */
  shell: boolean;
  cwd: string;
  /** The whole environment the process gets. */
  env: NodeJS.ProcessEnv;
  input?: string;
  /** Bytes of the tail of stdout and of stderr kept (at least this many, in whole chunks). */
  keepBytes: number;
  /** Kills its process group (SIGKILL) after this many ms. */
  timeout?: number;
  /** Kills its process group (SIGKILL). */
  signal?: AbortSignal;
}

export interface ProcessOutcome {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: Buffer;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  timedOut: boolean;
  cancelled: boolean;
}

/**
 * Runs `req` through the spawner, or gives undefined when none runs (the caller spawns it itself).
 * A program that cannot start rejects with the spawn error (`code` ENOENT, ...). A spawner that
 * dies while it runs rejects with SpawnerDied, after its process group was killed.
 */
export function runInSpawner(req: ProcessRequest): Promise<ProcessOutcome> | undefined {
  const child = ensureSpawner();
  if (!child) return undefined;
  return new Promise<ProcessOutcome>((resolve, reject) => {
    submit(child, { t: 'proc', file: req.file, args: req.args, shell: req.shell, cwd: req.cwd, env: req.env, input: req.input, keep: req.keepBytes, timeout: req.timeout ?? 0 }, req.signal, {
      settle: (m) => {
        if (m.spawnError) return reject(Object.assign(new Error(m.spawnError.message), m.spawnError));
        resolve({
          code: m.code ?? null,
          signal: m.signal ?? null,
          stdout: Buffer.from(m.stdout, 'base64'),
          stderr: Buffer.from(m.stderr, 'base64'),
          stdoutTruncated: m.stdoutTruncated === true,
          stderrTruncated: m.stderrTruncated === true,
          timedOut: m.reason === 'timeout',
          cancelled: m.reason === 'abort',
        });
      },
      // Not the command's doing: an error (the activity is retried), never an exit to judge.
      died: (message) => reject(new SpawnerDied(message)),
    });
  });
}
