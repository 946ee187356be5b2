/**
 * Runs a child process in its own process group, streams its output line by line,
 * and kills the whole group on timeout or cancellation (agents and gates spawn children).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { isPayloadKeyVariable } from '../lib/payload-keys';
import { killProcessGroup, runInSpawner } from '../lib/spawner';

export { killProcessGroup };

export interface RunOptions {
  /** Executable, or a shell command line when `shell` is true. */
  command: string;
  args?: string[];
  shell?: boolean;
  cwd: string;
  /**
   * The directory the real program runs in, when `command` is a wrapper that changes directory
   * itself (`bwrap --chdir DIR`); default `cwd`. It becomes the child's `PWD`.
   */
  pwd?: string;
  env?: NodeJS.ProcessEnv;
  stdin?: string;
  timeoutMs?: number;
  signal?: AbortSignal;
  /**
   * On timeout or cancellation: SIGTERM to every process of the run first, SIGKILL to what is left
   * after this many ms (agents save their session and exit cleanly). Default 0: SIGKILL at once.
   */
  killGraceMs?: number;
  onLine?: (stream: 'stdout' | 'stderr', line: string) => void;
  /** Bytes of stdout/stderr kept (the tail). */
  maxCaptureBytes?: number;
  /** Longest line handed to onLine; longer lines are cut (the rest is dropped, not split). */
  maxLineBytes?: number;
  /** Extra pipes after stdin/stdout/stderr (fds 3, 4, ...), for wrappers that talk over them. */
  extraPipes?: number;
  /** Runs right after the spawn; a rejection kills the process group and fails the run. */
  prepare?: (child: ChildProcess) => Promise<void>;
  /** Runs when the leader exits, before its pipes close (kill what it left, e.g. a cgroup). */
  onExit?: () => Promise<void>;
}

export interface RunResult {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  cancelled: boolean;
  durationMs: number;
}

const DEFAULT_CAPTURE = 64 * 1024;
const DEFAULT_MAX_LINE = 4 * 1024 * 1024;

/** Keeps the last `limit` bytes of a stream (the spawner's `proc` runs keep theirs the same way, lib/spawner.ts). */
export class TailBuffer {
  private chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  constructor(private readonly limit: number) {}
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    // Whole chunks go only while the rest still holds `limit` bytes; toString cuts the first one.
    while (this.chunks.length > 1 && this.size - this.chunks[0]!.length >= this.limit) {
      this.size -= this.chunks.shift()!.length;
      this.truncated = true;
    }
  }
  toString(): string {
    let buf = Buffer.concat(this.chunks);
    if (buf.length > this.limit) {
      buf = buf.subarray(buf.length - this.limit);
      this.truncated = true;
    }
    return (this.truncated ? '…[truncated]\n' : '') + buf.toString('utf8');
  }
}

/** Splits a byte stream into lines without holding more than maxLineBytes of one line. */
class LineSplitter {
  private pending: Buffer[] = [];
  private pendingSize = 0;
  private overflow = false;
  constructor(private readonly maxLine: number, private readonly emit: (line: string) => void) {}
  push(chunk: Buffer): void {
    let start = 0;
    for (let i = chunk.indexOf(10); i !== -1; i = chunk.indexOf(10, start)) {
      this.append(chunk.subarray(start, i));
      this.flush();
      start = i + 1;
    }
    if (start < chunk.length) this.append(chunk.subarray(start));
  }
  end(): void {
    if (this.pendingSize > 0 || this.overflow) this.flush();
  }
  private append(part: Buffer): void {
    if (this.overflow) return;
    const room = this.maxLine - this.pendingSize;
    if (part.length > room) {
      this.pending.push(part.subarray(0, room));
      this.pendingSize += room;
      this.overflow = true;
    } else {
      this.pending.push(part);
      this.pendingSize += part.length;
    }
  }
  private flush(): void {
    let line = Buffer.concat(this.pending).toString('utf8');
    if (line.endsWith('\r')) line = line.slice(0, -1);
    this.pending = [];
    this.pendingSize = 0;
    this.overflow = false;
    this.emit(line);
  }
}

/**
 * Wrappers Slipway puts around a command (bubblewrap, and `setpriv`/`unshare` for unconfined
 * ones). They do not forward signals, and their death SIGKILLs what runs inside them.
 */
const WRAPPERS = new Set(['bwrap', 'setpriv', 'unshare']);

/**
 * Asks a run to stop: SIGTERM to every descendant of `pid` that is not a wrapper, found through
 * /proc (a process-group signal cannot do it: a confined command runs in its own session inside
 * bubblewrap, and a signal to a wrapper would kill the command at once instead).
 */
export function terminateTree(pid: number | undefined): void {
  signalTree(pid, 'SIGTERM');
}

/** `signal` to every descendant of `pid` (and `pid` itself) that is not a wrapper: see terminateTree. */
export function signalTree(pid: number | undefined, signal: NodeJS.Signals): void {
  if (!pid) return;
  const children = new Map<number, Array<{ pid: number; comm: string }>>();
  let entries: string[] = [];
  try {
    entries = readdirSync('/proc');
  } catch {
    return; // no /proc: the SIGKILL after the grace period is all there is
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue;
    }
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses; ppid follows the last ')'.
    const close = stat.lastIndexOf(')');
    const comm = stat.slice(stat.indexOf('(') + 1, close);
    const ppid = Number(stat.slice(close + 2).split(' ')[1]);
    if (!children.has(ppid)) children.set(ppid, []);
    children.get(ppid)!.push({ pid: Number(entry), comm });
  }
  const queue = [...(children.get(pid) ?? [])];
  let leaderComm: string | undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    leaderComm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
  } catch {
    /* gone */
  }
  if (leaderComm !== undefined && !WRAPPERS.has(leaderComm)) queue.unshift({ pid, comm: leaderComm });
  const seen = new Set<number>();
  while (queue.length > 0) {
    const p = queue.shift()!;
    if (seen.has(p.pid)) continue;
    seen.add(p.pid);
    if (!WRAPPERS.has(p.comm)) {
      try {
        process.kill(p.pid, signal);
      } catch {
        /* gone */
      }
    }
    if (p.pid !== pid) queue.push(...(children.get(p.pid) ?? []));
  }
}

/**
 * Variables that describe where the *worker* was started, not where the child runs. Tools trust
 * them over their real cwd (OpenCode takes its working directory from `$PWD`; npm scripts use
 * `INIT_CWD` and `npm_config_local_prefix`), so an inherited value sends a sandboxed agent's
 * writes into the user's checkout.
 */
const LAUNCH_LOCATION_VARS = /^(OLDPWD|INIT_CWD|npm_config_local_prefix|npm_package_json|npm_package_.+|npm_lifecycle_.+)$/;

/**
 * The environment a child really gets: `env` (default: the worker's) without the launch-location
 * variables above and the payload keys, and `PWD` set to the child's own cwd (its real path, as a
 * shell would set it).
 */
export function childEnv(cwd: string, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(env)) {
    if (value !== undefined && !LAUNCH_LOCATION_VARS.test(name) && !isPayloadKeyVariable(name)) out[name] = value;
  }
  let real: string;
  try {
    real = realpathSync(cwd);
  } catch {
    real = path.resolve(cwd); // spawn reports the missing cwd itself
  }
  out.PWD = real;
  return out;
}

export function runProcess(opts: RunOptions): Promise<RunResult> {
  const started = Date.now();
  if (opts.signal?.aborted) return Promise.resolve({ exitCode: null, signal: null, stdout: '', stderr: '', timedOut: false, cancelled: true, durationMs: 0 });
  // A run that needs nothing but its result (no lines as they come, no pipes to feed, no hooks, no
  // gentle stop) goes through the worker's spawner when one runs: no fork of the worker (ADR 0036).
  if (!opts.onLine && !opts.extraPipes && !opts.prepare && !opts.onExit && !opts.killGraceMs) {
    const capture = opts.maxCaptureBytes ?? DEFAULT_CAPTURE;
    const via = runInSpawner({
      file: opts.command,
      args: opts.args ?? [],
      shell: opts.shell === true,
      cwd: opts.cwd,
      env: childEnv(opts.pwd ?? opts.cwd, opts.env ?? process.env),
      input: opts.stdin,
      keepBytes: capture,
      timeout: opts.timeoutMs,
      signal: opts.signal,
    });
    if (via) {
      return via.then((r) => {
        const text = (bytes: Buffer, truncated: boolean) => {
          const t = new TailBuffer(capture);
          t.push(bytes);
          t.truncated ||= truncated;
          return t.toString();
        };
        return { exitCode: r.code, signal: r.signal, stdout: text(r.stdout, r.stdoutTruncated), stderr: text(r.stderr, r.stderrTruncated), timedOut: r.timedOut, cancelled: r.cancelled, durationMs: Date.now() - started };
      });
    }
  }
  return new Promise<RunResult>((resolve, reject) => {
    const child = spawn(opts.command, opts.args ?? [], {
      cwd: opts.cwd,
      env: childEnv(opts.pwd ?? opts.cwd, opts.env ?? process.env),
      shell: opts.shell ? '/bin/sh' : false,
      detached: true, // own process group, so we can kill the whole tree
      stdio: ['pipe', 'pipe', 'pipe', ...Array.from({ length: opts.extraPipes ?? 0 }, () => 'pipe' as const)],
    }) as ChildProcess & { stdin: NodeJS.WritableStream & { on: (e: 'error', f: () => void) => void; end: (s?: string) => void }; stdout: NodeJS.ReadableStream & { destroy: () => void }; stderr: NodeJS.ReadableStream & { destroy: () => void } };
    // Out of descriptors (EMFILE): no pipes and no process; its 'error' event says why.
    if (!child.stdin || !child.stdout || !child.stderr) {
      child.once('error', reject);
      return;
    }
    const capture = opts.maxCaptureBytes ?? DEFAULT_CAPTURE;
    const out = new TailBuffer(capture);
    const err = new TailBuffer(capture);
    const maxLine = opts.maxLineBytes ?? DEFAULT_MAX_LINE;
    const outLines = opts.onLine ? new LineSplitter(maxLine, (l) => opts.onLine!('stdout', l)) : undefined;
    const errLines = opts.onLine ? new LineSplitter(maxLine, (l) => opts.onLine!('stderr', l)) : undefined;
    let timedOut = false;
    let cancelled = false;

    child.stdout.on('data', (c: Buffer) => {
      out.push(c);
      outLines?.push(c);
    });
    child.stderr.on('data', (c: Buffer) => {
      err.push(c);
      errLines?.push(c);
    });
    child.stdin.on('error', () => undefined); // the child may exit without reading stdin
    if (opts.stdin !== undefined) child.stdin.end(opts.stdin);
    else child.stdin.end();

    let graceTimer: NodeJS.Timeout | undefined;
    const stop = () => {
      if (!opts.killGraceMs) return killProcessGroup(child.pid);
      if (graceTimer) return;
      terminateTree(child.pid);
      graceTimer = setTimeout(() => killProcessGroup(child.pid), opts.killGraceMs);
      graceTimer.unref();
    };
    const timer = opts.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          stop();
        }, opts.timeoutMs)
      : undefined;
    const onAbort = () => {
      cancelled = true;
      stop();
    };
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    let prepareFailure: Error | undefined;
    opts.prepare?.(child).catch((e: Error) => {
      prepareFailure = e;
      killProcessGroup(child.pid);
    });
    // A descendant that keeps stdout or stderr open (a daemon in its own session) must not keep
    // the run open once the leader is gone: after the leader's exit, its pipes get a short grace.
    child.on('exit', () => {
      void (opts.onExit?.() ?? Promise.resolve())
        .catch(() => undefined)
        .finally(() => {
          killProcessGroup(child.pid);
          setTimeout(() => {
            child.stdout.destroy();
            child.stderr.destroy();
          }, 2_000).unref();
        });
    });

    child.on('error', (e) => {
      if (timer) clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      reject(e);
    });
    child.on('close', (code, signal) => {
      if (timer) clearTimeout(timer);
      if (graceTimer) clearTimeout(graceTimer);
      opts.signal?.removeEventListener('abort', onAbort);
      outLines?.end();
      errLines?.end();
      // Children that outlived the leader (daemonised helpers) must not linger.
      killProcessGroup(child.pid);
      if (prepareFailure) {
        reject(prepareFailure);
        return;
      }
      resolve({
        exitCode: code,
        signal,
        stdout: out.toString(),
        stderr: err.toString(),
        timedOut,
        cancelled,
        durationMs: Date.now() - started,
      });
    });
  });
}

/** Tail of a text, for failure summaries that go into workflow history. */
export function tail(text: string, maxChars: number): string {
  return text.length <= maxChars ? text : '…' + text.slice(text.length - maxChars);
}
