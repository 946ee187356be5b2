/**
 * Calls on a sandbox's owner (docs/adr/0013-worker-ownership.md). An owner-routed activity that
 * nobody picked up within the grace time (schedule-to-start timeout) becomes an owner check: a
 * worker that still polls is only busy and the call is made again; one that stopped is gone,
 * and the call fails as `sandbox_failure` marked `ownerGone`, which the stream answers by
 * recreating its sandbox on another worker. Workflow-safe.
 */
import { ApplicationFailure, log, proxyActivities, workflowInfo } from '@temporalio/workflow';
import type { SlipwayOwnerActivities } from '../activities/owners';
import { isOwnerUnreachable, rootCause } from './failure-info';

const owners = proxyActivities<SlipwayOwnerActivities>({ startToCloseTimeout: '1 minute', retry: { maximumAttempts: 5 } });

export async function onOwner<T>(owner: string | undefined, call: () => Promise<T>): Promise<T> {
  for (;;) {
    try {
      return await call();
    } catch (err) {
      if (owner === undefined || !isOwnerUnreachable(err)) throw err;
      if (await owners.ownerAlive({ taskQueue: workflowInfo().taskQueue, workerId: owner })) {
        log.warn('the owner of the sandbox took nothing up for the grace time but still polls: asking again', { owner });
        continue;
      }
      throw ApplicationFailure.create({
        type: 'sandbox_failure',
        nonRetryable: true,
        message: `the worker "${owner}" that holds the sandbox is gone (it took nothing up for the grace time and no longer polls)`,
        details: [{ ownerGone: owner }],
      });
    }
  }
}

/** The owner that `err` found gone (onOwner), if that is what it says. */
export function ownerGoneOf(err: unknown): string | undefined {
  const cause = rootCause(err);
  const details = cause instanceof ApplicationFailure ? (cause.details?.[0] as { ownerGone?: string } | undefined) : undefined;
  return details?.ownerGone;
}
