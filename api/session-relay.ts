/**
 * Carries an interactive session (activities/sandbox/session.ts) over a transport: NDJSON
 * lines of a streaming exec, or WebSocket messages. One framing for both (schemas.ts
 * SessionServerFrame), and one rule for memory: output is read from the command only as fast
 * as the client takes it. A sink that is over its bound pauses the session's output streams
 * (the command then blocks on its full pipe) until the sink drains, so a slow reader holds at
 * most about one bound plus one chunk in the server, whatever the command prints.
 */
import { finished } from 'node:stream/promises';
import { StringDecoder } from 'node:string_decoder';
import type { Readable } from 'node:stream';
import type { ServiceMetrics } from '../activities/service/metrics';
import type { SandboxSession } from '../activities/sandbox/provider';
import type { z } from 'zod';
import { SessionClientFrame, SessionStartFrame, zodIssues, type SessionServerFrame } from './schemas';

export interface FrameSink {
  /** Sends one frame; false when the sink is over its bound (wait for onDrain before more). */
  send(frame: string): boolean;
  /** Calls `resume` once, when the sink is under its bound again. */
  onDrain(resume: () => void): void;
  /** Bytes the server holds for this client right now. */
  buffered(): number;
}

export interface RelayOptions {
  encoding: 'utf8' | 'base64';
  accountId: string;
  metrics?: ServiceMetrics;
  /** Kills the session after this long; the exit frame says timed_out. */
  timeoutMs?: number;
}

/** Relays output until the session ended and its output is all sent; sends the exit frame last. */
export async function relaySession(session: SandboxSession, sink: FrameSink, opts: RelayOptions): Promise<SessionServerFrame & { type: 'exit' }> {
  const started = Date.now();
  const sources: Array<[Readable, 'stdout' | 'stderr']> = [
    [session.stdout, 'stdout'],
    [session.stderr, 'stderr'],
  ];
  let paused = false;
  const pause = () => {
    if (paused) return;
    paused = true;
    for (const [stream] of sources) stream.pause();
    sink.onDrain(() => {
      paused = false;
      for (const [stream] of sources) stream.resume();
    });
  };
  const send = (frame: SessionServerFrame) => {
    const ok = sink.send(JSON.stringify(frame));
    opts.metrics?.sessionBuffered(sink.buffered());
    if (!ok) pause();
  };
  const done: Array<Promise<unknown>> = [];
  for (const [stream, type] of sources) {
    const decoder = opts.encoding === 'utf8' ? new StringDecoder('utf8') : undefined;
    done.push(
      finished(stream)
        .catch(() => undefined)
        .then(() => {
          const rest = decoder?.end();
          if (rest) send({ type, data: rest });
        }),
    );
    stream.on('data', (chunk: Buffer) => {
      opts.metrics?.sessionBytes(opts.accountId, 'out', chunk.length);
      const data = decoder ? decoder.write(chunk) : chunk.toString('base64');
      if (data) send({ type, data });
    });
  }
  let timedOut = false;
  const timer = opts.timeoutMs
    ? setTimeout(() => {
        timedOut = true;
        session.kill();
      }, opts.timeoutMs)
    : undefined;
  try {
    const [exit] = await Promise.all([session.exit, ...done]);
    const frame = { type: 'exit' as const, exit_code: exit.exitCode, signal: exit.signal, timed_out: timedOut, duration_ms: Date.now() - started };
    sink.send(JSON.stringify(frame));
    return frame;
  } finally {
    if (timer) clearTimeout(timer);
  }
}

/** Feeds client bytes to the command's stdin, counted; false when the pipe is full (wait for 'drain' on stdin). */
export function writeInput(session: SandboxSession, bytes: Buffer, opts: Pick<RelayOptions, 'accountId' | 'metrics'>): boolean {
  opts.metrics?.sessionBytes(opts.accountId, 'in', bytes.length);
  return session.stdin.write(bytes);
}

/** Ends a session whose client went away: kills it and drops the output nobody will read. */
export function abandonSession(session: SandboxSession): void {
  session.kill();
  session.stdout.destroy();
  session.stderr.destroy();
}

/** Output bytes a WebSocket may hold unsent before the session's output pauses. */
export const WEBSOCKET_OUTPUT_BOUND = 256 * 1024;

interface SessionSocket {
  send(data: string, cb: (err?: Error) => void): void;
  close(code?: number, reason?: string): void;
  pause(): void;
  resume(): void;
  readonly bufferedAmount: number;
  on(event: 'message', listener: (data: Buffer, isBinary: boolean) => void): unknown;
  on(event: 'close', listener: () => void): unknown;
}

export interface SocketContext {
  open: (start: SessionStartFrame) => Promise<SandboxSession>;
  accountId: string;
  metrics?: ServiceMetrics;
  onError?: (e: unknown) => void;
}

/**
 * The exec WebSocket: the first message is a start frame (what to run); then binary messages
 * are stdin bytes, text messages are stdin / stdin_close / resize / signal frames. The server
 * sends stdout / stderr frames, then exit, and closes (1000). Bad input gets an error frame
 * naming the field: before the start, the socket closes with 4000 + the HTTP status; after it,
 * the session goes on.
 */
export function serveSessionSocket(socket: SessionSocket, ctx: SocketContext): void {
  let session: SandboxSession | undefined;
  let starting = false;
  let closed = false;
  const queued: Array<[Buffer, boolean]> = [];
  let outstanding = 0;
  let waiter: (() => void) | undefined;
  const frame = (f: SessionServerFrame) => socket.send(JSON.stringify(f), () => undefined);
  const refuse = (status: number, code: string, message: string, issues?: Array<{ path: string; message: string }>) => {
    frame({ type: 'error', code, message, ...(issues ? { issues } : {}) });
    socket.close(status >= 400 && status < 500 ? 4000 + status : 1011, code);
  };
  const sink: FrameSink = {
    send(f) {
      const size = Buffer.byteLength(f);
      outstanding += size;
      socket.send(f, () => {
        outstanding -= size;
        if (waiter && outstanding <= WEBSOCKET_OUTPUT_BOUND / 2) {
          const w = waiter;
          waiter = undefined;
          w();
        }
      });
      return outstanding < WEBSOCKET_OUTPUT_BOUND;
    },
    onDrain(resume) {
      if (outstanding <= WEBSOCKET_OUTPUT_BOUND / 2) resume();
      else waiter = resume;
    },
    buffered: () => Math.max(outstanding, socket.bufferedAmount),
  };
  const input = (bytes: Buffer) => {
    if (!writeInput(session!, bytes, ctx)) {
      socket.pause();
      session!.stdin.once('drain', () => socket.resume());
    }
  };
  const handle = (data: Buffer, isBinary: boolean) => {
    const s = session!;
    if (isBinary) return input(data);
    const parsed = parseFrame(SessionClientFrame, data);
    if ('error' in parsed) return frame({ type: 'error', code: 'invalid_frame', message: parsed.error, issues: parsed.issues });
    const f = parsed.value;
    try {
      if (f.type === 'stdin') input(Buffer.from(f.data, 'base64'));
      else if (f.type === 'stdin_close') s.stdin.end();
      else if (f.type === 'resize') s.resize(f.cols, f.rows);
      else s.signal(f.signal);
    } catch (e) {
      frame({ type: 'error', code: 'invalid_frame', message: (e as Error).message });
    }
  };
  const start = async (data: Buffer, isBinary: boolean) => {
    starting = true;
    if (isBinary) return refuse(400, 'invalid_start', 'the first message must be a JSON start frame: {"type":"start","command":...}');
    const parsed = parseFrame(SessionStartFrame, data);
    if ('error' in parsed) return refuse(400, 'invalid_start', parsed.error, parsed.issues);
    let opened: SandboxSession;
    try {
      opened = await ctx.open(parsed.value);
    } catch (e) {
      const api = e as { status?: number; code?: string; message: string; issues?: Array<{ path: string; message: string }> };
      if (typeof api.status === 'number' && api.code) return refuse(api.status, api.code, api.message, api.issues);
      ctx.onError?.(e);
      return refuse(500, 'internal', 'internal error');
    }
    if (closed) return abandonSession(opened);
    session = opened;
    for (const [d, b] of queued.splice(0)) handle(d, b);
    await relaySession(opened, sink, { encoding: parsed.value.output_encoding ?? 'utf8', accountId: ctx.accountId, metrics: ctx.metrics });
    socket.close(1000, 'exited');
  };
  socket.on('message', (data, isBinary) => {
    if (session) return handle(data, isBinary);
    if (starting) return void queued.push([data, isBinary]);
    start(data, isBinary).catch((e) => {
      ctx.onError?.(e);
      socket.close(1011, 'internal');
    });
  });
  socket.on('close', () => {
    closed = true;
    if (session) abandonSession(session);
  });
}

function parseFrame<T extends z.ZodType>(schema: T, data: Buffer): { value: z.infer<T> } | { error: string; issues?: Array<{ path: string; message: string }> } {
  let json: unknown;
  try {
    json = JSON.parse(data.toString('utf8'));
  } catch {
    return { error: 'a text message must be a JSON frame' };
  }
  const r = schema.safeParse(json);
  if (r.success) return { value: r.data };
  const issues = zodIssues(r.error);
  return { error: `invalid frame: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, issues };
}
