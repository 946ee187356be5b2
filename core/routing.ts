/**
 * Where an activity on a sandbox runs (docs/adr/0013-worker-ownership.md). Pure: the workflows
 * call it with their own task queue and the sandbox's recorded owner.
 */
import { ANY_OWNER, agentTaskQueue, ownerTaskQueue } from './ids';

/** How long an owner may be unreachable before its sandboxes are given up (SLIPWAY_OWNER_GRACE_SECONDS). */
export const DEFAULT_OWNER_GRACE_SECONDS = 180;

export interface ActivityRoute {
  /** Absent: the workflow's own (shared) queue. */
  taskQueue?: string;
  /**
   * Set on owner-routed activities: a task nobody picks up within the grace time fails with a
   * schedule-to-start timeout instead of waiting for a dead owner for its whole start-to-close.
   */
  scheduleToStartTimeoutMs?: number;
}

/**
 * The route of an activity on a sandbox owned by `owner` (a worker id, `any`, or unknown for
 * sandboxes recorded before ownership existed). `agents`: the agent-run queue of that owner.
 */
export function routeFor(mainQueue: string, owner: string | undefined, opts: { agents?: boolean; graceSeconds?: number; waitForOwner?: boolean } = {}): ActivityRoute {
  if (!owner || owner === ANY_OWNER) return opts.agents ? { taskQueue: agentTaskQueue(mainQueue) } : {};
  const queue = ownerTaskQueue(mainQueue, owner);
  const taskQueue = opts.agents ? agentTaskQueue(queue) : queue;
  // What cannot be made again elsewhere (the merger worktree in the user's repository) waits for its owner to come back.
  if (opts.waitForOwner) return { taskQueue };
  return { taskQueue, scheduleToStartTimeoutMs: (opts.graceSeconds ?? DEFAULT_OWNER_GRACE_SECONDS) * 1000 };
}

/** Sandboxes a stream may recreate because their owner was gone, before the failure goes to its recovery. */
export const MAX_SANDBOX_REPLACEMENTS = 3;

/**
 * After a step found its sandbox's owner gone: recreate the sandbox elsewhere and run the step
 * again, or (past the bound) hand the failure to the blueprint's recovery as any other.
 */
export function afterOwnerGone(replacementsSoFar: number): 'recreate' | 'give_up' {
  return replacementsSoFar < MAX_SANDBOX_REPLACEMENTS ? 'recreate' : 'give_up';
}

/**
 * Largest file body or exec output a service call may carry through a remote owner: it travels
 * in activity inputs/results, i.e. in history, which Temporal caps at 2 MB per payload.
 */
export const REMOTE_OWNER_PAYLOAD_LIMIT_BYTES = 1024 * 1024;

export type ServiceCallKind = 'exec' | 'file' | 'stream';

export type ServiceCallRoute =
  | { kind: 'direct' }
  | { kind: 'owner'; owner: string }
  | { kind: 'refuse'; status: 413 | 501; code: string; message: string };

/**
 * Where the sandbox service runs an exec or file call (docs/adr/0013-worker-ownership.md,
 * "Sandbox service calls"): on the API's own host when it owns the sandbox (or any host can reach
 * it), else on the owner. Streams (sessions, SSH, preview) cannot go through history and are
 * refused for remote owners; so are file bodies over the payload limit.
 */
export function serviceCallRoute(input: {
  owner: string | undefined;
  localWorkerId: string | undefined;
  call: ServiceCallKind;
  bytes?: number;
  limitBytes?: number;
  /** Payloads are encrypted (SLIPWAY_PAYLOAD_KEY): a remote call's command, environment and file contents travel through history. */
  historyEncrypted: boolean;
}): ServiceCallRoute {
  const { owner, localWorkerId, call } = input;
  if (!owner || owner === ANY_OWNER || owner === localWorkerId) return { kind: 'direct' };
  if (call === 'stream') {
    return { kind: 'refuse', status: 501, code: 'remote_owner_stream', message: `the sandbox is held by worker "${owner}" on another host; sessions, SSH and previews run only on the owner's host` };
  }
  // A tenant's environment, input and files must never sit in Temporal's history in the clear.
  if (!input.historyEncrypted) {
    return {
      kind: 'refuse',
      status: 501,
      code: 'remote_owner_needs_payload_key',
      message: `the sandbox is held by worker "${owner}" on another host; calls through it carry commands, environment and file contents through Temporal's history, which must be encrypted: set SLIPWAY_PAYLOAD_KEY (the same key) on the API and the workers`,
    };
  }
  const limit = input.limitBytes ?? REMOTE_OWNER_PAYLOAD_LIMIT_BYTES;
  if (call === 'file' && input.bytes !== undefined && input.bytes > limit) {
    return { kind: 'refuse', status: 413, code: 'file_too_large', message: `the file is ${input.bytes} bytes, over the limit of ${limit} bytes for a sandbox held by worker "${owner}" on another host` };
  }
  return { kind: 'owner', owner };
}
