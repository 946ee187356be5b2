import { ApplicationFailure } from '@temporalio/common';
import { FAILURE_KINDS, type FailureKind } from '../core/failures';

/** Throws a typed failure whose `type` is the failure kind; retryability comes from the kind table. */
export function failure(kind: FailureKind, message: string, details?: unknown): ApplicationFailure {
  return ApplicationFailure.create({
    type: kind,
    message,
    nonRetryable: !FAILURE_KINDS[kind].retryable,
    details: details === undefined ? undefined : [details],
  });
}
