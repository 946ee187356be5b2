/**
 * Activity proxies with retry policies from the retry-profile table. Workflow-safe.
 */
import { proxyActivities, workflowInfo, type ActivityOptions } from '@temporalio/workflow';
import { NON_RETRYABLE_FAILURE_KINDS } from '../core/failures';
import { agentTaskQueue } from '../core/ids';
import { RETRY_PROFILES } from '../core/retry-profiles';
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

/** Git and sandbox plumbing: quick, retried by the balanced profile. */
export function gitActivities(retry: RetrySpec = DEFAULT_RETRY) {
  return proxyActivities<SlipwayActivities>({
    startToCloseTimeout: '10 minutes',
    heartbeatTimeout: '30 seconds',
    retry: retryPolicy(retry),
  });
}

/** Gates may run long; they heartbeat while the command runs. */
export function gateActivities(timeoutSeconds: number, retry: RetrySpec = DEFAULT_RETRY) {
  return proxyActivities<SlipwayActivities>({
    startToCloseTimeout: `${timeoutSeconds + 60} seconds`,
    heartbeatTimeout: '15 seconds',
    retry: retryPolicy(retry),
  });
}

/** Agent runs go to the agents task queue, which has its own small concurrency. */
export function agentActivities(timeoutMinutes: number, retry: RetrySpec = DEFAULT_RETRY) {
  return proxyActivities<SlipwayAgentActivities>({
    taskQueue: agentTaskQueue(workflowInfo().taskQueue),
    startToCloseTimeout: `${Math.ceil(timeoutMinutes * 60) + 60} seconds`,
    heartbeatTimeout: '15 seconds',
    retry: retryPolicy(retry),
  });
}
