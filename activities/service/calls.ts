/**
 * The sandbox service's exec and file calls as activities, run on the sandbox's owner (its own
 * task queue `<service queue>@<worker id>`, ADR 0013 "Sandbox service calls through the owner")
 * when `slipway api` is on another host. The API has already admitted the call (account, state,
 * wake) and computed the command's environment; these run the same provider and file-io code as
 * the direct path, with output and file bodies capped at the remote payload limit.
 *
 * Errors travel as non-retryable ApplicationFailures whose type is the error's class name or
 * errno code (`serviceCallErrorType`), so the API answers them with the same status as directly.
 */
import { createHash } from 'node:crypto';
import { constants, createReadStream, promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { REMOTE_OWNER_CHUNK_BYTES, REMOTE_OWNER_PAYLOAD_LIMIT_BYTES, REMOTE_OWNER_STREAM_LIMIT_BYTES } from '../../core/routing';
import { EXEC_OUTPUT_SIGNAL, type SandboxPolicy, type StreamedExecEnd, type StreamedOutputChunk } from '../../core/sandbox-service';
import { withHeartbeat } from '../heartbeat';
import { deleteSandboxFile, FileTooLargeError, listSandboxDir, NotRegularFileError, openSandboxFile, RESERVED_NAMES, writeSandboxFile, type FileEntry } from '../sandbox/file-io';
import { PathEscapeError, resolveInside } from '../sandbox/paths';
import { finished } from 'node:stream/promises';
import type { ProviderFor } from './providers';
import type WebSocket from 'ws';
import { bridgePort, bridgeSession, dialTunnel, type TunnelEnd, type TunnelTarget } from './tunnel';

const FILES_API = { reservedNames: RESERVED_NAMES };

export interface OwnerExecInput {
  root: string;
  policy: SandboxPolicy;
  command: string;
  args: string[];
  env: Record<string, string>;
  cwd?: string;
  stdin?: string;
  timeoutMs: number;
}

export interface OwnerExecResult {
  exitCode: number | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  durationMs: number;
}

/** The failure type the API maps back to an HTTP answer: a class name (PathEscapeError, ...) or an errno code. */
export function serviceCallErrorType(e: unknown): string {
  if (e instanceof FileTooLargeError) return 'FileTooLargeError';
  if (e instanceof NotRegularFileError) return 'NotRegularFileError';
  if (e instanceof PathEscapeError) return 'PathEscapeError';
  const err = e as NodeJS.ErrnoException;
  if (typeof err?.code === 'string') return err.code;
  return err?.name && err.name !== 'Error' ? err.name : 'internal_error';
}

const asFailure = (e: unknown): never => {
  if (e instanceof ApplicationFailure) throw e;
  throw ApplicationFailure.nonRetryable((e as Error)?.message ?? String(e), serviceCallErrorType(e));
};

/** The sandbox is still here and the command's cwd is a folder in it, as the direct path checks. */
async function checkExecPlace(input: Pick<OwnerExecInput, 'root' | 'cwd'>): Promise<void> {
  try {
    await fs.access(input.root);
  } catch {
    throw ApplicationFailure.nonRetryable('the sandbox directory is gone', 'sandbox_gone');
  }
  if (input.cwd !== undefined) {
    const resolved = await resolveInside(input.root, input.cwd).catch(asFailure);
    const st = await fs.stat(resolved).catch(() => undefined);
    if (!st?.isDirectory()) throw ApplicationFailure.nonRetryable(st ? 'not a folder' : 'no such folder', 'invalid_cwd');
  }
}

/** A chunked upload's id: made by the API (a UUID), and the staged file's name on the owner. */
const UPLOAD_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** Staged uploads older than this are from an API that went away mid-upload: removed at the next upload's start. */
const STALE_UPLOAD_MS = 60 * 60_000;

/**
 * Where chunked uploads are staged on the owner until their last chunk came: a private folder
 * (0700) of this process outside every sandbox, so a tenant never sees or swaps a half-written
 * file; the commit writes it into the sandbox with the files API's own checks and rename.
 */
let uploadsDir: Promise<string> | undefined;
const stagingDir = () => (uploadsDir ??= fs.mkdtemp(path.join(os.tmpdir(), 'slipway-uploads-')));
async function stagedPath(upload: string): Promise<string> {
  if (!UPLOAD_ID.test(upload)) throw ApplicationFailure.nonRetryable(`invalid upload id "${upload.slice(0, 64)}"`, 'invalid_upload');
  return path.join(await stagingDir(), upload);
}

async function sweepStaleUploads(): Promise<void> {
  const dir = await stagingDir();
  for (const name of await fs.readdir(dir).catch(() => [] as string[])) {
    const st = await fs.stat(path.join(dir, name)).catch(() => undefined);
    if (st && Date.now() - st.mtimeMs > STALE_UPLOAD_MS) await fs.rm(path.join(dir, name), { force: true });
  }
}

export function createSandboxCallActivities(deps: { providerFor: ProviderFor; /** Authenticates owner tunnels (tunnel.ts); absent: sessions through this owner are refused. */ tunnelKey?: Buffer }) {
  return {
    /** Runs one command in the sandbox; stdout and stderr are each capped at half the remote payload limit. */
    async ownerExec(input: OwnerExecInput): Promise<OwnerExecResult> {
      await checkExecPlace(input);
      return withHeartbeat(async (signal) => {
        const run = await deps
          .providerFor(input.policy)
          .exec(
            { root: input.root },
            {
              command: input.command,
              args: input.args,
              env: input.env,
              inheritEnv: false,
              cwd: input.cwd,
              stdin: input.stdin,
              timeoutMs: input.timeoutMs,
              maxCaptureBytes: REMOTE_OWNER_PAYLOAD_LIMIT_BYTES / 2,
              signal,
            },
          )
          .catch(asFailure);
        return { exitCode: run.exitCode, stdout: run.stdout, stderr: run.stderr, timedOut: run.timedOut, durationMs: run.durationMs };
      });
    },

    /** A file's body, base64 (history carries JSON); over `maxBytes` it is a FileTooLargeError. */
    async ownerReadFile(input: { root: string; path: string; maxBytes: number; allowHardLinks: boolean }): Promise<{ base64: string }> {
      try {
        const opened = await openSandboxFile(input.root, input.path, { ...FILES_API, maxBytes: Math.min(input.maxBytes, REMOTE_OWNER_PAYLOAD_LIMIT_BYTES), allowHardLinks: input.allowHardLinks });
        const chunks: Buffer[] = [];
        for await (const chunk of opened.stream) chunks.push(chunk as Buffer);
        return { base64: Buffer.concat(chunks).toString('base64') };
      } catch (e) {
        return asFailure(e);
      }
    },

    async ownerWriteFile(input: { root: string; path: string; base64: string }): Promise<void> {
      await writeSandboxFile(input.root, input.path, Buffer.from(input.base64, 'base64'), FILES_API).catch(asFailure);
    },

    /**
     * One chunk of a file (`offset`, at most REMOTE_OWNER_CHUNK_BYTES), opened with the files
     * API's checks every time. `version`: the version the first chunk reported; a file changed
     * since is a `file_changed` failure, so a read never mixes two versions.
     */
    async ownerReadChunk(input: { root: string; path: string; offset: number; maxBytes: number; allowHardLinks: boolean; version?: string }): Promise<{ base64: string; size: number; version: string }> {
      try {
        const opened = await openSandboxFile(input.root, input.path, { ...FILES_API, maxBytes: input.maxBytes, allowHardLinks: input.allowHardLinks, range: { start: input.offset, length: REMOTE_OWNER_CHUNK_BYTES } });
        if (input.version !== undefined && opened.version !== input.version) {
          opened.stream.destroy();
          throw ApplicationFailure.nonRetryable(`"${input.path}" changed while it was being read`, 'file_changed');
        }
        const chunks: Buffer[] = [];
        for await (const chunk of opened.stream) chunks.push(chunk as Buffer);
        return { base64: Buffer.concat(chunks).toString('base64'), size: opened.size, version: opened.version ?? '' };
      } catch (e) {
        return asFailure(e);
      }
    },

    /** Writes one chunk of an upload at its offset into the owner's staging file (nothing in the sandbox yet). */
    async ownerWriteChunk(input: { upload: string; offset: number; base64: string }): Promise<void> {
      const staged = await stagedPath(input.upload);
      if (input.offset === 0) await sweepStaleUploads();
      const bytes = Buffer.from(input.base64, 'base64');
      if (bytes.length > REMOTE_OWNER_CHUNK_BYTES) throw ApplicationFailure.nonRetryable(`a chunk may hold at most ${REMOTE_OWNER_CHUNK_BYTES} bytes`, 'invalid_upload');
      // Not O_APPEND: Linux ignores a positional write's offset under it.
      const fh = await fs.open(staged, constants.O_WRONLY | constants.O_CREAT | constants.O_NOFOLLOW, 0o600).catch(asFailure);
      try {
        await fh.write(bytes, 0, bytes.length, input.offset);
      } catch (e) {
        return asFailure(e);
      } finally {
        await fh.close();
      }
    },

    /**
     * Ends an upload: the staged file must have exactly the size and sha256 the API received
     * (else `upload_incomplete`, nothing written); then it goes into the sandbox as one file
     * (temporary name, rename), and the staged copy is removed either way.
     */
    async ownerCommitUpload(input: { root: string; path: string; upload: string; size: number; sha256: string }): Promise<void> {
      const staged = await stagedPath(input.upload);
      try {
        const st = await fs.stat(staged).catch(() => undefined);
        const hash = st?.size === input.size ? createHash('sha256') : undefined;
        if (hash) for await (const chunk of createReadStream(staged)) hash.update(chunk as Buffer);
        if (!st || st.size !== input.size || hash!.digest('hex') !== input.sha256) {
          throw ApplicationFailure.nonRetryable(`the upload of "${input.path}" is incomplete on the owner (${st?.size ?? 0} of ${input.size} bytes)`, 'upload_incomplete');
        }
        await writeSandboxFile(input.root, input.path, createReadStream(staged), FILES_API).catch(asFailure);
      } finally {
        await fs.rm(staged, { force: true });
      }
    },

    /** Drops an upload that will not be committed (the client went away, a chunk failed). */
    async ownerAbortUpload(input: { upload: string }): Promise<void> {
      await fs.rm(await stagedPath(input.upload), { force: true });
    },

    /**
     * A streamed exec (ADR 0026): runs the command as a session and sends its output to this
     * call's workflow as it comes (EXEC_OUTPUT_SIGNAL, batched for up to 20 ms or 256 KiB), the
     * first signal, empty, once the command has started. Output past REMOTE_OWNER_STREAM_LIMIT_BYTES
     * is read and dropped (the command never blocks on it) and a last stderr line says so.
     */
    async ownerExecStream(input: OwnerExecInput): Promise<StreamedExecEnd> {
      await checkExecPlace(input);
      const ctx = Context.current();
      const workflowId = ctx.info.workflowExecution?.workflowId;
      if (!workflowId) throw ApplicationFailure.nonRetryable('a streamed exec runs only for a call workflow', 'invalid_call');
      const call = ctx.client.workflow.getHandle(workflowId);
      return withHeartbeat(async (signal) => {
        const started = Date.now();
        const session = await deps
          .providerFor(input.policy)
          .openSession({ root: input.root }, { command: input.command, args: input.args, env: input.env, inheritEnv: false, cwd: input.cwd })
          .catch(asFailure);
        let timedOut = false;
        const timer = setTimeout(() => {
          timedOut = true;
          session.kill();
        }, input.timeoutMs);
        const onAbort = () => session.kill();
        signal?.addEventListener('abort', onAbort, { once: true });
        let seq = 0;
        let sentBytes = 0;
        let dropped = 0;
        let pending: StreamedOutputChunk[] = [];
        let pendingBytes = 0;
        let flushTimer: NodeJS.Timeout | undefined;
        let sending: Promise<void> = Promise.resolve();
        let sendFailed: unknown;
        const flush = (force = false) => {
          clearTimeout(flushTimer);
          flushTimer = undefined;
          if (pending.length === 0 && !force) return;
          const batch = pending;
          pending = [];
          pendingBytes = 0;
          sending = sending.then(() =>
            call.signal(EXEC_OUTPUT_SIGNAL, batch).catch((e: unknown) => {
              // The call is gone (the API cancelled it): nobody reads on, so the command ends.
              sendFailed ??= e;
              session.kill();
            }),
          );
        };
        const take = (stream: 'stdout' | 'stderr') => (chunk: Buffer) => {
          const room = Math.max(0, REMOTE_OWNER_STREAM_LIMIT_BYTES - sentBytes);
          if (chunk.length > room) {
            dropped += chunk.length - room;
            chunk = chunk.subarray(0, room);
          }
          if (chunk.length === 0) return;
          sentBytes += chunk.length;
          pending.push({ seq: ++seq, stream, base64: chunk.toString('base64') });
          pendingBytes += chunk.length;
          if (pendingBytes >= 256 * 1024) flush();
          else flushTimer ??= setTimeout(flush, 20);
        };
        session.stdout.on('data', take('stdout'));
        session.stderr.on('data', take('stderr'));
        session.stdin.on('error', () => undefined);
        flush(true);
        if (input.stdin) session.stdin.write(Buffer.from(input.stdin));
        session.stdin.end();
        try {
          const [exit] = await Promise.all([session.exit, finished(session.stdout).catch(() => undefined), finished(session.stderr).catch(() => undefined)]);
          if (dropped > 0) {
            const note = Buffer.from(`\nslipway: ${dropped} bytes of output past ${REMOTE_OWNER_STREAM_LIMIT_BYTES} were dropped (a sandbox on another host streams at most that much)\n`);
            pending.push({ seq: ++seq, stream: 'stderr', base64: note.toString('base64') });
          }
          flush();
          await sending;
          if (sendFailed) throw sendFailed;
          return { exitCode: exit.exitCode, signal: exit.signal, timedOut, durationMs: Date.now() - started };
        } finally {
          clearTimeout(timer);
          clearTimeout(flushTimer);
          signal?.removeEventListener('abort', onAbort);
        }
      });
    },

    async ownerDeleteFile(input: { root: string; path: string }): Promise<void> {
      await deleteSandboxFile(input.root, input.path, FILES_API).catch(asFailure);
    },

    async ownerListFiles(input: { root: string; path: string }): Promise<FileEntry[]> {
      return listSandboxDir(input.root, input.path, FILES_API).catch(asFailure);
    },

    /**
     * An interactive session or a preview connection for an API host on another host
     * (docs/adr/0028): opened here with the same provider code as the direct path, then bridged
     * over a WebSocket this worker dials to that API process. Ends with the command (or the
     * connection); a cancelled call (the client went away) kills it at the next heartbeat.
     */
    async ownerTunnel(input: OwnerTunnelInput): Promise<TunnelEnd> {
      const key = deps.tunnelKey;
      if (!key) throw ApplicationFailure.nonRetryable('this worker has no SLIPWAY_PAYLOAD_KEY, which owner tunnels are authenticated with', 'tunnel_unavailable');
      const { target } = input;
      await checkExecPlace({ root: input.root, cwd: target.kind === 'session' ? target.cwd : undefined });
      return withHeartbeat(async (signal) => {
        const provider = deps.providerFor(input.policy);
        let close: () => void;
        let bridge: (ws: WebSocket) => Promise<TunnelEnd>;
        if (target.kind === 'session') {
          const session = await provider
            .openSession({ root: input.root }, { command: target.command, args: target.args, env: target.env, inheritEnv: false, cwd: target.cwd, ...(target.pty ? { pty: target.pty } : {}) })
            .catch(asFailure);
          close = () => session.kill();
          bridge = (ws) => bridgeSession(ws, session);
        } else {
          if (!provider.connectPort) throw ApplicationFailure.nonRetryable(`the ${provider.kind} provider cannot reach sandbox ports`, 'previews_unsupported');
          const stream = await provider.connectPort({ root: input.root }, target.port).catch(asFailure);
          close = () => stream.destroy();
          bridge = (ws) => bridgePort(ws, stream);
        }
        let ws: WebSocket;
        let bridged: Promise<TunnelEnd> | undefined;
        try {
          // The bridge starts inside the open event, so the API's first frames are not missed (dialTunnel).
          ws = await dialTunnel(input.apiUrl, input.tunnelId, key, (open) => (bridged = bridge(open)));
        } catch (e) {
          close();
          throw ApplicationFailure.nonRetryable(`cannot reach the API host at ${input.apiUrl}: ${(e as Error).message}`, 'tunnel_unreachable');
        }
        const onAbort = () => {
          close();
          ws.terminate();
        };
        signal?.addEventListener('abort', onAbort, { once: true });
        try {
          return await bridged!;
        } finally {
          signal?.removeEventListener('abort', onAbort);
        }
      });
    },
  };
}

export interface OwnerTunnelInput {
  root: string;
  policy: SandboxPolicy;
  /** Names the tunnel at the API host; its proof is derived, never carried (tunnel.ts). */
  tunnelId: string;
  /** Where this worker reaches the API process that asked (its `--tunnel-url`). */
  apiUrl: string;
  target: TunnelTarget;
}

export type SandboxCallActivities = ReturnType<typeof createSandboxCallActivities>;
