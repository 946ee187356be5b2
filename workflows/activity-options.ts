/**
 * Activity proxies with retry policies from the retry-profile table. Workflow-safe.
 */
import { proxyActivities, workflowInfo, type ActivityOptions } from '@temporalio/workflow';
import { NON_RETRYABLE_FAILURE_KINDS } from '../core/failures';
import { agentTaskQueue } from '../core/ids';
import { RETRY_PROFILES } from '../core/retry-profiles';
import type { SlipwayActivities, SlipwayAgentActivities } from '../activities';

export function retryPolicy(maximumAttempts: number): NonNullable<ActivityOptions['retry']> {
  return {
    maximumAttempts,
    initialInterval: '1s',
    backoffCoefficient: 2,
    maximumInterval: '1m',
    nonRetryableErrorTypes: [...NON_RETRYABLE_FAILURE_KINDS],
  };
}

const DEFAULT_ATTEMPTS: number = RETRY_PROFILES.balanced.maximumAttempts;

/** Git and sandbox plumbing: quick, retried by the balanced profile. */
export function gitActivities(maximumAttempts = DEFAULT_ATTEMPTS) {
  return proxyActivities<SlipwayActivities>({
    startToCloseTimeout: '10 minutes',
    heartbeatTimeout: '30 seconds',
    retry: retryPolicy(maximumAttempts),
  });
}

/** Gates may run long; they heartbeat while the command runs. */
export function gateActivities(timeoutSeconds: number, maximumAttempts = DEFAULT_ATTEMPTS) {
  return proxyActivities<SlipwayActivities>({
    startToCloseTimeout: `${timeoutSeconds + 60} seconds`,
    heartbeatTimeout: '15 seconds',
    retry: retryPolicy(maximumAttempts),
  });
}

/** Agent runs go to the agents task queue, which has its own small concurrency. */
export function agentActivities(timeoutMinutes: number, maximumAttempts = DEFAULT_ATTEMPTS) {
  return proxyActivities<SlipwayAgentActivities>({
    taskQueue: agentTaskQueue(workflowInfo().taskQueue),
    startToCloseTimeout: `${Math.ceil(timeoutMinutes * 60) + 60} seconds`,
    heartbeatTimeout: '15 seconds',
    retry: retryPolicy(maximumAttempts),
  });
}
