/**
 * Is a sandbox's owner still there? (docs/adr/0013-worker-ownership.md) Temporal already keeps
 * the record: every worker long-polls the shared workflow queue under an identity that ends in
 * its worker id (workers/worker.ts), and the server notes each poller's last access. Workflow
 * task pollers are never held up by long activities, so a live worker, however busy, shows there.
 */
import type { Client } from '@temporalio/client';

/**
 * A live worker's long poll returns within about a minute and is renewed at once; a poller not
 * seen for this long has stopped.
 */
export const POLLER_FRESH_MS = 90_000;

/** Whether `workerId` polled `taskQueue` within `freshMs` of `now` (pure: the poller list is read by the activity). */
export function ownerPolls(
  pollers: Array<{ identity?: string | null; lastAccessTime?: { seconds?: number | { toNumber(): number } | null; nanos?: number | null } | null }>,
  workerId: string,
  now: number,
  freshMs = POLLER_FRESH_MS,
): boolean {
  return pollers.some((p) => {
    if (!p.identity?.endsWith(`/${workerId}`) || !p.lastAccessTime) return false;
    const s = p.lastAccessTime.seconds;
    const at = (typeof s === 'number' ? s : (s?.toNumber() ?? 0)) * 1000 + (p.lastAccessTime.nanos ?? 0) / 1e6;
    return now - at < freshMs;
  });
}

export function createOwnerActivities(deps: { client: Client }) {
  return {
    /** Whether the worker `workerId` still polls the shared `taskQueue` (a tiny read; nothing is written). */
    async ownerAlive(input: { taskQueue: string; workerId: string }): Promise<boolean> {
      const response = await deps.client.workflowService.describeTaskQueue({
        namespace: deps.client.options.namespace,
        taskQueue: { name: input.taskQueue },
        taskQueueType: 1, // TASK_QUEUE_TYPE_WORKFLOW
      });
      return ownerPolls(response.pollers ?? [], input.workerId, Date.now());
    },
  };
}
export type SlipwayOwnerActivities = ReturnType<typeof createOwnerActivities>;
