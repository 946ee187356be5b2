/**
 * Activity proxies with retry policies from the retry-profile table. Workflow-safe.
 */
import { proxyActivities, workflowInfo, type ActivityOptions } from '@temporalio/workflow';
import { NON_RETRYABLE_FAILURE_KINDS } from '../core/failures';
import { agentTaskQueue } from '../core/ids';
import { RETRY_PROFILES, type RetryProfileName } from '../core/retry-profiles';
import type { SlipwayActivities, SlipwayAgentActivities } from '../activities';

export function retryPolicy(profile: RetryProfileName, maximumAttempts?: number): NonNullable<ActivityOptions['retry']> {
  return {
    maximumAttempts: maximumAttempts ?? RETRY_PROFILES[profile].maximumAttempts,
    initialInterval: '1s',
    backoffCoefficient: 2,
    maximumInterval: '1m',
    nonRetryableErrorTypes: [...NON_RETRYABLE_FAILURE_KINDS],
  };
}

/** Git and sandbox plumbing: quick, retried generously. */
export function gitActivities(profile: RetryProfileName = 'balanced') {
  return proxyActivities<SlipwayActivities>({
    startToCloseTimeout: '10 minutes',
    heartbeatTimeout: '1 minute',
    retry: retryPolicy(profile),
  });
}

/** Gates may run long; they heartbeat while the command runs. */
export function gateActivities(timeoutSeconds: number, profile: RetryProfileName = 'balanced') {
  return proxyActivities<SlipwayActivities>({
    startToCloseTimeout: `${timeoutSeconds + 60} seconds`,
    heartbeatTimeout: '30 seconds',
    retry: retryPolicy(profile),
  });
}

/** Agent runs go to the agents task queue, which has its own small concurrency. */
export function agentActivities(timeoutMinutes: number, profile: RetryProfileName = 'balanced') {
  return proxyActivities<SlipwayAgentActivities>({
    taskQueue: agentTaskQueue(workflowInfo().taskQueue),
    startToCloseTimeout: `${Math.ceil(timeoutMinutes * 60) + 60} seconds`,
    heartbeatTimeout: '30 seconds',
    retry: retryPolicy(profile),
  });
}
