/**
 * One sandbox service call (exec or a file call) run on the sandbox's owner, for an API host that
 * is not the owner (docs/adr/0013-worker-ownership.md, "Sandbox service calls through the owner").
 * A short workflow on the API process's own queue (`<service queue>@<its worker id>`, so a
 * dead owner cannot also take the workflow's own worker with it), not an Update on `sandbox:<id>`: calls are not lifecycle
 * transitions and must not grow the sandbox workflow's history. One attempt (an exec is not
 * idempotent); an owner that takes nothing up within the grace time fails the call with a
 * schedule-to-start timeout, which the API answers with 503.
 */
import { allHandlersFinished, condition, defineSignal, defineUpdate, proxyActivities, setHandler } from '@temporalio/workflow';
import { REMOTE_OWNER_CHUNK_BYTES, routeFor } from '../core/routing';
import { EXEC_OUTPUT_SIGNAL, TAKE_EXEC_OUTPUT_UPDATE, type StreamedExecEnd, type StreamedOutputChunk } from '../core/sandbox-service';
import type { OwnerExecInput, OwnerExecResult, OwnerTunnelInput, SandboxCallActivities } from '../activities/service/calls';
import type { TunnelEnd } from '../activities/service/tunnel';
import type { FileEntry } from '../activities/sandbox/file-io';

/** The owner's activity sends a streamed exec's output here (an empty batch: the command started). */
export const execOutputSignal = defineSignal<[StreamedOutputChunk[]]>(EXEC_OUTPUT_SIGNAL);

/**
 * The API's long poll for a streamed exec's output: returns the oldest chunks after `after` once
 * there are any (or, with `untilStarted`, once the command started), at most about
 * REMOTE_OWNER_CHUNK_BYTES of them, with `end` once the command ended and this answer holds the
 * last chunk; an empty answer after a minute of silence (the API asks again).
 */
export const takeExecOutputUpdate = defineUpdate<{ chunks: StreamedOutputChunk[]; started: boolean; end?: StreamedExecEnd }, [{ after: number; untilStarted?: boolean }]>(TAKE_EXEC_OUTPUT_UPDATE);

/** The longest a session or preview connection through a remote owner stays open. */
const TUNNEL_MAX_MS = 24 * 60 * 60 * 1000;

export type SandboxServiceCall =
  | { op: 'exec'; input: OwnerExecInput }
  | { op: 'readFile'; input: Parameters<SandboxCallActivities['ownerReadFile']>[0] }
  | { op: 'writeFile'; input: Parameters<SandboxCallActivities['ownerWriteFile']>[0] }
  | { op: 'deleteFile'; input: Parameters<SandboxCallActivities['ownerDeleteFile']>[0] }
  | { op: 'listFiles'; input: Parameters<SandboxCallActivities['ownerListFiles']>[0] }
  // Chunked file calls and streamed exec (ADR 0026).
  | { op: 'readChunk'; input: Parameters<SandboxCallActivities['ownerReadChunk']>[0] }
  | { op: 'writeChunk'; input: Parameters<SandboxCallActivities['ownerWriteChunk']>[0] }
  | { op: 'commitUpload'; input: Parameters<SandboxCallActivities['ownerCommitUpload']>[0] }
  | { op: 'abortUpload'; input: Parameters<SandboxCallActivities['ownerAbortUpload']>[0] }
  | { op: 'execStream'; input: OwnerExecInput }
  // An interactive session or a preview connection: bytes go over the owner's tunnel, not history (ADR 0028).
  | { op: 'tunnel'; input: OwnerTunnelInput };

export interface SandboxServiceCallInput {
  /** The service task queue; the call runs on its owner's queue `<serviceQueue>@<owner>`. */
  serviceQueue: string;
  owner: string;
  graceSeconds: number;
  call: SandboxServiceCall;
}

export type SandboxServiceCallResult =
  | { exec: OwnerExecResult }
  | { base64: string }
  | { done: true }
  | { chunk: { base64: string; size: number; version: string } }
  | { streamEnd: StreamedExecEnd }
  | { entries: FileEntry[] }
  | { tunnelEnd: TunnelEnd };

export async function sandboxServiceCallWorkflow(input: SandboxServiceCallInput): Promise<SandboxServiceCallResult> {
  const route = routeFor(input.serviceQueue, input.owner, { graceSeconds: input.graceSeconds });
  const execLike = input.call.op === 'exec' || input.call.op === 'execStream' || input.call.op === 'tunnel';
  // A tunnel lasts as long as its session or connection (ended by its client, or cancelled).
  const timeoutMs = input.call.op === 'exec' || input.call.op === 'execStream' ? input.call.input.timeoutMs + 60_000 : input.call.op === 'tunnel' ? TUNNEL_MAX_MS : 120_000;
  const acts = proxyActivities<SandboxCallActivities>({
    taskQueue: route.taskQueue,
    // A dead owner takes nothing up: the call fails after the grace time instead of waiting for it.
    scheduleToStartTimeout: route.scheduleToStartTimeoutMs,
    startToCloseTimeout: timeoutMs,
    // Exec heartbeats (a dead owner mid-command shows within this); file calls are short and do not.
    ...(execLike ? { heartbeatTimeout: '30 seconds' } : {}),
    retry: { maximumAttempts: 1 },
  });
  const { call } = input;
  switch (call.op) {
    case 'exec':
      return { exec: await acts.ownerExec(call.input) };
    case 'readFile':
      return acts.ownerReadFile(call.input);
    case 'writeFile':
      await acts.ownerWriteFile(call.input);
      return { done: true };
    case 'deleteFile':
      await acts.ownerDeleteFile(call.input);
      return { done: true };
    // A new op, not a change to an existing one's commands: released histories replay as before.
    case 'listFiles':
      return { entries: await acts.ownerListFiles(call.input) };
    case 'readChunk':
      return { chunk: await acts.ownerReadChunk(call.input) };
    case 'writeChunk':
      await acts.ownerWriteChunk(call.input);
      return { done: true };
    case 'commitUpload':
      await acts.ownerCommitUpload(call.input);
      return { done: true };
    case 'abortUpload':
      await acts.ownerAbortUpload(call.input);
      return { done: true };
    case 'execStream':
      return { streamEnd: await streamedExec(acts, call.input) };
    case 'tunnel':
      return { tunnelEnd: await acts.ownerTunnel(call.input) };
  }
}

/**
 * A streamed exec: the owner's activity signals output in; the API takes it out by update.
 * Taken chunks are dropped from memory; the workflow ends once the API took the end (or, if it
 * went away without cancelling, after ten minutes).
 */
async function streamedExec(acts: SandboxCallActivities, input: OwnerExecInput): Promise<StreamedExecEnd> {
  let chunks: StreamedOutputChunk[] = [];
  let started = false;
  let end: StreamedExecEnd | undefined;
  let endTaken = false;
  setHandler(execOutputSignal, (batch) => {
    started = true;
    chunks.push(...batch);
  });
  setHandler(takeExecOutputUpdate, async ({ after, untilStarted }) => {
    const ready = () => chunks.some((c) => c.seq > after) || end !== undefined || (untilStarted === true && started);
    await condition(ready, '1 minute');
    chunks = chunks.filter((c) => c.seq > after);
    // One answer stays a small payload (Temporal fails a workflow task over 2 MB): the oldest
    // chunks up to REMOTE_OWNER_CHUNK_BYTES of base64, at least one; the API asks again for the rest.
    let size = 0;
    let count = 0;
    while (count < chunks.length && (count === 0 || size + chunks[count]!.base64.length <= REMOTE_OWNER_CHUNK_BYTES)) size += chunks[count++]!.base64.length;
    const taken = chunks.slice(0, count);
    // Every signal of the owner came before its activity's result: with `end` set and all taken, that is all there is.
    const last = end !== undefined && count === chunks.length;
    if (last) endTaken = true;
    return { chunks: taken, started, ...(last ? { end } : {}) };
  });
  end = await acts.ownerExecStream(input);
  await condition(() => endTaken, '10 minutes');
  await condition(allHandlersFinished);
  return end;
}
