/**
 * Failure kinds: the one table of what can go wrong and what Slipway does about it.
 * Activities throw ApplicationFailure with `type` set to one of these kinds; workflows
 * read the kind back to pick the action.
 */
export const FAILURE_KINDS = {
  quality_gate_failure: { action: 'rerun_builder_with_gate_output', retryable: false, summary: 'a quality gate failed' },
  review_rejection: { action: 'rerun_builder_with_review_feedback', retryable: false, summary: 'the reviewer rejected the work' },
  agent_runtime_transient: { action: 'retry_step', retryable: true, summary: 'the agent crashed, hung or exited abnormally' },
  sandbox_failure: { action: 'retry_step', retryable: true, summary: 'the sandbox could not be created or used' },
  // Not retried by Temporal: the workflow waits on a durable timer until the reset time instead.
  provider_rate_limit: { action: 'wait_until_reset', retryable: false, summary: 'the agent provider rate-limited the run' },
  merge_conflict: { action: 'rebuild_on_integration', retryable: false, summary: 'the stream conflicts with the integration branch' },
  post_merge_gate_failure: { action: 'revert_merge_and_restart_stream', retryable: false, summary: 'a gate failed after the merge' },
  plan_rejection: { action: 'replan_with_reason', retryable: false, summary: 'a human rejected the plan' },
  // No new agent run starts: the stream blocks (`slipway budget raise`, guidance) or fails, as `budget.on_exhausted` says.
  budget_exhausted: { action: 'stop_agent_runs', retryable: false, summary: 'the budget is spent' },
  configuration_error: { action: 'fail', retryable: false, summary: 'the configuration is invalid' },
  unknown: { action: 'retry_step', retryable: true, summary: 'an unexpected error' },
} as const;

export type FailureKind = keyof typeof FAILURE_KINDS;
export const FAILURE_KIND_NAMES = Object.keys(FAILURE_KINDS) as FailureKind[];

/** Failure types Temporal must not retry automatically: the workflow handles them itself. */
export const NON_RETRYABLE_FAILURE_KINDS: FailureKind[] = FAILURE_KIND_NAMES.filter((k) => !FAILURE_KINDS[k].retryable);

export function isFailureKind(value: unknown): value is FailureKind {
  return typeof value === 'string' && value in FAILURE_KINDS;
}

/** Kinds that a blueprint fix loop (`on_fail`) handles by sending work back with the failure attached. */
export const FIX_LOOP_KINDS: FailureKind[] = ['quality_gate_failure', 'review_rejection', 'plan_rejection'];
