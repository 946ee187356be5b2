/**
 * Stream workflow: one parallel slice of an objective. It acquires a sandbox (child sandbox
 * workflow), then interprets its stream blueprint (`build-review` by default): agent steps,
 * gates, hand-off to the merge queue, fix loops through `on_fail`, and recovery when a loop or
 * the retries are exhausted (ask a human, escalate, or fail). Every failure goes into the
 * append-only recovery ledger.
 */
import {
  ApplicationFailure,
  CancellationScope,
  ParentClosePolicy,
  condition,
  defineQuery,
  defineSignal,
  defineUpdate,
  getExternalWorkflowHandle,
  isCancellation,
  setCurrentDetails,
  setHandler,
  sleep,
  startChild,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { Step } from '../blueprints/schema';
import { FAILURE_KINDS, FIX_LOOP_KINDS, type FailureKind } from '../core/failures';
import { mailboxName, sandboxWorkflowId, streamBranch, streamSandboxId } from '../core/ids';
import { SlipwayKind, SlipwayObjective, SlipwayPhase, SlipwayStream } from '../core/search-attributes';
import type { LedgerResult, StreamPhase } from '../core/states';
import { formatTotals, formatUsage } from '../core/usage';
import {
  emptyTotals,
  type BlockedInfo,
  type Feedback,
  type Guidance,
  type GuidanceAck,
  type LedgerEntry,
  type MergeDecision,
  type MergeRequest,
  type SandboxInfo,
  type StreamEvent,
  type StreamInput,
  type StreamResult,
  type StreamStatus,
} from '../core/types';
import type { AgentRunResult } from '../activities';
import { gateActivities, gitActivities } from './activity-options';
import { newAgentLoop, runAgentLoop, type AgentLoopState } from './agent-runs';
import { actingRole, exhaustionMode, firstStepWithRole, fixLimit, nextStep, retryAttempts, retryFor, startStep, stepById } from './blueprint-walker';
import { failureKindOf, failureMessage, rootCause } from './failure-info';
import { releaseSandboxSignal, sandboxReadySignal, sandboxWorkflow } from './sandbox';

/** Sent by a stream to its objective when its work passed gates and review. */
export const streamMergeReadySignal = defineSignal<[MergeRequest]>('streamMergeReady');
/** Sent by a stream to its objective on every phase change, ledger entry and block. */
export const streamEventSignal = defineSignal<[StreamEvent]>('streamEvent');
/** Sent by the objective's merge queue to tell the stream what became of its merge. */
export const mergeDecisionSignal = defineSignal<[MergeDecision]>('mergeDecision');
/** Human guidance for a blocked stream (`slipway mail send`). Validated: the stream must be blocked. */
export const guidanceUpdate = defineUpdate<GuidanceAck, [Guidance]>('guidance');
export const streamStatusQuery = defineQuery<StreamStatus>('streamStatus');

/** Rate-limit waits a stream sits out before it counts the limit as a failure. */
export const MAX_RATE_LIMIT_WAITS = 10;
const DEFAULT_RATE_LIMIT_WAIT_MS = 60_000;

export { failureKindOf, failureMessage } from './failure-info';

interface StepFailure {
  kind: FailureKind;
  summary: string;
  details: string;
  /** For rate limits: when the provider says it resets. */
  resetAt?: string;
}

type StepOutcome = { ok: true; merged?: string; unchanged?: string; done?: boolean } | { ok: false; failure: StepFailure };

function toStepFailure(err: unknown): StepFailure {
  const cause = rootCause(err);
  const details = cause instanceof ApplicationFailure ? (cause.details?.[0] as { resetAt?: string } | undefined) : undefined;
  const summary = failureMessage(err);
  return { kind: failureKindOf(err), summary, details: summary, resetAt: details?.resetAt };
}

function describeStep(step: Step, input: StreamInput): string {
  if (step.type === 'agent') return `${step.role}: ${input.stream.task}`;
  if (step.type === 'deterministic' && step.action === 'run_quality_gates') return `running ${input.gates.map((g) => g.name).join(', ') || 'no gates'}`;
  if (step.type === 'deterministic' && step.action === 'signal_merge_ready') return 'handed to the merge queue';
  return step.id;
}

const PHASE_OF_STEP = (step: Step): StreamPhase => {
  if (step.type === 'agent') return step.role === 'reviewer' ? 'reviewing' : step.role === 'scout' ? 'scouting' : 'building';
  if (step.type === 'deterministic') return step.action === 'run_quality_gates' ? 'gates' : step.action === 'signal_merge_ready' ? 'merge_ready' : 'building';
  return 'blocked';
};

export async function streamWorkflow(input: StreamInput): Promise<StreamResult> {
  const { objective, stream } = input;
  const branch = streamBranch(objective.id, stream.id);
  const status: StreamStatus = { streamId: stream.id, phase: 'provisioning', iteration: 0, branch, ledger: [], usage: emptyTotals() };
  let sandbox: SandboxInfo | undefined;
  let decision: MergeDecision | undefined;
  let guidance: Guidance | undefined;
  const parent = getExternalWorkflowHandle(input.parentWorkflowId);

  setHandler(streamStatusQuery, () => status);
  setHandler(sandboxReadySignal, (info) => {
    sandbox = info;
  });
  setHandler(mergeDecisionSignal, (d) => {
    decision = d;
  });
  setHandler(
    guidanceUpdate,
    (message) => {
      guidance = message;
      return { streamId: stream.id, resumesAt: status.blocked?.step ?? '' };
    },
    {
      validator: (message) => {
        if (!status.blocked) throw new Error(`stream "${stream.id}" is not blocked (it is ${status.phase}); guidance is only taken by a blocked stream`);
        if (message.agent !== status.blocked.mailbox && message.agent !== stream.id) {
          throw new Error(`unknown agent "${message.agent}" for stream "${stream.id}"; its mailbox is "${status.blocked.mailbox}"`);
        }
        if (!message.body.trim()) throw new Error('guidance body is empty');
        if (guidance) throw new Error(`stream "${stream.id}" already has guidance waiting to be applied`);
      },
    },
  );
  upsertSearchAttributes([
    { key: SlipwayKind, value: 'stream' },
    { key: SlipwayObjective, value: objective.id },
    { key: SlipwayStream, value: stream.id },
  ]);

  /** Tells the objective (feed line, phase, block state, ledger entry). Best effort: the parent may be gone. */
  const emit = async (text: string, extra: Partial<StreamEvent> = {}) => {
    await parent
      .signal(streamEventSignal, { streamId: stream.id, phase: status.phase, iteration: status.iteration, text, usage: status.usage, ...extra })
      .catch(() => undefined);
  };
  const enter = async (phase: StreamPhase, details: string) => {
    status.phase = phase;
    upsertSearchAttributes([{ key: SlipwayPhase, value: phase }]);
    setCurrentDetails(`**${phase}**${status.step ? ` at step \`${status.step}\`` : ''}${status.iteration ? ` (iteration ${status.iteration})` : ''} — ${details}`);
    await emit(`${phase}${status.iteration ? ` (iteration ${status.iteration})` : ''}: ${details}`);
  };
  const record = async (entry: Omit<LedgerEntry, 'at' | 'stream'>, text: string) => {
    const full: LedgerEntry = { at: new Date().toISOString(), stream: stream.id, ...entry };
    status.ledger.push(full);
    await emit(text, { ledger: full });
  };
  const finish = async (result: Omit<StreamResult, 'streamId' | 'branch' | 'iterations' | 'ledger' | 'usage'>, text: string): Promise<StreamResult> => {
    status.failure = result.failure;
    await enter(result.status === 'merged' ? 'merged' : result.status === 'escalated' ? 'escalated' : 'failed', text);
    return { streamId: stream.id, branch, iterations: status.iteration, ledger: status.ledger, usage: status.usage, ...result };
  };

  // --- sandbox ---------------------------------------------------------------------------------
  await enter('provisioning', `starting a sandbox for \`${branch}\``);
  const sandboxId = streamSandboxId(objective.id, stream.id);
  const sandboxHandle = await startChild(sandboxWorkflow, {
    workflowId: sandboxWorkflowId(sandboxId),
    args: [{ sandboxId, provider: 'local', repository: objective.repository, objectiveId: objective.id, name: stream.id, branch, base: input.base, ownerWorkflowId: workflowInfo().workflowId, options: input.sandbox }],
    parentClosePolicy: ParentClosePolicy.REQUEST_CANCEL,
    staticSummary: `Sandbox for stream ${stream.id} of ${objective.id}`,
    staticDetails: `Local git worktree on branch \`${branch}\`, started from \`${input.base}\`.`,
  });
  let sandboxEnded = false;
  const sandboxResult = sandboxHandle.result().finally(() => {
    sandboxEnded = true;
  });
  const release = () =>
    CancellationScope.nonCancellable(async () => {
      if (sandboxEnded) return;
      await getExternalWorkflowHandle(sandboxHandle.workflowId).signal(releaseSandboxSignal);
      await sandboxResult;
    });

  try {
    await condition(() => sandbox !== undefined || sandboxEnded);
    if (!sandbox) {
      const ended = await sandboxResult;
      const summary = `sandbox could not be created: ${ended.error ?? 'unknown error'}`;
      await record({ step: 'sandbox', kind: 'sandbox_failure', action: FAILURE_KINDS.sandbox_failure.action, attempt: 1, maxAttempts: 1, summary, result: 'failed' }, `sandbox_failure: ${summary}`);
      return await finish({ status: 'failed', failure: { kind: 'sandbox_failure', summary } }, summary);
    }
    status.sandboxPath = sandbox.path;
    return await interpret(sandbox);
  } catch (err) {
    if (isCancellation(err)) throw err;
    const summary = failureMessage(err);
    return await finish({ status: 'failed', failure: { kind: failureKindOf(err), summary } }, summary);
  } finally {
    await release();
  }

  // --- the blueprint interpreter ------------------------------------------------------------------
  async function interpret(box: SandboxInfo): Promise<StreamResult> {
    const bp = input.blueprint;
    const overrides = { maxFixIterations: input.maxFixIterations, onExhausted: input.onExhausted };
    const git = gitActivities();
    const fixCounts: Record<string, number> = {};
    let feedback: Feedback | undefined;
    let sessionId: string | undefined;
    let rateLimitWaits = 0;
    let recovering: { step: string; kind: FailureKind } | undefined;
    let mergeCommit: string | undefined;
    let unchanged: string | undefined;

    const history = () => status.ledger.map((e) => `${e.step}: ${e.kind} -> ${e.action} (${e.attempt}/${e.maxAttempts}) ${e.result}: ${e.summary}`);
    const addUsage = (run: AgentRunResult) => {
      status.usage.inputTokens += run.usage.inputTokens;
      status.usage.outputTokens += run.usage.outputTokens;
      status.usage.cachedTokens += run.usage.cachedTokens ?? 0;
      status.usage.costUsd += run.usage.costUsd ?? 0;
      status.usage.runs += 1;
    };

    // A step re-entered after a rate-limit wait or guidance continues its iteration loop where it stopped.
    const agentLoops: Record<string, AgentLoopState> = {};
    const runAgentStep = async (step: Extract<Step, { type: 'agent' }>): Promise<StepOutcome> => {
      const spec = input.agents[step.role];
      if (!spec) {
        if (step.optional) return { ok: true };
        return { ok: false, failure: { kind: 'configuration_error', summary: `step "${step.id}" needs a ${step.role} agent; none is configured`, details: '' } };
      }
      const loop = (agentLoops[step.id] ??= newAgentLoop());
      try {
        const outcome = await runAgentLoop({
          input: {
            role: step.role,
            spec,
            sandboxPath: box.path,
            repository: objective.repository,
            objectiveDir: objective.objectiveDir,
            objective: { id: objective.id, text: objective.objective },
            stream: { id: stream.id, task: stream.task, branch: box.branch },
            targetBranch: input.integrationBranch,
            iteration: Math.max(status.iteration, 1),
            feedback: feedback ? { ...feedback, history: history() } : undefined,
            resumeSessionId: step.role === 'builder' ? sessionId : undefined,
          },
          step: step.id,
          retry: retryFor(bp, step),
          state: loop,
          onRun: async (run, record) => {
            addUsage(run);
            (status.agentRuns ??= []).push(record);
            if (step.role === 'builder') {
              sessionId = run.sessionId ?? sessionId;
              const runNote = spec.max_iterations > 1 ? `, run ${record.agentIteration}` : '';
              await git.commitWork({ path: box.path, message: `slipway(${stream.id}): iteration ${status.iteration}${runNote}\n\n${stream.task}` });
            }
            const ending = record.result === 'signalled' ? '; completion signal' : record.result === 'invalid_output' ? '; answer unusable' : '';
            const text = `${step.role} run ${record.agentIteration}/${record.maxIterations} (${spec.provider}): ${formatUsage(record)}${ending}`;
            setCurrentDetails(`**${status.phase}** at step \`${step.id}\`${status.iteration ? ` (iteration ${status.iteration})` : ''} — ${text}\n\nStream usage: ${formatTotals(status.usage)}`);
            await emit(text, { agentRun: record });
          },
        });
        delete agentLoops[step.id];
        if (!outcome.ok) return { ok: false, failure: { kind: 'agent_runtime_transient', summary: outcome.summary, details: outcome.summary } };
        const run = outcome.last;
        if (step.role === 'reviewer' && run.verdict?.verdict !== 'approve') {
          const findings = run.verdict?.findings ?? [];
          return { ok: false, failure: { kind: 'review_rejection', summary: run.verdict?.summary ?? 'the reviewer rejected the change', details: findings.map((f) => `- ${f}`).join('\n') } };
        }
        return { ok: true };
      } catch (err) {
        if (isCancellation(err)) throw err;
        return { ok: false, failure: toStepFailure(err) };
      }
    };

    const runDeterministicStep = async (step: Extract<Step, { type: 'deterministic' }>): Promise<StepOutcome> => {
      switch (step.action) {
        case 'run_quality_gates': {
          if (input.gates.length === 0) return { ok: true };
          const timeout = input.gates.reduce((sum, g) => sum + g.timeout_seconds, 0);
          try {
            const run = await gateActivities(timeout, retryFor(bp, step)).runGates({ path: box.path, gates: input.gates });
            if (run.passed) return { ok: true };
            const failed = run.results.find((r) => !r.passed)!;
            const summary = `gate "${failed.name}" ${failed.timedOut ? 'timed out' : `exited with ${failed.exitCode}`}`;
            return { ok: false, failure: { kind: 'quality_gate_failure', summary, details: run.failureReport } };
          } catch (err) {
            if (isCancellation(err)) throw err;
            return { ok: false, failure: toStepFailure(err) };
          }
        }
        case 'signal_merge_ready': {
          const head = await git.commitWork({ path: box.path, message: `slipway(${stream.id}): leftovers before merge` });
          decision = undefined;
          await parent.signal(streamMergeReadySignal, { streamId: stream.id, branch: box.branch, headCommit: head.head });
          await condition(() => decision !== undefined);
          const d = decision!;
          if (d.status === 'merged') return { ok: true, merged: d.commit, done: true };
          if (d.status === 'no_changes') return { ok: true, unchanged: d.summary, done: true };
          return { ok: false, failure: { kind: d.kind, summary: d.summary, details: d.details } };
        }
        case 'mark_complete':
          return { ok: true, done: true };
        default:
          return { ok: false, failure: { kind: 'configuration_error', summary: `action "${step.action}" cannot run in a stream`, details: '' } };
      }
    };

    const runStep = (step: Step): Promise<StepOutcome> => {
      if (step.type === 'agent') return runAgentStep(step);
      if (step.type === 'deterministic') return runDeterministicStep(step);
      if (step.type === 'human') return blockForGuidance(step, { kind: 'unknown', summary: step.prompt ?? 'approval requested', details: '' }).then(() => ({ ok: true as const }));
      return Promise.resolve({ ok: false as const, failure: { kind: 'configuration_error' as const, summary: `step type "${step.type}" cannot run in a stream`, details: '' } });
    };

    /** Blocks until a human sends guidance through the update; returns it. */
    const blockForGuidance = async (step: Step, failure: StepFailure): Promise<Guidance> => {
      const blocked: BlockedInfo = {
        mailbox: mailboxName(actingRole(bp, step), stream.id),
        since: new Date().toISOString(),
        step: step.id,
        kind: failure.kind,
        summary: failure.summary,
      };
      status.blocked = blocked;
      status.phase = 'blocked';
      upsertSearchAttributes([{ key: SlipwayPhase, value: 'blocked' }]);
      setCurrentDetails(`**blocked** at step \`${step.id}\` — ${failure.summary}\n\nSend guidance: \`slipway mail send ${blocked.mailbox} "subject" "body" --objective ${objective.id}\``);
      await emit(`recovery blocked: retry budget exhausted; awaiting guidance (mailbox ${blocked.mailbox})`, { blocked, phase: 'blocked' });
      await condition(() => guidance !== undefined);
      const received = guidance!;
      guidance = undefined;
      status.blocked = undefined;
      await emit(`guidance applied; resuming at step ${step.id}`, { blocked: null });
      return received;
    };

    let step: Step | undefined = startStep(bp);
    // After a rate-limit wait the same run is tried again: not a new builder iteration.
    let resumingAfterWait = false;
    while (step) {
      status.step = step.id;
      if (step.type === 'agent' && step.role === 'builder' && input.agents.builder && !resumingAfterWait) status.iteration += 1;
      resumingAfterWait = false;
      await enter(PHASE_OF_STEP(step), step.description ?? describeStep(step, input));
      const outcome = await runStep(step);

      if (outcome.ok) {
        if (recovering?.step === step.id) {
          const limit = fixLimit(bp, step, overrides);
          await record(
            { step: step.id, kind: recovering.kind, action: FAILURE_KINDS[recovering.kind].action, attempt: fixCounts[step.id] ?? 0, maxAttempts: limit, summary: `step ${step.id} passed`, result: 'recovered' },
            `${step.id} passed after recovery`,
          );
          recovering = undefined;
        }
        if (outcome.merged) mergeCommit = outcome.merged;
        if (outcome.unchanged) unchanged = outcome.unchanged;
        if (outcome.done) break;
        step = nextStep(bp, step);
        continue;
      }

      const failure = outcome.failure;
      const limit = fixLimit(bp, step, overrides);
      const count = fixCounts[step.id] ?? 0;

      // A rate limit waits for the provider's reset on a durable timer; it spends no attempt.
      if (failure.kind === 'provider_rate_limit' && rateLimitWaits < MAX_RATE_LIMIT_WAITS) {
        rateLimitWaits += 1;
        const waitMs = failure.resetAt ? Math.max(1_000, Date.parse(failure.resetAt) - Date.now()) : DEFAULT_RATE_LIMIT_WAIT_MS;
        await record(
          { step: step.id, kind: failure.kind, action: FAILURE_KINDS[failure.kind].action, attempt: rateLimitWaits, maxAttempts: MAX_RATE_LIMIT_WAITS, summary: `${failure.summary}; waiting ${Math.ceil(waitMs / 1000)} s until ${failure.resetAt ?? 'the default back-off'}`, result: 'waiting' },
          `provider_rate_limit -> wait until ${failure.resetAt ?? `${waitMs / 1000} s from now`} (${rateLimitWaits}/${MAX_RATE_LIMIT_WAITS})`,
        );
        status.phase = 'rate_limited';
        setCurrentDetails(`**rate_limited** — waiting until ${failure.resetAt ?? 'back-off'}`);
        await sleep(waitMs);
        resumingAfterWait = true;
        continue;
      }

      // Fix loop: send the work back with the failure attached.
      if (FIX_LOOP_KINDS.includes(failure.kind) && step.on_fail && count < limit) {
        fixCounts[step.id] = count + 1;
        const target = stepById(bp, step.on_fail);
        await record(
          { step: step.id, kind: failure.kind, action: FAILURE_KINDS[failure.kind].action, attempt: count + 1, maxAttempts: limit, summary: failure.summary, result: 'retrying' },
          `${failure.kind} -> rerun ${target.type === 'agent' ? target.role : target.id} (${count + 1}/${limit})`,
        );
        feedback = { kind: failure.kind, summary: failure.summary, details: failure.details, guidance: feedback?.guidance };
        recovering = { step: step.id, kind: failure.kind };
        step = target;
        continue;
      }

      // Merge trouble: rebuild on top of the integration branch, or restart the stream.
      if ((failure.kind === 'merge_conflict' || failure.kind === 'post_merge_gate_failure') && count < limit) {
        fixCounts[step.id] = count + 1;
        let details = failure.details;
        if (failure.kind === 'merge_conflict') {
          const reset = await git.resetOntoIntegration({ path: box.path, onto: input.integrationBranch });
          details = `${failure.details}\n\nYour previous change (now to be re-applied on top of ${input.integrationBranch}):\n${reset.previousDiff}`;
        }
        const restartAt = failure.kind === 'merge_conflict' ? firstStepWithRole(bp, 'builder') ?? startStep(bp) : startStep(bp);
        await record(
          { step: step.id, kind: failure.kind, action: FAILURE_KINDS[failure.kind].action, attempt: count + 1, maxAttempts: limit, summary: failure.summary, result: 'retrying' },
          `${failure.kind} -> ${failure.kind === 'merge_conflict' ? `rebuild on ${input.integrationBranch}` : 'restart the stream'} (${count + 1}/${limit})`,
        );
        feedback = { kind: failure.kind, summary: failure.summary, details };
        recovering = { step: step.id, kind: failure.kind };
        step = restartAt;
        continue;
      }

      // Exhausted: the blueprint's exhaustion mode decides.
      const mode = exhaustionMode(bp, step, overrides);
      const exhaustedResult: LedgerResult = mode === 'ask_human' ? 'blocked' : mode === 'escalate' ? 'escalated' : 'failed';
      const loopExhausted = FIX_LOOP_KINDS.includes(failure.kind) && step.on_fail;
      const attempts = loopExhausted || failure.kind === 'merge_conflict' || failure.kind === 'post_merge_gate_failure' ? limit : retryAttempts(bp, step);
      const summary = loopExhausted
        ? `fix loop exhausted after ${status.iteration} iterations: ${failure.summary}`
        : `${FAILURE_KINDS[failure.kind].summary}: ${failure.summary}`;
      await record(
        { step: step.id, kind: failure.kind, action: FAILURE_KINDS[failure.kind].action, attempt: attempts, maxAttempts: attempts, summary, result: exhaustedResult },
        `${failure.kind} exhausted at ${step.id} -> ${mode}`,
      );
      if (mode === 'ask_human') {
        const received = await blockForGuidance(step, { ...failure, summary });
        await record(
          { step: step.id, kind: failure.kind, action: 'apply_guidance', attempt: 1, maxAttempts: 1, summary: received.subject, result: 'guidance_applied', guidance: received.body },
          `guidance applied: ${received.subject}`,
        );
        fixCounts[step.id] = 0; // guidance buys a fresh budget
        feedback = { kind: failure.kind, summary: failure.summary, details: failure.details, guidance: `${received.subject}\n${received.body}` };
        recovering = { step: step.id, kind: failure.kind };
        if (loopExhausted) step = stepById(bp, step.on_fail!);
        else if (failure.kind === 'merge_conflict' || failure.kind === 'post_merge_gate_failure') step = firstStepWithRole(bp, 'builder') ?? startStep(bp);
        continue;
      }
      return await finish(
        { status: mode === 'escalate' ? 'escalated' : 'failed', failure: { kind: failure.kind, summary } },
        mode === 'escalate' ? `needs attention: ${summary}` : summary,
      );
    }

    if (mergeCommit) return await finish({ status: 'merged', mergeCommit }, `merged as ${mergeCommit.slice(0, 10)}`);
    if (unchanged) return await finish({ status: 'no_changes', failure: { kind: 'unknown', summary: unchanged } }, `not merged: ${unchanged}`);
    return await finish({ status: 'failed', failure: { kind: 'configuration_error', summary: `blueprint ${bp.id} ended without merging` } }, 'ended without merging');
  }
}
