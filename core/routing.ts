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
 * Largest exec output (each of stdout and stderr: half of it) or stdin a single service call may
 * carry through a remote owner: it travels in activity inputs/results, i.e. in history, which
 * Temporal caps at 2 MB per payload. File bodies go in chunks instead (REMOTE_OWNER_CHUNK_BYTES).
 */
export const REMOTE_OWNER_PAYLOAD_LIMIT_BYTES = 1024 * 1024;

/**
 * One chunk of a file read or written through a remote owner (ADR 0026): one call each, so a
 * file up to the files API's own limit travels without any payload near Temporal's 2 MB cap
 * (base64 makes 256 KiB about 350 kB, under the SDK's 512 KiB payload warning).
 */
export const REMOTE_OWNER_CHUNK_BYTES = 256 * 1024;

/**
 * Output a streamed exec may send through a remote owner (stdout and stderr together): each
 * byte enters the call workflow's history twice (the owner's signal and the API's update), and
 * a history must stay well under Temporal's 50 MB limit. Past it the rest is dropped and the
 * stream says so on stderr (ADR 0026).
 */
export const REMOTE_OWNER_STREAM_LIMIT_BYTES = 8 * 1024 * 1024;

/** `stream`: a streamed exec (output frames as it runs); `session`: an interactive byte stream (WebSocket, SSH, preview). */
export type ServiceCallKind = 'exec' | 'file' | 'stream' | 'session';

export type ServiceCallRoute =
  | { kind: 'direct' }
  | { kind: 'owner'; owner: string }
  | { kind: 'refuse'; status: 501; code: string; message: string };

/**
 * Where the sandbox service runs an exec, file or streamed-exec call (docs/adr/0013-worker-ownership.md,
 * "Sandbox service calls"; ADR 0026): on the API's own host when it owns the sandbox (or any host can
 * reach it), else on the owner. Interactive sessions (WebSocket, SSH, preview) go to the owner too,
 * their bytes over the owner's tunnel rather than history (ADR 0028); their command and
 * environment still travel in a call workflow, so they too need encrypted payloads.
 */
export function serviceCallRoute(input: {
  owner: string | undefined;
  localWorkerId: string | undefined;
  call: ServiceCallKind;
  /** Payloads are encrypted (SLIPWAY_PAYLOAD_KEY): a remote call's command, environment and file contents travel through history. */
  historyEncrypted: boolean;
}): ServiceCallRoute {
  const { owner, localWorkerId, call } = input;
  if (!owner || owner === ANY_OWNER || owner === localWorkerId) return { kind: 'direct' };
  // A tenant's environment, input and files must never sit in Temporal's history in the clear.
  if (!input.historyEncrypted) {
    return {
      kind: 'refuse',
      status: 501,
      code: 'remote_owner_needs_payload_key',
      message: `the sandbox is held by worker "${owner}" on another host; calls through it carry commands, environment and file contents through Temporal's history, which must be encrypted: set SLIPWAY_PAYLOAD_KEY (the same key) on the API and the workers`,
    };
  }
  return { kind: 'owner', owner };
}
