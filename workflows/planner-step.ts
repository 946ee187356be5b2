/**
 * The objective's planning steps, pure: whether the planner runs, whether a human must approve,
 * the planner's answer turned into streams (within `MAX_STREAMS`, a valid graph), and what a
 * failed objective-level step becomes (a rejected plan goes back to the planner with the
 * reason while the step's fix budget lasts; anything else ends the objective).
 *
 * The objective workflow (workflows/objective.ts) is the shell: it runs the planner's agent
 * loop, waits for the human's decision and records what this returns. Bundled into workflow
 * code: types and pure helpers only.
 */
import type { Step } from '../core/blueprint-schema';
import { FAILURE_KINDS } from '../core/failures';
import { formatIssuePath, streamGraphIssues } from '../core/stream-graph';
import type { AgentRunInput } from '../activities';
import type { LedgerEntry, ObjectiveInput, StreamSpec } from '../core/types';

export type ObjectiveStepFailureKind = 'plan_rejection' | 'configuration_error' | 'agent_runtime_transient';

export interface ObjectiveStepFailure {
  kind: ObjectiveStepFailureKind;
  summary: string;
}

/** What a `planner` agent step does given the streams the objective has so far. */
export function plannerStepAction(
  step: Extract<Step, { type: 'agent' }>,
  ctx: { streams: number; feedback?: string; plannerConfigured: boolean },
): { type: 'skip' } | { type: 'plan' } | { type: 'fail'; failure: ObjectiveStepFailure } {
  if (step.role !== 'planner') return { type: 'fail', failure: { kind: 'configuration_error', summary: `a ${step.role} step cannot run at objective level` } };
  // Streams given (and no rejected plan to redo): nothing to plan.
  if (step.optional && ctx.streams > 0 && !ctx.feedback) return { type: 'skip' };
  if (!ctx.plannerConfigured) return { type: 'fail', failure: { kind: 'configuration_error', summary: 'the objective lists no streams and no planner agent is configured' } };
  return { type: 'plan' };
}

/** Whether a `human` step waits for approval: an optional one only for a plan, or when asked to. */
export function approvalNeeded(step: Extract<Step, { type: 'human' }>, ctx: { planned: boolean; requireApproval: boolean }): boolean {
  return !step.optional || ctx.planned || ctx.requireApproval;
}

/**
 * The planner's answer as the objective's streams. The activity validates it too, but the
 * workflow trusts no activity with its own bounds: too many streams, or a broken graph, fails
 * the planning step with the field named (no truncation: dropping streams would silently drop
 * work the plan relies on).
 */
export function streamsFromPlan(plan: StreamSpec[] | undefined): { ok: true; streams: StreamSpec[] } | { ok: false; failure: ObjectiveStepFailure } {
  if (!plan || plan.length === 0) return { ok: false, failure: { kind: 'agent_runtime_transient', summary: 'the planner returned no streams' } };
  const issues = streamGraphIssues(plan);
  if (issues.length > 0) {
    const summary = `the planner's plan is invalid: ${issues.map((i) => `${formatIssuePath(i.path)}: ${i.message}`).join('; ')}`;
    return { ok: false, failure: { kind: 'agent_runtime_transient', summary } };
  }
  return { ok: true, streams: plan };
}

/**
 * What a failed objective-level step becomes: the ledger entry, and either a loop back to
 * `on_fail` with the reason as the planner's feedback, or the objective's failure.
 */
export function afterStepFailure(
  step: Step,
  failed: ObjectiveStepFailure,
  ctx: { fixCount: number; fixLimit: number; at: string },
): { entry: LedgerEntry; next: { type: 'loop'; step: string; feedback: string } | { type: 'fail'; error: string } } {
  const canLoop = failed.kind === 'plan_rejection' && step.on_fail !== undefined && ctx.fixCount < ctx.fixLimit;
  const entry: LedgerEntry = {
    at: ctx.at,
    step: step.id,
    kind: failed.kind,
    action: FAILURE_KINDS[failed.kind].action,
    attempt: canLoop ? ctx.fixCount + 1 : ctx.fixLimit,
    maxAttempts: ctx.fixLimit,
    summary: failed.summary,
    result: canLoop ? 'retrying' : 'failed',
  };
  return { entry, next: canLoop ? { type: 'loop', step: step.on_fail!, feedback: failed.summary } : { type: 'fail', error: failed.summary } };
}

/** The planner's agent run: it works in the merger worktree, for the whole objective. */
export function plannerRunInput(
  input: ObjectiveInput,
  at: { mergerPath: string; integrationBranch: string; iteration: number; feedback?: string },
): Omit<AgentRunInput, 'agentIteration' | 'outputError'> {
  return {
    role: 'planner',
    spec: input.agents.planner!,
    sandboxPath: at.mergerPath,
    repository: input.repository,
    objectiveDir: input.objectiveDir,
    objective: { id: input.id, text: input.objective },
    stream: { id: 'plan', task: input.objective, branch: at.integrationBranch },
    targetBranch: at.integrationBranch,
    iteration: at.iteration,
    feedback: at.feedback ? { kind: 'plan_rejection', summary: at.feedback, details: '' } : undefined,
  };
}

/** The ledger entry and feed line of a planner waiting out a provider's rate limit. */
export function rateLimitWait(
  step: string,
  wait: { n: number; resetAt?: string; waitMs: number; summary: string },
  ctx: { maxWaits: number; at: string },
): { entry: LedgerEntry; feed: string } {
  return {
    entry: {
      at: ctx.at,
      step,
      kind: 'provider_rate_limit',
      action: FAILURE_KINDS.provider_rate_limit.action,
      attempt: wait.n,
      maxAttempts: ctx.maxWaits,
      summary: `${wait.summary}; waiting ${Math.ceil(wait.waitMs / 1000)} s until ${wait.resetAt ?? 'the default back-off'}`,
      result: 'waiting',
    },
    feed: `provider_rate_limit -> wait until ${wait.resetAt ?? `${wait.waitMs / 1000} s from now`} (${wait.n}/${ctx.maxWaits})`,
  };
}
