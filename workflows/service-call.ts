/**
 * One sandbox service call (exec or a file call) run on the sandbox's owner, for an API host that
 * is not the owner (docs/adr/0013-worker-ownership.md, "Sandbox service calls through the owner").
 * A short workflow on the API process's own queue (`<service queue>@<its worker id>`, so a
 * dead owner cannot also take the workflow's own worker with it), not an Update on `sandbox:<id>`: calls are not lifecycle
 * transitions and must not grow the sandbox workflow's history. One attempt (an exec is not
 * idempotent); an owner that takes nothing up within the grace time fails the call with a
 * schedule-to-start timeout, which the API answers with 503.
 */
import { proxyActivities } from '@temporalio/workflow';
import { routeFor } from '../core/routing';
import type { OwnerExecInput, OwnerExecResult, SandboxCallActivities } from '../activities/service/calls';
import type { FileEntry } from '../activities/sandbox/file-io';

export type SandboxServiceCall =
  | { op: 'exec'; input: OwnerExecInput }
  | { op: 'readFile'; input: Parameters<SandboxCallActivities['ownerReadFile']>[0] }
  | { op: 'writeFile'; input: Parameters<SandboxCallActivities['ownerWriteFile']>[0] }
  | { op: 'deleteFile'; input: Parameters<SandboxCallActivities['ownerDeleteFile']>[0] }
  | { op: 'listFiles'; input: Parameters<SandboxCallActivities['ownerListFiles']>[0] };

export interface SandboxServiceCallInput {
  /** The service task queue; the call runs on its owner's queue `<serviceQueue>@<owner>`. */
  serviceQueue: string;
  owner: string;
  graceSeconds: number;
  call: SandboxServiceCall;
}

export type SandboxServiceCallResult = { exec: OwnerExecResult } | { base64: string } | { done: true } | { entries: FileEntry[] };

export async function sandboxServiceCallWorkflow(input: SandboxServiceCallInput): Promise<SandboxServiceCallResult> {
  const route = routeFor(input.serviceQueue, input.owner, { graceSeconds: input.graceSeconds });
  const timeoutMs = input.call.op === 'exec' ? input.call.input.timeoutMs + 60_000 : 120_000;
  const acts = proxyActivities<SandboxCallActivities>({
    taskQueue: route.taskQueue,
    // A dead owner takes nothing up: the call fails after the grace time instead of waiting for it.
    scheduleToStartTimeout: route.scheduleToStartTimeoutMs,
    startToCloseTimeout: timeoutMs,
    // Exec heartbeats (a dead owner mid-command shows within this); file calls are short and do not.
    ...(input.call.op === 'exec' ? { heartbeatTimeout: '30 seconds' } : {}),
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
  }
}
