/**
 * The stream blueprint interpreter, pure: state in, event in, decisions and new state out.
 *
 * `streamWorkflow` (workflows/stream.ts) is the shell: it feeds `decide` the events Temporal
 * gives it (a step's outcome, a rate-limit wait that ended, the reset onto the integration
 * branch, guidance) and carries out the decisions in order (enter a step, run it, record a
 * ledger entry, wait for a rate limit, reset onto the integration branch, block for guidance,
 * finish). Every decision list ends with the one decision whose completion is the next event
 * (`run_step`, `wait_for_rate_limit`, `reset_onto_integration`, `block_for_guidance`) or with
 * `finish`.
 *
 * No side effects, no clock, no Temporal: the state is plain data (times come in on events).
 * Bundled into workflow code: import only types and pure tables here.
 */
import type { Blueprint, ExhaustionMode, Step } from '../core/blueprint-schema';
import { FAILURE_KINDS, FIX_LOOP_KINDS, type FailureKind } from '../core/failures';
import { mailboxName } from '../core/ids';
import type { LedgerResult, StreamPhase } from '../core/states';
import type { AgentSpecs, Feedback, GateSpec, Guidance, LedgerEntry, MergeDecision, StreamInput, StreamResult } from '../core/types';
import { actingRole, exhaustionMode, firstStepWithRole, fixLimit, nextStep, retryAttempts, startStep, stepById } from './blueprint-walker';

/** Rate-limit waits a stream sits out before it counts the limit as a failure. */
export const MAX_RATE_LIMIT_WAITS = 10;
/** Wait when a rate limit gives no reset time. */
export const DEFAULT_RATE_LIMIT_WAIT_MS = 60_000;

/** The longest single rate-limit wait: a reset time comes from agent output, which is untrusted. */
export const MAX_RATE_LIMIT_WAIT_MS = 6 * 3600_000;

/**
 * How long to sit out a rate limit: until the provider's reset time (at least a second, at most
 * MAX_RATE_LIMIT_WAIT_MS), else (no reset time, or one that is not a date) the default.
 */
export function rateLimitWaitMs(resetAt: string | undefined, now: number): number {
  const reset = resetAt ? Date.parse(resetAt) : Number.NaN;
  if (!Number.isFinite(reset)) return DEFAULT_RATE_LIMIT_WAIT_MS;
  return Math.min(MAX_RATE_LIMIT_WAIT_MS, Math.max(1_000, reset - now));
}

/** What the interpreter needs to know of the stream's input. */
export interface StreamInterpreterConfig {
  streamId: string;
  task: string;
  blueprint: Blueprint;
  /** Only which roles are configured matters here. */
  agents: AgentSpecs;
  gates: Pick<GateSpec, 'name'>[];
  integrationBranch: string;
  maxFixIterations?: number;
  onExhausted?: ExhaustionMode;
  /** What a spent budget does (`budget.on_exhausted`); absent: the stream has no budget. */
  budgetOnExhausted?: 'block' | 'fail';
}

export function interpreterConfig(input: StreamInput): StreamInterpreterConfig {
  return {
    streamId: input.stream.id,
    task: input.stream.task,
    blueprint: input.blueprint,
    agents: input.agents,
    gates: input.gates,
    integrationBranch: input.integrationBranch,
    maxFixIterations: input.maxFixIterations,
    onExhausted: input.onExhausted,
    ...(input.budget ? { budgetOnExhausted: input.budget.onExhausted } : {}),
  };
}

export interface StepFailure {
  kind: FailureKind;
  summary: string;
  details: string;
  /** For rate limits: when the provider says it resets. */
  resetAt?: string;
}

export type StepOutcome = { ok: true; merged?: string; unchanged?: string; done?: boolean } | { ok: false; failure: StepFailure };

/** The steps the shell runs itself (activities, the merge hand-off); every other step is decided here. */
export type RunnableStep =
  | Extract<Step, { type: 'agent' }>
  | (Extract<Step, { type: 'deterministic' }> & { action: 'run_quality_gates' | 'signal_merge_ready' });

/** What the interpreter waits for; the event that ends the wait is the only one it takes. */
export type Awaiting =
  | { type: 'start' }
  | { type: 'step_finished' }
  | { type: 'rate_limit_waited' }
  /** A merge conflict: the sandbox is being reset onto the integration branch. */
  | { type: 'reset_onto_integration_done'; failure: StepFailure }
  /** A human step asks for approval. */
  | { type: 'guidance_received'; reason: 'human_step' }
  /** Recovery exhausted under `ask_human`. */
  | { type: 'guidance_received'; reason: 'exhausted'; failure: StepFailure; loopExhausted: boolean }
  /** The budget is spent: blocked until it is raised or a human lets the step go on. */
  | { type: 'budget_available'; failure: StepFailure }
  | { type: 'finished' };

/** Plain, serialisable interpreter state. */
export interface StreamInterpreterState {
  /** The step being run (absent before the start and after the end). */
  step?: string;
  /** Builder iterations so far. */
  iteration: number;
  /** Fix-loop and merge-retry counts, per step. */
  fixCounts: Record<string, number>;
  /** What the next agent run is told about the last failure. */
  feedback?: Feedback;
  rateLimitWaits: number;
  /** The step that failed and is being fixed; its next success is recorded as `recovered`. */
  recovering?: { step: string; kind: FailureKind };
  mergeCommit?: string;
  /** Why the merge queue found nothing to merge. */
  unchanged?: string;
  /**
   * Set when the stream was rebuilt on the integration branch after a merge conflict: the
   * conflict and the stream's earlier change. Every later review sees it, so a rebuild that
   * just overwrites the other stream's lines is judged with both intents in view.
   */
  rebuilt?: string;
  /** The step is re-entered after a rate-limit wait: the same run, not a new builder iteration. */
  resumingAfterWait: boolean;
  /** A human let this step go on past the spent budget (guidance on a budget block); cleared when another step starts. */
  budgetWaived?: string;
  awaiting: Awaiting;
}

export type StreamInterpreterEvent =
  | { type: 'start' }
  /** `now`: workflow time (ms) when the step returned; rate-limit waits are counted from it. */
  | { type: 'step_finished'; outcome: StepOutcome; now: number }
  | { type: 'rate_limit_waited' }
  | { type: 'reset_onto_integration_done'; previousDiff: string }
  | { type: 'guidance_received'; guidance: Guidance }
  /** The budget was raised (no guidance), or guidance lets the blocked step go on. */
  | { type: 'budget_available'; guidance?: Guidance };

export type LedgerDraft = Omit<LedgerEntry, 'at' | 'stream'>;
export type StreamEnding = Omit<StreamResult, 'streamId' | 'branch' | 'iterations' | 'ledger' | 'usage'>;

export type StreamDecision =
  /** Show the step as current (phase, details, feed line) with this builder iteration. */
  | { type: 'enter_step'; step: string; iteration: number; phase: StreamPhase; details: string }
  /**
   * Run the step's activities (agent loop, gates, merge hand-off) and report its outcome.
   * `budgetWaived`: its agent runs start even though the budget is spent (a human said so).
   */
  | { type: 'run_step'; step: RunnableStep; feedback?: Feedback; rebuilt?: string; budgetWaived?: true }
  | { type: 'record'; entry: LedgerDraft; text: string }
  | { type: 'wait_for_rate_limit'; waitMs: number; resetAt?: string }
  /** Reset the sandbox onto the integration branch and report the previous diff. */
  | { type: 'reset_onto_integration' }
  /**
   * Block until a human sends guidance; report it. For `budget_exhausted` a raise of the budget
   * ends the block too (the event is then `budget_available`).
   */
  | { type: 'block_for_guidance'; step: string; mailbox: string; kind: FailureKind; summary: string }
  | { type: 'finish'; result: StreamEnding; text: string };

export interface Decided {
  state: StreamInterpreterState;
  decisions: StreamDecision[];
}

export function initialState(): StreamInterpreterState {
  return { iteration: 0, fixCounts: {}, rateLimitWaits: 0, resumingAfterWait: false, awaiting: { type: 'start' } };
}

export function describeStep(step: Step, config: Pick<StreamInterpreterConfig, 'task' | 'gates'>): string {
  if (step.type === 'agent') return `${step.role}: ${config.task}`;
  if (step.type === 'deterministic' && step.action === 'run_quality_gates') return `running ${config.gates.map((g) => g.name).join(', ') || 'no gates'}`;
  if (step.type === 'deterministic' && step.action === 'signal_merge_ready') return 'handed to the merge queue';
  return step.id;
}

export function phaseOfStep(step: Step): StreamPhase {
  if (step.type === 'agent') return step.role === 'reviewer' ? 'reviewing' : step.role === 'scout' ? 'scouting' : 'building';
  if (step.type === 'deterministic') return step.action === 'run_quality_gates' ? 'gates' : step.action === 'signal_merge_ready' ? 'merge_ready' : 'building';
  return 'blocked';
}

// --- step outcomes from what the shell saw ---------------------------------------------------------

/** An agent step's outcome from its iteration loop (a reviewer must approve). */
export function agentStepOutcome(
  step: Extract<Step, { type: 'agent' }>,
  loop: { ok: false; summary: string; kind?: 'budget_exhausted' } | { ok: true; last: { verdict?: { verdict: string; summary?: string; findings?: string[] } } },
): StepOutcome {
  if (!loop.ok) return { ok: false, failure: { kind: loop.kind ?? 'agent_runtime_transient', summary: loop.summary, details: loop.summary } };
  const verdict = loop.last.verdict;
  if (step.role === 'reviewer' && verdict?.verdict !== 'approve') {
    const findings = verdict?.findings ?? [];
    return { ok: false, failure: { kind: 'review_rejection', summary: verdict?.summary ?? 'the reviewer rejected the change', details: findings.map((f) => `- ${f}`).join('\n') } };
  }
  return { ok: true };
}

/** The gates step's outcome from the gate run. */
export function gateStepOutcome(run: {
  passed: boolean;
  results: { name: string; passed: boolean; timedOut: boolean; exitCode: number | null }[];
  failureReport: string;
}): StepOutcome {
  if (run.passed) return { ok: true };
  const failed = run.results.find((r) => !r.passed)!;
  const summary = `gate "${failed.name}" ${failed.timedOut ? 'timed out' : `exited with ${failed.exitCode}`}`;
  return { ok: false, failure: { kind: 'quality_gate_failure', summary, details: run.failureReport } };
}

/** The merge hand-off's outcome from the merge queue's decision. */
export function mergeStepOutcome(d: MergeDecision): StepOutcome {
  if (d.status === 'merged') return { ok: true, merged: d.commit, done: true };
  if (d.status === 'no_changes') return { ok: true, unchanged: d.summary, done: true };
  return { ok: false, failure: { kind: d.kind, summary: d.summary, details: d.details } };
}

// --- the interpreter ----------------------------------------------------------------------------------

const isMergeTrouble = (kind: FailureKind) => kind === 'merge_conflict' || kind === 'post_merge_gate_failure';

/** One step of the interpreter. Throws on an event it does not wait for (a bug of the shell). */
export function decide(config: StreamInterpreterConfig, state: StreamInterpreterState, event: StreamInterpreterEvent): Decided {
  if (event.type !== state.awaiting.type) throw new Error(`stream interpreter waits for ${state.awaiting.type}, got ${event.type}`);
  const s: StreamInterpreterState = { ...state, fixCounts: { ...state.fixCounts } };
  const out: StreamDecision[] = [];
  try {
    advance(config, s, event, out);
  } catch (err) {
    // A broken blueprint (a `next` or `on_fail` to a missing step) fails the stream after the
    // decisions taken so far, as the workflow always did.
    const summary = err instanceof Error ? err.message : String(err);
    s.step = undefined;
    s.awaiting = { type: 'finished' };
    out.push({ type: 'finish', result: { status: 'failed', failure: { kind: 'unknown', summary } }, text: summary });
  }
  return { state: s, decisions: out };
}

function advance(config: StreamInterpreterConfig, s: StreamInterpreterState, event: StreamInterpreterEvent, out: StreamDecision[]): void {
  const bp = config.blueprint;
  const overrides = { maxFixIterations: config.maxFixIterations, onExhausted: config.onExhausted };
  const current = () => stepById(bp, s.step!);

  const finish = (result: StreamEnding, text: string) => {
    s.step = undefined;
    s.awaiting = { type: 'finished' };
    out.push({ type: 'finish', result, text });
  };

  /** The blueprint ran out of steps, or a step ended it. */
  const end = () => {
    if (s.mergeCommit) return finish({ status: 'merged', mergeCommit: s.mergeCommit }, `merged as ${s.mergeCommit.slice(0, 10)}`);
    if (s.unchanged) return finish({ status: 'no_changes', failure: { kind: 'unknown', summary: s.unchanged } }, `not merged: ${s.unchanged}`);
    return finish({ status: 'failed', failure: { kind: 'configuration_error', summary: `blueprint ${bp.id} ended without merging` } }, 'ended without merging');
  };

  const block = (step: Step, kind: FailureKind, summary: string) => {
    out.push({ type: 'block_for_guidance', step: step.id, mailbox: mailboxName(actingRole(bp, step), config.streamId), kind, summary });
  };

  const enter = (step: Step) => {
    s.step = step.id;
    if (!s.resumingAfterWait) s.budgetWaived = undefined;
    if (step.type === 'agent' && step.role === 'builder' && config.agents.builder && !s.resumingAfterWait) s.iteration += 1;
    s.resumingAfterWait = false;
    out.push({ type: 'enter_step', step: step.id, iteration: s.iteration, phase: phaseOfStep(step), details: step.description ?? describeStep(step, config) });
    const immediate = run(step);
    if (immediate) outcome(step, immediate, undefined);
  };

  /** Asks the shell to run the step, or decides its outcome at once. */
  const run = (step: Step): StepOutcome | undefined => {
    if (step.type === 'agent') {
      if (!config.agents[step.role]) {
        if (step.optional) return { ok: true };
        return { ok: false, failure: { kind: 'configuration_error', summary: `step "${step.id}" needs a ${step.role} agent; none is configured`, details: '' } };
      }
      out.push({
        type: 'run_step',
        step,
        feedback: s.feedback,
        ...(step.role === 'reviewer' && s.rebuilt ? { rebuilt: s.rebuilt } : {}),
        ...(s.budgetWaived === step.id ? { budgetWaived: true as const } : {}),
      });
      s.awaiting = { type: 'step_finished' };
      return undefined;
    }
    if (step.type === 'deterministic') {
      switch (step.action) {
        case 'run_quality_gates':
          if (config.gates.length === 0) return { ok: true };
          out.push({ type: 'run_step', step: { ...step, action: step.action } });
          s.awaiting = { type: 'step_finished' };
          return undefined;
        case 'signal_merge_ready':
          out.push({ type: 'run_step', step: { ...step, action: step.action } });
          s.awaiting = { type: 'step_finished' };
          return undefined;
        case 'mark_complete':
          return { ok: true, done: true };
        default:
          return { ok: false, failure: { kind: 'configuration_error', summary: `action "${step.action}" cannot run in a stream`, details: '' } };
      }
    }
    if (step.type === 'human') {
      block(step, 'unknown', step.prompt ?? 'approval requested');
      s.awaiting = { type: 'guidance_received', reason: 'human_step' };
      return undefined;
    }
    return { ok: false, failure: { kind: 'configuration_error', summary: `step type "${step.type}" cannot run in a stream`, details: '' } };
  };

  const record = (step: Step, kind: FailureKind, fields: Pick<LedgerDraft, 'attempt' | 'maxAttempts' | 'summary' | 'result'> & Partial<LedgerDraft>, text: string) => {
    out.push({ type: 'record', entry: { step: step.id, kind, action: FAILURE_KINDS[kind].action, ...fields }, text });
  };

  const outcome = (step: Step, result: StepOutcome, now: number | undefined) => {
    if (result.ok) {
      if (s.recovering?.step === step.id) {
        const limit = fixLimit(bp, step, overrides);
        record(step, s.recovering.kind, { attempt: s.fixCounts[step.id] ?? 0, maxAttempts: limit, summary: `step ${step.id} passed`, result: 'recovered' }, `${step.id} passed after recovery`);
        s.recovering = undefined;
      }
      if (result.merged) s.mergeCommit = result.merged;
      if (result.unchanged) s.unchanged = result.unchanged;
      const next = result.done ? undefined : nextStep(bp, step);
      return next ? enter(next) : end();
    }

    const failure = result.failure;
    const limit = fixLimit(bp, step, overrides);
    const count = s.fixCounts[step.id] ?? 0;

    // A spent budget: no new agent run. The stream blocks until a raise or guidance, or fails.
    if (failure.kind === 'budget_exhausted') {
      const mode = config.budgetOnExhausted ?? 'block';
      record(step, failure.kind, { attempt: 1, maxAttempts: 1, summary: failure.summary, result: mode === 'block' ? 'blocked' : 'failed' }, `budget_exhausted at ${step.id} -> ${mode === 'block' ? 'blocked' : 'failed'}: ${failure.summary}`);
      if (mode === 'fail') return finish({ status: 'failed', failure: { kind: failure.kind, summary: failure.summary } }, `${FAILURE_KINDS.budget_exhausted.summary}: ${failure.summary}`);
      block(step, failure.kind, failure.summary);
      s.awaiting = { type: 'budget_available', failure };
      return;
    }

    // A rate limit waits for the provider's reset on a durable timer; it spends no attempt.
    if (failure.kind === 'provider_rate_limit' && s.rateLimitWaits < MAX_RATE_LIMIT_WAITS) {
      s.rateLimitWaits += 1;
      const waitMs = rateLimitWaitMs(failure.resetAt, now ?? 0);
      record(
        step,
        failure.kind,
        { attempt: s.rateLimitWaits, maxAttempts: MAX_RATE_LIMIT_WAITS, summary: `${failure.summary}; waiting ${Math.ceil(waitMs / 1000)} s until ${failure.resetAt ?? 'the default back-off'}`, result: 'waiting' },
        `provider_rate_limit -> wait until ${failure.resetAt ?? `${waitMs / 1000} s from now`} (${s.rateLimitWaits}/${MAX_RATE_LIMIT_WAITS})`,
      );
      out.push({ type: 'wait_for_rate_limit', waitMs, resetAt: failure.resetAt });
      s.awaiting = { type: 'rate_limit_waited' };
      return;
    }

    // Fix loop: send the work back with the failure attached.
    if (FIX_LOOP_KINDS.includes(failure.kind) && step.on_fail && count < limit) {
      s.fixCounts[step.id] = count + 1;
      const target = stepById(bp, step.on_fail);
      record(
        step,
        failure.kind,
        { attempt: count + 1, maxAttempts: limit, summary: failure.summary, result: 'retrying' },
        `${failure.kind} -> rerun ${target.type === 'agent' ? target.role : target.id} (${count + 1}/${limit})`,
      );
      s.feedback = { kind: failure.kind, summary: failure.summary, details: failure.details, guidance: s.feedback?.guidance };
      s.recovering = { step: step.id, kind: failure.kind };
      return enter(target);
    }

    // Merge trouble: rebuild on top of the integration branch, or restart the stream.
    if (isMergeTrouble(failure.kind) && count < limit) {
      s.fixCounts[step.id] = count + 1;
      if (failure.kind === 'merge_conflict') {
        out.push({ type: 'reset_onto_integration' });
        s.awaiting = { type: 'reset_onto_integration_done', failure };
        return;
      }
      return restartAfterMergeTrouble(step, failure, failure.details);
    }

    // Exhausted: the blueprint's exhaustion mode decides.
    const mode = exhaustionMode(bp, step, overrides);
    const exhaustedResult: LedgerResult = mode === 'ask_human' ? 'blocked' : mode === 'escalate' ? 'escalated' : 'failed';
    const loopExhausted = Boolean(FIX_LOOP_KINDS.includes(failure.kind) && step.on_fail);
    const attempts = loopExhausted || isMergeTrouble(failure.kind) ? limit : retryAttempts(bp, step);
    const summary = loopExhausted ? `fix loop exhausted after ${s.iteration} iterations: ${failure.summary}` : `${FAILURE_KINDS[failure.kind].summary}: ${failure.summary}`;
    record(step, failure.kind, { attempt: attempts, maxAttempts: attempts, summary, result: exhaustedResult }, `${failure.kind} exhausted at ${step.id} -> ${mode}`);
    if (mode === 'ask_human') {
      block(step, failure.kind, summary);
      s.awaiting = { type: 'guidance_received', reason: 'exhausted', failure, loopExhausted };
      return;
    }
    return finish({ status: mode === 'escalate' ? 'escalated' : 'failed', failure: { kind: failure.kind, summary } }, mode === 'escalate' ? `needs attention: ${summary}` : summary);
  };

  const restartAfterMergeTrouble = (step: Step, failure: StepFailure, details: string) => {
    const count = s.fixCounts[step.id];
    const limit = fixLimit(bp, step, overrides);
    const restartAt = failure.kind === 'merge_conflict' ? firstStepWithRole(bp, 'builder') ?? startStep(bp) : startStep(bp);
    record(
      step,
      failure.kind,
      { attempt: count, maxAttempts: limit, summary: failure.summary, result: 'retrying' },
      `${failure.kind} -> ${failure.kind === 'merge_conflict' ? `rebuild on ${config.integrationBranch}` : 'restart the stream'} (${count}/${limit})`,
    );
    s.feedback = { kind: failure.kind, summary: failure.summary, details };
    if (failure.kind === 'merge_conflict') s.rebuilt = details;
    s.recovering = { step: step.id, kind: failure.kind };
    enter(restartAt);
  };

  switch (event.type) {
    case 'start':
      enter(startStep(bp));
      break;
    case 'step_finished':
      outcome(current(), event.outcome, event.now);
      break;
    case 'rate_limit_waited':
      // The same run is tried again: not a new builder iteration.
      s.resumingAfterWait = true;
      enter(current());
      break;
    case 'reset_onto_integration_done': {
      const { failure } = s.awaiting as Extract<Awaiting, { type: 'reset_onto_integration_done' }>;
      const details = `${failure.details}\n\nYour previous change (now to be re-applied on top of ${config.integrationBranch}):\n${event.previousDiff}`;
      restartAfterMergeTrouble(current(), failure, details);
      break;
    }
    case 'budget_available': {
      const { failure } = s.awaiting as Extract<Awaiting, { type: 'budget_available' }>;
      const step = current();
      const received = event.guidance;
      if (received) {
        out.push({
          type: 'record',
          entry: { step: step.id, kind: failure.kind, action: 'apply_guidance', attempt: 1, maxAttempts: 1, summary: received.subject, result: 'guidance_applied', guidance: received.body },
          text: `guidance applied: ${received.subject}; ${step.id} goes on past the budget`,
        });
        s.budgetWaived = step.id;
        s.feedback = { ...(s.feedback ?? { kind: failure.kind, summary: failure.summary, details: '' }), guidance: `${received.subject}\n${received.body}` };
      }
      // The same run the budget held back: not a new builder iteration.
      s.resumingAfterWait = true;
      enter(step);
      break;
    }
    case 'guidance_received': {
      const awaiting = s.awaiting as Extract<Awaiting, { type: 'guidance_received' }>;
      const step = current();
      if (awaiting.reason === 'human_step') {
        outcome(step, { ok: true }, undefined);
        break;
      }
      const { failure, loopExhausted } = awaiting;
      const received = event.guidance;
      out.push({
        type: 'record',
        entry: { step: step.id, kind: failure.kind, action: 'apply_guidance', attempt: 1, maxAttempts: 1, summary: received.subject, result: 'guidance_applied', guidance: received.body },
        text: `guidance applied: ${received.subject}`,
      });
      s.fixCounts[step.id] = 0; // guidance buys a fresh budget
      s.feedback = { kind: failure.kind, summary: failure.summary, details: failure.details, guidance: `${received.subject}\n${received.body}` };
      s.recovering = { step: step.id, kind: failure.kind };
      if (loopExhausted) enter(stepById(bp, step.on_fail!));
      else if (isMergeTrouble(failure.kind)) enter(firstStepWithRole(bp, 'builder') ?? startStep(bp));
      else enter(step);
      break;
    }
  }
}

// --- bounded history: where a stream continues as new ---------------------------------------------

/**
 * A run of the stream workflow continues as new once its history holds this many events, at the
 * next safe point. One decision list runs at most one step (an agent step of at most
 * `max_iterations` runs: about 500 events at the caps, docs/adr/0010-bounded-stream-history.md),
 * so no run passes about 5,500 events, far below Temporal's hard limit of 51,200.
 */
export const CONTINUE_AS_NEW_AFTER_EVENTS = 5_000;
/** Ledger entries a stream keeps (and carries across runs); the objective keeps them all. */
export const LEDGER_KEPT_BY_STREAM = 20;

/**
 * Whether the stream continues as new before carrying out `decisions` (a safe point: every
 * earlier decision is done, none of these is started, so the new run carries them out).
 * Once per fix iteration: when the decisions send the work round a recovery loop (a `retrying`
 * or `guidance_applied` ledger entry) after this run ran at least one step; or whenever the
 * run's history grew past the bound or Temporal suggests it.
 */
export function continueAsNewBefore(
  decisions: readonly StreamDecision[],
  run: { stepsRun: number; historyLength: number; suggested: boolean; maxEvents?: number },
): boolean {
  if (run.stepsRun === 0) return false; // a run must make progress before it hands over
  if (decisions.length === 0 || decisions.some((d) => d.type === 'finish')) return false; // ending: nothing to carry
  if (run.suggested || run.historyLength >= (run.maxEvents ?? CONTINUE_AS_NEW_AFTER_EVENTS)) return true;
  return decisions.some((d) => d.type === 'record' && (d.entry.result === 'retrying' || d.entry.result === 'guidance_applied'));
}
