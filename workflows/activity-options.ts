/**
 * Activity proxies with retry policies from the retry-profile table. Workflow-safe.
 */
import { proxyActivities, proxyLocalActivities, workflowInfo, type ActivityOptions } from '@temporalio/workflow';
import { NON_RETRYABLE_FAILURE_KINDS } from '../core/failures';
import { agentTaskQueue } from '../core/ids';
import { RETRY_PROFILES } from '../core/retry-profiles';
import { routeFor, type ActivityRoute } from '../core/routing';
import type { SlipwayActivities, SlipwayAgentActivities } from '../activities';

/** Attempts and first back-off for one step's activities. */
export interface RetrySpec {
  maximumAttempts: number;
  initialIntervalMs?: number;
}

export function retryPolicy({ maximumAttempts, initialIntervalMs = 1_000 }: RetrySpec): NonNullable<ActivityOptions['retry']> {
  return {
    maximumAttempts,
    initialInterval: initialIntervalMs,
    backoffCoefficient: 2,
    maximumInterval: '1m',
    nonRetryableErrorTypes: [...NON_RETRYABLE_FAILURE_KINDS],
  };
}

const DEFAULT_RETRY: RetrySpec = { maximumAttempts: RETRY_PROFILES.balanced.maximumAttempts };

/**
 * The route to the worker that owns a sandbox (`owner` from its SandboxInfo), or the shared
 * queues when it has none. `agents`: that owner's agent-run queue.
 */
export function ownerRoute(owner: string | undefined, opts: { graceSeconds?: number; agents?: boolean; waitForOwner?: boolean } = {}): ActivityRoute {
  return routeFor(workflowInfo().taskQueue, owner, opts);
}

function routed(route: ActivityRoute | undefined): Partial<ActivityOptions> {
  if (!route) return {};
  return {
    ...(route.taskQueue ? { taskQueue: route.taskQueue } : {}),
    ...(route.scheduleToStartTimeoutMs ? { scheduleToStartTimeout: route.scheduleToStartTimeoutMs } : {}),
  };
}

/** Git and sandbox plumbing: quick, retried by the balanced profile. */
export function gitActivities(retry: RetrySpec = DEFAULT_RETRY, route?: ActivityRoute) {
  return proxyActivities<SlipwayActivities>({
    ...routed(route),
    startToCloseTimeout: '10 minutes',
    heartbeatTimeout: '30 seconds',
    retry: retryPolicy(retry),
  });
}

/**
 * Short git work on the user's repository as local activities: run by the worker that runs the
 * workflow task, inside that task (no activity task, no workflow task for the result). Never for
 * a sandbox, whose owner may be another worker (docs/adr/0013-worker-ownership.md), nor for work
 * that may take long (a remote repository's fetch): local activities do not heartbeat.
 */
export function localGitActivities(retry: RetrySpec = DEFAULT_RETRY) {
  return proxyLocalActivities<SlipwayActivities>({
    startToCloseTimeout: '2 minutes',
    retry: retryPolicy(retry),
  });
}

/** Gates may run long; they heartbeat while the command runs. */
export function gateActivities(timeoutSeconds: number, retry: RetrySpec = DEFAULT_RETRY, route?: ActivityRoute) {
  return proxyActivities<SlipwayActivities>({
    ...routed(route),
    startToCloseTimeout: `${timeoutSeconds + 60} seconds`,
    heartbeatTimeout: '15 seconds',
    retry: retryPolicy(retry),
  });
}

/** Agent runs go to the agents task queue, which has its own small concurrency. */
export function agentActivities(timeoutMinutes: number, retry: RetrySpec = DEFAULT_RETRY, route?: ActivityRoute) {
  return proxyActivities<SlipwayAgentActivities>({
    taskQueue: agentTaskQueue(workflowInfo().taskQueue),
    ...routed(route),
    startToCloseTimeout: `${Math.ceil(timeoutMinutes * 60) + 60} seconds`,
    heartbeatTimeout: '15 seconds',
    retry: retryPolicy(retry),
  });
}
