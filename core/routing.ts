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
