/** Reading a failure kind and message off activity and child-workflow failures. Workflow-safe. */
import { ActivityFailure, ApplicationFailure, ChildWorkflowFailure, TimeoutFailure } from '@temporalio/workflow';
import { isFailureKind, type FailureKind } from '../core/failures';

/** The innermost cause below activity and child-workflow wrappers. */
export function rootCause(err: unknown): unknown {
  let cause: unknown = err;
  while ((cause instanceof ActivityFailure || cause instanceof ChildWorkflowFailure) && cause.cause) cause = cause.cause;
  return cause;
}

export function failureKindOf(err: unknown): FailureKind {
  const cause = rootCause(err);
  if (cause instanceof ApplicationFailure && isFailureKind(cause.type)) return cause.type;
  return 'unknown';
}

export function failureMessage(err: unknown): string {
  const cause = rootCause(err);
  return cause instanceof Error ? cause.message : String(cause);
}

/**
 * An owner-routed activity nobody picked up within the owner grace time (its schedule-to-start
 * timeout, core/routing.ts): the worker that holds the sandbox is gone or has been stuck that long.
 */
export function isOwnerUnreachable(err: unknown): boolean {
  const cause = rootCause(err);
  return cause instanceof TimeoutFailure && cause.timeoutType === 'SCHEDULE_TO_START';
}
