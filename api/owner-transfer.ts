/**
 * What goes through a remote owner in pieces (ADR 0026): file bodies in chunks of
 * REMOTE_OWNER_CHUNK_BYTES, one call each, and a streamed exec's output as the command prints it.
 * Each piece is one call workflow (workflows/service-call.ts) run by SandboxService.onOwner, so
 * no payload comes near Temporal's 2 MB cap and no history near its 50 MB limit.
 */
import { createHash, randomUUID } from 'node:crypto';
import { PassThrough, Readable, Writable } from 'node:stream';
import type { WorkflowHandle } from '@temporalio/client';
import { REMOTE_OWNER_CHUNK_BYTES } from '../core/routing';
import type { StreamedExecEnd, StreamedOutputChunk } from '../core/sandbox-service';
import type { SandboxSession, SessionExit } from '../activities/sandbox/provider';
import type { OpenedFile } from '../activities/sandbox/file-io';
import type { OwnerExecInput } from '../activities/service/calls';
import { takeExecOutputUpdate, type SandboxServiceCall, type SandboxServiceCallResult } from '../workflows/service-call';

/** Chunk calls in flight at once for one file: enough to hide a call's round trip, few enough not to crowd the owner's activity slots. */
export const CHUNKS_IN_FLIGHT = 4;

type RunOnOwner = (call: SandboxServiceCall) => Promise<SandboxServiceCallResult>;

/**
 * A file read through the owner: the first chunk is fetched before answering (so a missing or
 * too large file is a plain 4xx), the rest while the client reads, up to CHUNKS_IN_FLIGHT ahead.
 * Every chunk must come from the version the first one saw (else the stream fails).
 */
export async function readThroughOwner(run: RunOnOwner, input: { root: string; path: string; maxBytes: number; allowHardLinks: boolean }): Promise<OpenedFile> {
  const chunkAt = async (offset: number, version?: string) => {
    const result = await run({ op: 'readChunk', input: { ...input, offset, ...(version !== undefined ? { version } : {}) } });
    return (result as { chunk: { base64: string; size: number; version: string } }).chunk;
  };
  const first = await chunkAt(0);
  const body = Buffer.from(first.base64, 'base64');
  if (first.size <= body.length) return { size: first.size, stream: Readable.from([body]), version: first.version };
  const offsets: number[] = [];
  for (let at = body.length; at < first.size; at += REMOTE_OWNER_CHUNK_BYTES) offsets.push(at);
  async function* rest(): AsyncGenerator<Buffer> {
    yield body;
    const ahead: Array<Promise<{ base64: string }>> = [];
    let next = 0;
    const fill = () => {
      while (ahead.length < CHUNKS_IN_FLIGHT && next < offsets.length) {
        const p = chunkAt(offsets[next++]!, first.version);
        p.catch(() => undefined); // awaited in order below; a stream given up early must not leave an unhandled rejection
        ahead.push(p);
      }
    };
    fill();
    while (ahead.length > 0) {
      const chunk = Buffer.from((await ahead.shift()!).base64, 'base64');
      fill();
      yield chunk;
    }
  }
  return { size: first.size, stream: Readable.from(rest()), version: first.version };
}

/**
 * A file written through the owner: one call when it fits in a chunk; else chunks staged on the
 * owner (CHUNKS_IN_FLIGHT at once) and committed with the body's size and sha256, which writes
 * it into the sandbox in one rename. Any failure drops the staged chunks: nothing half-written.
 */
export async function writeThroughOwner(run: RunOnOwner, input: { root: string; path: string; content: Buffer }): Promise<void> {
  const { root, path, content } = input;
  if (content.length <= REMOTE_OWNER_CHUNK_BYTES) {
    await run({ op: 'writeFile', input: { root, path, base64: content.toString('base64') } });
    return;
  }
  const upload = randomUUID();
  const offsets: number[] = [];
  for (let at = 0; at < content.length; at += REMOTE_OWNER_CHUNK_BYTES) offsets.push(at);
  try {
    let next = 0;
    const lane = async () => {
      while (next < offsets.length) {
        const offset = offsets[next++]!;
        const base64 = content.subarray(offset, offset + REMOTE_OWNER_CHUNK_BYTES).toString('base64');
        await run({ op: 'writeChunk', input: { upload, offset, base64 } });
      }
    };
    await Promise.all(Array.from({ length: Math.min(CHUNKS_IN_FLIGHT, offsets.length) }, lane));
    await run({ op: 'commitUpload', input: { root, path, upload, size: content.length, sha256: createHash('sha256').update(content).digest('hex') } });
  } catch (e) {
    await run({ op: 'abortUpload', input: { upload } }).catch(() => undefined);
    throw e;
  }
}

/**
 * A streamed exec on a remote owner as a SandboxSession, so the NDJSON relay serves it as any
 * other: the output the owner signals into the call workflow comes out by long-poll updates.
 * The command starts (and `open` resolves) before the first frame is sent, so a bad cwd, a gone
 * sandbox or a gone owner is still an HTTP error. No stdin after the start (given in `input`),
 * no terminal: a streamed exec with a pty, and every interactive session, goes over the owner's
 * tunnel instead (api/owner-tunnel.ts).
 */
export async function openStreamThroughOwner(
  start: (call: SandboxServiceCall) => Promise<WorkflowHandle>,
  failure: (e: unknown) => Promise<unknown>,
  input: OwnerExecInput,
): Promise<SandboxSession> {
  const handle = await start({ op: 'execStream', input });
  const take: Take = (after, untilStarted = false) => handle.executeUpdate(takeExecOutputUpdate, { args: [{ after, untilStarted }] });
  // An update fails once the call failed (the owner gone, a bad cwd): the call's own failure says why.
  const explain = async (e: unknown) => {
    let timer: NodeJS.Timeout | undefined;
    const cause = await Promise.race([
      handle.result().then(() => e, (failed: unknown) => failed),
      new Promise((r) => (timer = setTimeout(() => r(e), 30_000))),
    ]).finally(() => clearTimeout(timer));
    return failure(cause);
  };
  try {
    // Waits for the command to start (or end, or fail to start).
    let first = await take(0, true);
    while (!first.started && first.end === undefined) first = await take(0, true);
    return new OwnerStreamSession(handle, take, first, explain);
  } catch (e) {
    const answer = await explain(e);
    await handle.cancel().catch(() => undefined);
    throw answer;
  }
}

interface Taken {
  chunks: StreamedOutputChunk[];
  started: boolean;
  end?: StreamedExecEnd;
}
type Take = (after: number, untilStarted?: boolean) => Promise<Taken>;

export class OwnerStreamSession implements SandboxSession {
  readonly pid = undefined;
  readonly pty = false;
  readonly stdin = new Writable({ write: (_c, _e, cb) => cb() });
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  readonly exit: Promise<SessionExit>;
  private ended = false;

  constructor(
    private readonly handle: WorkflowHandle,
    take: Take,
    first: Taken,
    explain: (e: unknown) => Promise<unknown>,
  ) {
    this.exit = this.pump(take, first, explain);
  }

  private async pump(take: Take, first: Taken, explain: (e: unknown) => Promise<unknown>): Promise<SessionExit> {
    let batch = first;
    let after = 0;
    try {
      for (;;) {
        for (const c of batch.chunks) {
          after = c.seq;
          const out = c.stream === 'stdout' ? this.stdout : this.stderr;
          // The relay pauses our readable side when its client is slow: wait here, so the owner's output waits in the workflow.
          if (!out.write(Buffer.from(c.base64, 'base64'))) await new Promise((r) => out.once('drain', r));
        }
        if (batch.end) return { exitCode: batch.end.exitCode, signal: batch.end.signal as NodeJS.Signals | null };
        if (this.ended) return { exitCode: null, signal: 'SIGKILL' };
        batch = await take(after);
      }
    } catch (e) {
      if (this.ended) return { exitCode: null, signal: 'SIGKILL' };
      // Headers are sent: the failure (the owner gone mid-command, ...) is told on stderr, and the exit has no code.
      const answer = await explain(e);
      this.stderr.write(`\nslipway: ${(answer as Error)?.message ?? String(answer)}\n`);
      return { exitCode: null, signal: null };
    } finally {
      this.stdout.end();
      this.stderr.end();
    }
  }

  resize(): void {}

  signal(sig: NodeJS.Signals): void {
    if (sig === 'SIGKILL' || sig === 'SIGTERM' || sig === 'SIGINT') this.kill();
  }

  /** Cancels the call: the owner's activity is cancelled at its next heartbeat and kills the command. */
  kill(): void {
    if (this.ended) return;
    this.ended = true;
    void this.handle.cancel().catch(() => undefined);
  }
}
