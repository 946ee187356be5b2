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
import { promises as fs } from 'node:fs';
import { ApplicationFailure } from '@temporalio/common';
import { REMOTE_OWNER_PAYLOAD_LIMIT_BYTES } from '../../core/routing';
import type { SandboxPolicy } from '../../core/sandbox-service';
import { withHeartbeat } from '../heartbeat';
import { deleteSandboxFile, FileTooLargeError, listSandboxDir, NotRegularFileError, openSandboxFile, RESERVED_NAMES, writeSandboxFile, type FileEntry } from '../sandbox/file-io';
import { PathEscapeError, resolveInside } from '../sandbox/paths';
import type { ProviderFor } from './providers';

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

export function createSandboxCallActivities(deps: { providerFor: ProviderFor }) {
  return {
    /** Runs one command in the sandbox; stdout and stderr are each capped at half the remote payload limit. */
    async ownerExec(input: OwnerExecInput): Promise<OwnerExecResult> {
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

    async ownerDeleteFile(input: { root: string; path: string }): Promise<void> {
      await deleteSandboxFile(input.root, input.path, FILES_API).catch(asFailure);
    },

    async ownerListFiles(input: { root: string; path: string }): Promise<FileEntry[]> {
      return listSandboxDir(input.root, input.path, FILES_API).catch(asFailure);
    },
  };
}

export type SandboxCallActivities = ReturnType<typeof createSandboxCallActivities>;
