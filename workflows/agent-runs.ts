/**
 * The iteration loop of one agent step, shared by the stream workflow (builder, reviewer, scout)
 * and the objective workflow (planner). Deterministic workflow code.
 *
 * Each agent run is its own activity call, so history records every finished run and a worker
 * crash resumes at the run in flight. The loop runs the agent up to `max_iterations` times and
 * stops early when a run's output holds a completion signal. When the signal never comes, the step
 * still succeeds after the last run: `max_iterations` is a budget, not a requirement (as in
 * Sandcastle, whose loop simply ends there); gates and review decide whether the work is good.
 *
 * Sessions: the first run resumes `resumeSessionId` (a builder's previous session in a fix loop);
 * later iterations start fresh, like a Ralph loop, and find their progress in the repository.
 * A reviewer's or planner's answer that does not validate is asked for again (resuming its
 * session, told what was wrong) up to `max_output_retries` times; then the step fails as
 * `agent_runtime_transient`.
 *
 * The caller keeps the loop's state across a re-entry of the step: after a rate-limit wait (the
 * activity throws `provider_rate_limit` out of this loop) the step continues at the same run.
 */
import { ApplicationFailure, sleep } from '@temporalio/workflow';
import type { AgentRunInput, AgentRunResult } from '../activities';
import type { AgentRunRecord } from '../core/types';
import type { ActivityRoute } from '../core/routing';
import type { RunAllowance } from '../core/budget';
import { agentActivities, type RetrySpec } from './activity-options';
import { onOwner } from './owner';
import { rootCause } from './failure-info';
import { rateLimitWaitMs } from './stream-interpreter';

export interface AgentLoopState {
  /** The next run's place in the loop (1-based). */
  agentIteration: number;
  /** Structured-output retries spent so far. */
  outputRetries: number;
  /** Why the previous answer could not be used; sent with the next run. */
  outputError?: string;
  /** The session of the run whose answer is being corrected. */
  retrySessionId?: string;
}

export const newAgentLoop = (): AgentLoopState => ({ agentIteration: 1, outputRetries: 0 });

export type AgentLoopOutcome =
  | { ok: true; last: AgentRunResult; runs: number; signalled: boolean }
  /** `budget_exhausted`: `beforeRun` held the next run back (the loop's state stays at that run). */
  | { ok: false; summary: string; kind?: 'budget_exhausted' };

export interface AgentLoopOptions {
  input: Omit<AgentRunInput, 'agentIteration' | 'outputError'>;
  step: string;
  retry: RetrySpec;
  state: AgentLoopState;
  /** Called after every run (usage, commits, feed), before the loop decides what comes next. */
  onRun(run: AgentRunResult, record: AgentRunRecord): Promise<void>;
  /** Asked before every run: a reason the run may not start (the budget is spent), or undefined. */
  beforeRun?: () => string | undefined | Promise<string | undefined>;
  /** The agent-run queue of the worker that owns the sandbox (absent: the shared one). */
  route?: ActivityRoute;
  /** That worker, checked when a run is not taken up within the grace time (./owner.ts). */
  owner?: string;
  /** Asked before every run under `budget.hard_limit`: what the run may spend before it is stopped. */
  allowance?: () => RunAllowance | undefined;
  /** A stream's runs: the message the run commits its work with at its end (`AgentRunInput.commit`). */
  commitMessage?: (agentIteration: number) => string;
}

export async function runAgentLoop({ input, step, retry, state, onRun, beforeRun, route, owner, allowance, commitMessage }: AgentLoopOptions): Promise<AgentLoopOutcome> {
  const { spec } = input;
  const acts = agentActivities(spec.timeout_minutes, retry, route);
  let runs = 0;
  let last: AgentRunResult | undefined;
  while (state.agentIteration <= spec.max_iterations) {
    const held = await beforeRun?.();
    if (held !== undefined) return { ok: false, summary: held, kind: 'budget_exhausted' };
    const resumed = state.outputError !== undefined ? state.retrySessionId : state.agentIteration === 1 ? input.resumeSessionId : undefined;
    const allowed = allowance?.();
    const commit = commitMessage ? { commit: { message: commitMessage(state.agentIteration) } } : {};
    const run = await onOwner(owner, () => acts.runAgent({ ...input, agentIteration: state.agentIteration, resumeSessionId: resumed, outputError: state.outputError, ...(allowed ? { allowance: allowed } : {}), ...commit }));
    runs += 1;
    const record: AgentRunRecord = {
      at: new Date().toISOString(),
      ...(input.role === 'planner' ? {} : { stream: input.stream.id }),
      step,
      role: input.role,
      provider: spec.provider,
      ...(spec.model ? { model: spec.model } : {}),
      iteration: input.iteration,
      agentIteration: state.agentIteration,
      maxIterations: spec.max_iterations,
      ...(run.sessionId ? { sessionId: run.sessionId } : {}),
      ...(resumed && !run.resumeFailed ? { resumed } : {}),
      ...(run.resumeFailed ? { resumeFailed: run.resumeFailed } : {}),
      inputTokens: run.usage.inputTokens,
      outputTokens: run.usage.outputTokens,
      cachedTokens: run.usage.cachedTokens ?? 0,
      ...(run.usage.costUsd !== undefined ? { costUsd: run.usage.costUsd } : {}),
      ...(run.usage.estimated ? { estimated: true as const } : {}),
      ...(run.usage.usageUnknown ? { usageUnknown: true as const } : {}),
      toolCalls: run.toolCalls,
      durationMs: run.durationMs,
      result: run.budgetStopped !== undefined ? 'budget_stopped' : run.outputError ? 'invalid_output' : run.completionSignal ? 'signalled' : 'finished',
      ended: run.ended,
    };
    await onRun(run, record);
    // Stopped at the hard limit: its usage is counted (onRun); after a raise the step runs it again.
    if (run.budgetStopped !== undefined) return { ok: false, summary: run.budgetStopped, kind: 'budget_exhausted' };
    if (run.outputError !== undefined) {
      if (state.outputRetries >= spec.max_output_retries) {
        return { ok: false, summary: `the ${input.role} gave no usable answer in ${state.outputRetries + 1} tries (max_output_retries: ${spec.max_output_retries}): ${run.outputError}` };
      }
      state.outputRetries += 1;
      state.outputError = run.outputError;
      state.retrySessionId = run.sessionId ?? resumed;
      continue;
    }
    state.outputError = undefined;
    state.retrySessionId = undefined;
    last = run;
    if (run.completionSignal !== undefined) return { ok: true, last, runs, signalled: true };
    state.agentIteration += 1;
  }
  if (!last) return { ok: false, summary: `the ${input.role} step ran no agent (max_iterations: ${spec.max_iterations})` };
  return { ok: true, last, runs, signalled: false };
}


/**
 * Runs `attempt`, sitting out `provider_rate_limit` failures on a durable timer until the
 * provider's reset time (at most `maxWaits` times), then runs it again. For agent calls outside
 * the stream interpreter (the planner), which handles rate limits itself.
 */
export async function withRateLimitWaits<T>(
  attempt: () => Promise<T>,
  maxWaits: number,
  onWait: (wait: { n: number; resetAt?: string; waitMs: number; summary: string }) => void,
): Promise<T> {
  for (let n = 1; ; n++) {
    try {
      return await attempt();
    } catch (err) {
      const cause = rootCause(err);
      if (!(cause instanceof ApplicationFailure) || cause.type !== 'provider_rate_limit' || n > maxWaits) throw err;
      const resetAt = (cause.details?.[0] as { resetAt?: string } | undefined)?.resetAt;
      const waitMs = rateLimitWaitMs(resetAt, Date.now());
      onWait({ n, resetAt, waitMs, summary: cause.message });
      await sleep(waitMs);
    }
  }
}
