/**
 * Stream workflow: one parallel slice of an objective. It makes its sandbox (itself since ADR
 * 0032; older runs through a child sandbox workflow), then interprets its stream blueprint
 * (`build-review` by default): agent steps, gates, hand-off to the merge queue, fix loops through
 * `on_fail`, and recovery when a loop or the retries are exhausted (ask a human, escalate, or
 * fail). Every failure goes into the append-only recovery ledger.
 *
 * The interpreter itself is pure (`./stream-interpreter`): this workflow is its shell. It feeds it
 * Temporal events (step outcomes, merge decisions, ends of rate-limit waits, guidance) and carries
 * out its decisions (enter and run a step, record a ledger entry, wait, reset onto the
 * integration branch, block for guidance, finish), keeping the command sequence of 0.1.0.
 */
import {
  ApplicationFailure,
  CancellationScope,
  ParentClosePolicy,
  TemporalFailure,
  allHandlersFinished,
  condition,
  continueAsNew,
  defineQuery,
  defineSignal,
  defineUpdate,
  getExternalWorkflowHandle,
  isCancellation,
  log,
  setCurrentDetails,
  setHandler,
  sleep,
  startChild,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { STREAM_BASELINE, patchesOf } from './patches';
import type { Step } from '../core/blueprint-schema';
import { FAILURE_KINDS } from '../core/failures';
import { sandboxWorkflowId, streamBranch, streamSandboxId, streamSandboxWorkflowId } from '../core/ids';
import { SlipwayKind, SlipwayObjective, SlipwayPhase, SlipwaySandboxState, SlipwayStream } from '../core/search-attributes';
import type { SandboxState, StreamPhase } from '../core/states';
import { addRunUsage, formatTotals, formatUsage } from '../core/usage';
import { runAllowance, streamBudgetBlock, type LeaseRequest, type StreamBudget, type StreamBudgetUpdate } from '../core/budget';
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
  type SandboxInput,
  type SandboxResult,
  type StreamEvent,
  type StreamInput,
  type StreamResult,
  type StreamStatus,
} from '../core/types';
import type { AgentRunResult } from '../activities';
import { gateActivities, gitActivities, ownerRoute, type RetrySpec } from './activity-options';
import { newAgentLoop, runAgentLoop, type AgentLoopState } from './agent-runs';
import { retryFor } from './blueprint-walker';
import { FEED_BATCH_LIMIT, FEED_FLUSH_DELAY_MS, flushNow } from './feed';
import { failureKindOf, failureMessage, rootCause } from './failure-info';
import { MAX_SANDBOX_REPLACEMENTS, afterOwnerGone } from '../core/routing';
import { DEFAULT_SANDBOX_PROBE_SECONDS, SANDBOX_PROBE_PATCH, afterProbe, deathMessage, idleProbeDelayMs, sandboxAction, type ProbeOutcome } from '../core/sandbox-probe';
import { onOwner, ownerGoneOf } from './owner';
import { OWNER_ROUTING, ownerProbeSignal, releaseSandboxSignal, sandboxEndedSignal, sandboxReadySignal, sandboxStateQuery, sandboxWorkflow } from './sandbox';
import {
  LEDGER_KEPT_BY_STREAM,
  agentStepOutcome,
  continueAsNewBefore,
  decide,
  gateStepOutcome,
  initialState,
  interpreterConfig,
  mergeStepOutcome,
  type RunnableStep,
  type StepFailure,
  type StepOutcome,
  type StreamDecision,
  type StreamInterpreterEvent,
  type StreamInterpreterState,
} from './stream-interpreter';

/**
 * What a stream carries into its next run when it continues as new (patch
 * `stream-continue-as-new`, docs/adr/0010-bounded-stream-history.md). Bounded: the interpreter's
 * state and the decisions it has not carried out yet, the last ledger entries (the objective
 * keeps the whole ledger and every agent run: the stream sends each one as it happens), and
 * whatever a signal or update left pending during the switch.
 */
export interface StreamCarried {
  /** This run's number (the first run is 1). */
  run: number;
  sandbox: SandboxInfo;
  /** The sandbox workflow already ended (it tells its owner by signal). */
  sandboxEnded?: SandboxResult;
  status: Omit<StreamStatus, 'agentRuns'>;
  interpreter: StreamInterpreterState;
  decisions: StreamDecision[];
  agentLoops: Record<string, AgentLoopState>;
  sessionId?: string;
  /** A merge decision or guidance that arrived and was not taken yet. */
  decision?: MergeDecision;
  guidance?: Guidance;
  /** The sandbox workflow's id, as the first run chose it (absent: the 0.1.0 `sandbox:` id), or its latest replacement. */
  sandboxWorkflowId?: string;
  /** The budget as the objective last told it (raises and the objective's state arrive by signal). */
  budget?: StreamBudget;
  /** Sandboxes recreated so far because their owner was gone (docs/adr/0013-worker-ownership.md). */
  sandboxReplacements?: number;
  /** The stream owns its sandbox itself, no sandbox workflow (patch `stream-owns-sandbox`, ADR 0032). */
  ownsSandbox?: true;
  /** A probe found the owned sandbox dead while the stream waited; it is recreated before the next step. */
  sandboxDied?: string;
}

export type StreamRunInput = StreamInput & { carried?: StreamCarried };

/** Sent by a stream to its objective when its work passed gates and review. */
export const streamMergeReadySignal = defineSignal<[MergeRequest]>('streamMergeReady');
/** One event per signal: how streams of 0.1.0 tell their objective (still handled for them). */
export const streamEventSignal = defineSignal<[StreamEvent]>('streamEvent');
/** A stream's buffered events, oldest first (phase changes, ledger entries, blocks, agent runs; ./feed). */
export const streamEventsSignal = defineSignal<[StreamEvent[]]>('streamEvents');
/** Sent by the objective's merge queue to tell the stream what became of its merge. */
export const mergeDecisionSignal = defineSignal<[MergeDecision]>('mergeDecision');
/** Human guidance for a blocked stream (`slipway mail send`). Validated: the stream must be blocked. */
export const guidanceUpdate = defineUpdate<GuidanceAck, [Guidance]>('guidance');
export const streamStatusQuery = defineQuery<StreamStatus>('streamStatus');
/** From the objective: the stream's limit was raised, or the objective's limit was reached or raised. */
export const streamBudgetSignal = defineSignal<[StreamBudgetUpdate]>('streamBudget');
/** To the objective, from a stream under the objective's limit before each agent run: may it start one? Answered by `streamBudgetSignal`. */
export const budgetLeaseSignal = defineSignal<[LeaseRequest]>('budgetLease');

export { MAX_RATE_LIMIT_WAITS } from './stream-interpreter';
export { failureKindOf, failureMessage } from './failure-info';

/** Stream events go to the objective in batches (`streamEventsSignal`) instead of one signal each. */
const BATCHED_STREAM_EVENTS = 'batched-stream-events';
/**
 * The merge request rides in the events batch (an event with `mergeRequest`) instead of its own
 * `streamMergeReady` signal, and entering `merge_ready` no longer sends a batch ahead of it.
 */
const MERGE_REQUEST_IN_EVENTS = 'merge-request-in-events';
/**
 * A batch sent before the feed's flush timer fires (the stream acted: merge request, block, end)
 * cancels the timer, whose firing would be a workflow task with nothing left to send (ADR 0034).
 */
const FEED_TIMER_CANCELLED = 'feed-timer-cancelled';
/**
 * The stream's sandbox workflow is `stream-sandbox:<objective>.<stream>`; 0.1.0 named it
 * `sandbox:...`, the prefix of the service's sandbox workflows.
 */
const STREAM_SANDBOX_ID = 'stream-sandbox-workflow-id';
/**
 * An agent run, and passing gates, commit the sandbox's work and collect its head at their end
 * instead of a `commitWork` after each run and another before the merge request (ADR 0034).
 */
const COMMIT_IN_STEP = 'commit-in-step';
/** How long a stream waits for a dead sandbox's workflow to remove its records before it makes the next one anyway. */
const DEAD_SANDBOX_CLEANUP_MS = 15 * 60_000;
/**
 * The stream creates, probes and destroys its sandbox itself instead of starting a sandbox
 * workflow for it (docs/adr/0032-stream-owns-its-sandbox.md): a child start, three signals and
 * about six workflow tasks fewer per stream.
 */
const STREAM_OWNS_SANDBOX = 'stream-owns-sandbox';
/**
 * The stream's final event goes to the objective while its sandbox is removed, instead of the
 * removal waiting for the signal's delivery (a workflow task of its own); the run still ends only
 * after both (docs/adr/0037).
 */
const CLEANUP_WITH_FINAL_EVENT = 'cleanup-with-final-event';

function toStepFailure(err: unknown): StepFailure {
  const cause = rootCause(err);
  const details = cause instanceof ApplicationFailure ? (cause.details?.[0] as { resetAt?: string } | undefined) : undefined;
  const summary = failureMessage(err);
  return { kind: failureKindOf(err), summary, details: summary, resetAt: details?.resetAt };
}

export async function streamWorkflow(input: StreamRunInput): Promise<StreamResult> {
  // First, before any command: the baseline is decided in the run's first workflow task (./patches).
  const patched = patchesOf(STREAM_BASELINE);
  const { objective, stream, carried } = input;
  // Runs started before this change keep 0.1.0's command sequence: one run, the sandbox a child
  // cancelled with the stream. Newer ones continue as new once per fix iteration.
  const bounded = carried !== undefined || patched('stream-continue-as-new');
  // Runs that started a sandbox workflow keep it until they end (ADR 0032).
  const owns = carried ? carried.ownsSandbox === true : bounded && patched(STREAM_OWNS_SANDBOX);
  const branch = streamBranch(objective.id, stream.id);
  const status: StreamStatus = carried
    ? { ...carried.status, ledger: [...carried.status.ledger] }
    : { streamId: stream.id, phase: 'provisioning', iteration: 0, branch, ledger: [], usage: emptyTotals() };
  let sandbox: SandboxInfo | undefined = carried?.sandbox;
  let decision: MergeDecision | undefined = carried?.decision;
  let guidance: Guidance | undefined = carried?.guidance;
  let sandboxEnded: SandboxResult | undefined = carried?.sandboxEnded;
  /** The owned sandbox's lifecycle, as a sandbox workflow's was (`sandboxState` query, SlipwaySandboxState). */
  let boxState: SandboxState = carried?.sandboxDied !== undefined ? 'failed' : 'ready';
  let boxError: string | undefined = carried?.sandboxDied;
  let budget: StreamBudget | undefined = carried ? carried.budget : input.budget;
  /** Why no new agent run may start (a spent budget), or undefined. */
  const budgetHold = () => streamBudgetBlock(budget, stream.id, status.usage);
  let leaseAsked = 0;
  let leaseAnswered = 0;
  /**
   * Before each agent run: the stream's own check, then, under the objective's limit, the
   * objective's answer (after this stream's last run reached it: emit awaits that signal). A
   * refusal comes as `objectiveExhausted`, which a raise clears like any other.
   */
  const beforeRun = async (): Promise<string | undefined> => {
    const held = budgetHold();
    if (held !== undefined || !budget?.leased) return held;
    const seq = ++leaseAsked;
    // An objective that is gone cannot answer: the stream goes on under its own limit.
    const asked = await parent.signal(budgetLeaseSignal, { streamId: stream.id, seq }).then(
      () => true,
      () => false,
    );
    if (asked) await condition(() => leaseAnswered >= seq);
    return budgetHold();
  };
  /** Set once this run hands over to the next: the sandbox stays, nothing is finished. */
  let carrying = false;
  const parent = getExternalWorkflowHandle(input.parentWorkflowId);

  setHandler(streamStatusQuery, () => status);
  // The stream answers for its sandbox as the sandbox workflow did (status, Web UI, tests).
  if (owns) setHandler(sandboxStateQuery, () => ({ state: boxState, info: sandbox, error: boxError }));
  setHandler(sandboxReadySignal, (info) => {
    sandbox = info;
  });
  setHandler(mergeDecisionSignal, (d) => {
    decision = d;
  });
  setHandler(sandboxEndedSignal, (result) => {
    // A sandbox given up for a gone owner still ends later; only the current one counts.
    if (result.workflowId !== undefined && result.workflowId !== boxWorkflowId) return;
    sandboxEnded ??= result;
  });
  setHandler(ownerProbeSignal, () => undefined);
  setHandler(streamBudgetSignal, (update) => {
    const next: StreamBudget = { ...(budget ?? { onExhausted: 'block' }) };
    if (update.limit) next.limit = update.limit;
    if (update.objectiveExhausted === null) delete next.objectiveExhausted;
    else if (update.objectiveExhausted !== undefined) next.objectiveExhausted = update.objectiveExhausted;
    budget = next;
    if (update.lease !== undefined) leaseAnswered = Math.max(leaseAnswered, update.lease);
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
    ...(carried ? [{ key: SlipwayPhase, value: status.phase }] : []),
    ...(carried && owns ? [{ key: SlipwaySandboxState, value: boxState }] : []),
  ]);

  /**
   * Tells the objective (feed line, phase, block state, ledger entry). Best effort: the parent
   * may be gone. Events are buffered and sent in batches (./feed decides when), each batch
   * after the one before it; a line waits at most FEED_FLUSH_DELAY_MS.
   */
  const pendingEvents: StreamEvent[] = [];
  let sending: Promise<void> = Promise.resolve();
  let flusherStarted = false;
  /** The flush timer while it runs (FEED_TIMER_CANCELLED), and whether a batch sent before it fired cancelled it. */
  let flushTimer: { scope: CancellationScope; cancelled: boolean } | undefined;
  const flushEvents = () => {
    while (pendingEvents.length > 0) {
      const batch = pendingEvents.splice(0, FEED_BATCH_LIMIT);
      sending = sending.then(() => parent.signal(streamEventsSignal, batch).catch(() => undefined));
    }
    if (flushTimer && !flushTimer.cancelled) {
      // Nothing is left for it to send: its firing would be a workflow task for nothing.
      flushTimer.cancelled = true;
      flushTimer.scope.cancel();
    }
    return sending;
  };
  /** Waits FEED_FLUSH_DELAY_MS; false when a batch went out meanwhile and cancelled the wait. */
  const flushDelay = async (): Promise<boolean> => {
    if (!patched(FEED_TIMER_CANCELLED)) {
      await sleep(FEED_FLUSH_DELAY_MS);
      return true;
    }
    const timer = { scope: new CancellationScope(), cancelled: false };
    flushTimer = timer;
    try {
      await timer.scope.run(() => sleep(FEED_FLUSH_DELAY_MS));
      return true;
    } catch (err) {
      if (timer.cancelled && isCancellation(err)) return false;
      throw err;
    } finally {
      if (flushTimer === timer) flushTimer = undefined;
    }
  };
  const emit = async (text: string, extra: Partial<StreamEvent> = {}) => {
    const event: StreamEvent = { streamId: stream.id, at: new Date().toISOString(), phase: status.phase, iteration: status.iteration, text, usage: { ...status.usage }, ...extra };
    if (!patched(BATCHED_STREAM_EVENTS)) {
      await parent.signal(streamEventSignal, event).catch(() => undefined);
      return;
    }
    pendingEvents.push(event);
    // Under a budget the objective counts every run at once: its limit is reached no later than needed.
    const requestInEvents = event.phase === 'merge_ready' && patched(MERGE_REQUEST_IN_EVENTS);
    if (flushNow(event, { requestInEvents }) || (budget && extra.agentRun)) return flushEvents();
    if (!flusherStarted) {
      flusherStarted = true;
      void (async () => {
        for (;;) {
          await condition(() => pendingEvents.length > 0);
          if (await flushDelay()) await flushEvents();
        }
      })().catch((err) => {
        // A cancelled stream stops sending; anything else is a bug and fails the workflow task.
        if (!isCancellation(err)) throw err;
      });
    }
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
  /** The final event on its way (CLEANUP_WITH_FINAL_EVENT), awaited after the sandbox's removal. */
  let finalReport: Promise<void> | undefined;
  const finish = async (result: Omit<StreamResult, 'streamId' | 'branch' | 'iterations' | 'ledger' | 'usage'>, text: string): Promise<StreamResult> => {
    status.failure = result.failure;
    const told = enter(result.status === 'merged' ? 'merged' : result.status === 'escalated' ? 'escalated' : 'failed', text);
    if (patched(CLEANUP_WITH_FINAL_EVENT)) finalReport = told;
    else await told;
    return { streamId: stream.id, branch, iterations: status.iteration, ledger: status.ledger, usage: status.usage, ...result };
  };

  // --- sandbox ---------------------------------------------------------------------------------
  const sandboxId = streamSandboxId(objective.id, stream.id);
  // An owned sandbox has no workflow: the id stays unused (and asks no patch).
  let boxWorkflowId = carried ? (carried.sandboxWorkflowId ?? sandboxWorkflowId(sandboxId)) : owns || patched(STREAM_SANDBOX_ID) ? streamSandboxWorkflowId(sandboxId) : sandboxWorkflowId(sandboxId);
  const sandboxArgs = (): SandboxInput => ({
    sandboxId,
    provider: 'local',
    repository: objective.repository,
    objectiveId: objective.id,
    name: stream.id,
    branch,
    base: input.base,
    ownerWorkflowId: workflowInfo().workflowId,
    options: input.sandbox,
    ...(input.ownerGraceSeconds ? { ownerGraceSeconds: input.ownerGraceSeconds } : {}),
    ...(bounded ? { notifyOwnerOnEnd: true, ...(input.sandboxOwnerProbeMs ? { ownerProbeMs: input.sandboxOwnerProbeMs } : {}) } : {}),
    ...(input.sandboxHistoryLimit ? { historyLimit: input.sandboxHistoryLimit } : {}),
  });
  // --- the sandbox the stream owns itself (ADR 0032): create, probe (in interpret), destroy ---
  /** Activities on the owned sandbox run on the worker that holds it (ADR 0013). */
  const boxActs = (info: SandboxInfo, retry?: RetrySpec) => gitActivities(retry, info.owner !== undefined ? ownerRoute(info.owner, { graceSeconds: input.ownerGraceSeconds }) : undefined);
  const setBox = (next: SandboxState, error?: string) => {
    boxState = next;
    boxError = error;
    // Only the states worth filtering on: a live sandbox, and how it ended.
    if (next !== 'pending' && next !== 'terminating') upsertSearchAttributes([{ key: SlipwaySandboxState, value: next }]);
  };
  /** Makes the stream's sandbox from `base` on whichever worker takes the create (its owner from then on); the error when it could not. */
  const createBox = async (base: string): Promise<string | undefined> => {
    setBox('pending');
    try {
      // Not cancellable: a sandbox half made when the stream is cancelled would have nobody to remove it.
      const info = await CancellationScope.nonCancellable(() => gitActivities().createSandbox({ ...sandboxArgs(), base }));
      sandbox = info;
      status.sandboxPath = info.path;
      setBox('ready');
      return undefined;
    } catch (err) {
      if (!(err instanceof TemporalFailure) || isCancellation(err)) throw err;
      const error = failureMessage(err);
      log.warn('sandbox provisioning failed', { sandboxId, error });
      setBox('failed', error);
      return error;
    }
  };
  /**
   * Removes an owned sandbox on its owner (records too, when it died outside Slipway). One whose
   * owner is gone stays on that host for the janitor; a cleanup problem never changes the stream's outcome.
   */
  const destroyBox = (info: SandboxInfo) =>
    CancellationScope.nonCancellable(async () => {
      const dead = boxError;
      setBox('terminating', dead);
      try {
        await onOwner(info.owner, () => boxActs(info).destroySandbox({ repository: objective.repository, path: info.path }));
      } catch (err) {
        if (!(err instanceof TemporalFailure)) throw err;
        const gone = ownerGoneOf(err) !== undefined;
        log.warn(gone ? 'the owner of the sandbox is gone; its worktree stays on its host for the janitor' : 'could not remove the sandbox; the janitor removes it once the objective ends', { path: info.path, owner: info.owner, error: failureMessage(err) });
      }
      setBox(dead !== undefined ? 'failed' : 'terminated', dead);
    });
  let createFailure: string | undefined;
  if (!carried && owns) {
    await enter('provisioning', `creating a sandbox for \`${branch}\``);
    createFailure = await createBox(input.base);
  } else if (!carried) {
    await enter('provisioning', `starting a sandbox for \`${branch}\``);
    const sandboxHandle = await startChild(sandboxWorkflow, {
      workflowId: boxWorkflowId,
      args: [sandboxArgs()],
      // A bounded stream continues as new, which closes the run that started the sandbox: the
      // sandbox must outlive it. Every run releases it on the way out (also when cancelled).
      parentClosePolicy: bounded ? ParentClosePolicy.ABANDON : ParentClosePolicy.REQUEST_CANCEL,
      staticSummary: `Sandbox for stream ${stream.id} of ${objective.id}`,
      staticDetails: `Local git worktree on branch \`${branch}\`, started from \`${input.base}\`.`,
    });
    const first = boxWorkflowId;
    void sandboxHandle.result().then(
      (result) => {
        if (boxWorkflowId === first) sandboxEnded ??= result;
      },
      (err) => {
        if (boxWorkflowId === first) sandboxEnded ??= { sandboxId, state: 'failed', error: failureMessage(err) };
      },
    );
  }
  const release = () =>
    CancellationScope.nonCancellable(async () => {
      if (owns) {
        if (sandbox) await destroyBox(sandbox);
        return;
      }
      if (sandboxEnded) return;
      try {
        await getExternalWorkflowHandle(boxWorkflowId).signal(releaseSandboxSignal);
      } catch (err) {
        // The sandbox workflow is gone (ended by hand): nothing to release, and the stream's
        // outcome stays what it was; a cleanup problem never changes it.
        if (!(err instanceof TemporalFailure)) throw err;
        log.warn('could not release the sandbox', { sandbox: boxWorkflowId, error: failureMessage(err) });
        return;
      }
      await condition(() => sandboxEnded !== undefined);
    });

  try {
    if (!owns) await condition(() => sandbox !== undefined || sandboxEnded !== undefined);
    if (!sandbox) {
      const summary = `sandbox could not be created: ${(owns ? createFailure : sandboxEnded!.error) ?? 'unknown error'}`;
      await record({ step: 'sandbox', kind: 'sandbox_failure', action: FAILURE_KINDS.sandbox_failure.action, attempt: 1, maxAttempts: 1, summary, result: 'failed' }, `sandbox_failure: ${summary}`);
      return await finish({ status: 'failed', failure: { kind: 'sandbox_failure', summary } }, summary);
    }
    status.sandboxPath = sandbox.path;
    return await interpret(sandbox);
  } catch (err) {
    // Only Temporal failures end the stream as failed: a bug fails the workflow task instead,
    // and a fixed deploy resumes the run.
    if (!(err instanceof TemporalFailure) || isCancellation(err)) throw err;
    const summary = failureMessage(err);
    return await finish({ status: 'failed', failure: { kind: failureKindOf(err), summary } }, summary);
  } finally {
    if (!carrying) await release();
    await finalReport;
  }


  // --- the shell of the blueprint interpreter (workflows/stream-interpreter.ts decides) ---------------
  async function interpret(firstBox: SandboxInfo): Promise<StreamResult> {
    const config = interpreterConfig(input);
    const bp = input.blueprint;
    let box = firstBox;
    // Every activity on the sandbox runs on the worker that holds it (docs/adr/0013-worker-ownership.md).
    const owned = box.owner !== undefined && (owns || patched(OWNER_ROUTING));
    const graceSeconds = input.ownerGraceSeconds;
    const route = () => (owned ? ownerRoute(box.owner, { graceSeconds }) : undefined);
    const agentRoute = () => (owned ? ownerRoute(box.owner, { graceSeconds, agents: true }) : undefined);
    const git = () => gitActivities(undefined, route());
    /** The owner found gone by the last call on it; the sandbox is recreated before the step is retried. */
    let lostOwner: string | undefined;
    const onBox = <T>(call: () => Promise<T>): Promise<T> =>
      onOwner(owned ? box.owner : undefined, call).catch((err) => {
        lostOwner ??= ownerGoneOf(err);
        throw err;
      });
    let replacements = carried?.sandboxReplacements ?? 0;
    // Probing the sandbox after a failed step, and recreating one that died (core/sandbox-probe.ts).
    const probing = owns || patched(SANDBOX_PROBE_PATCH);
    /** Asks the provider whether the owned sandbox is still there (core/sandbox-probe.ts decides); why it died, when it did. */
    const probeBox = async (): Promise<string | undefined> => {
      const outcome: ProbeOutcome = await onBox(() => boxActs(box, { maximumAttempts: 2 }).probeSandbox({ path: box.path })).catch((err: unknown) => {
        if (isCancellation(err) || !(err instanceof TemporalFailure)) throw err;
        return { failed: failureMessage(err) };
      });
      const next = afterProbe(outcome);
      if (next.action === 'keep_watching') return undefined;
      log.warn('the sandbox died outside Slipway', { sandboxId, error: next.error });
      setBox('failed', next.error);
      return next.error;
    };
    const probeMs = (input.sandbox?.probeSeconds ?? DEFAULT_SANDBOX_PROBE_SECONDS) * 1000;
    /**
     * Waits until `done` (or `forMs` passed: false). The owned sandbox is probed only while the
     * stream waits like this, first after probe_seconds and then less and less often
     * (idleProbeDelayMs): a wait shorter than probe_seconds costs no workflow task, a long one a
     * bounded history. A sandbox that dies while a step runs fails the step, which probes it.
     */
    const idle = async (done: () => boolean, forMs?: number): Promise<boolean> => {
      const until = forMs === undefined ? undefined : Date.now() + forMs;
      for (let probes = 0; ; probes++) {
        if (done()) return true;
        // Not once the owner was found gone: the next step recreates the sandbox elsewhere.
        const probeIn = boxState === 'ready' && lostOwner === undefined ? idleProbeDelayMs(probeMs, probes) : undefined;
        const left = until === undefined ? undefined : until - Date.now();
        const wait = probeIn === undefined ? left : left === undefined ? probeIn : Math.min(probeIn, left);
        if (wait === undefined) {
          await condition(done);
          return true;
        }
        if (await condition(done, Math.max(1, wait))) return true;
        if (until !== undefined && Date.now() >= until) return false;
        await probeBox();
      }
    };
    /** Why the current sandbox is dead, when it is: its workflow ended (its own probe saw it), or a probe now says so. */
    const sandboxDeath = async (askNow: boolean): Promise<string | undefined> => {
      if (owns) return boxState === 'failed' ? (boxError ?? 'the sandbox failed') : askNow ? probeBox() : undefined;
      if (sandboxEnded) return sandboxEnded.error ?? `the sandbox workflow ended (${sandboxEnded.state})`;
      if (!askNow) return undefined;
      const liveness = await onBox(() => gitActivities({ maximumAttempts: 2 }, route()).probeSandbox({ path: box.path })).catch((err: unknown) => {
        if (isCancellation(err) || !(err instanceof TemporalFailure)) throw err;
        return { alive: true as const };
      });
      return liveness.alive ? undefined : deathMessage(liveness);
    };
    /** Recreates the sandbox (recorded in the ledger) when its owner is gone or it died; false when nothing was done. */
    const recoverSandbox = async (stepId: string, ownerGone: string | undefined, died: string | undefined, failure?: string): Promise<boolean> => {
      const next = sandboxAction({ ownerGone, died, replacementsSoFar: replacements });
      if (next.action !== 'recreate') return false;
      const where = next.why === 'died' ? `: ${next.summary}` : ' on another worker';
      // A gone owner's step failure says which call found it gone; a death's reason is the probe's.
      const summary = next.why === 'owner_gone' && failure ? failure : next.summary;
      await record(
        { step: stepId, kind: 'sandbox_failure', action: 'recreate_sandbox', attempt: replacements + 1, maxAttempts: MAX_SANDBOX_REPLACEMENTS, summary, result: 'retrying' },
        `sandbox_failure -> recreate the sandbox from ${branch}${where} (${replacements + 1}/${MAX_SANDBOX_REPLACEMENTS})`,
      );
      await replaceSandbox(next.why);
      return true;
    };
    /**
     * A new sandbox for the stream on a live worker, from the branch's last commit: the old one
     * is released (its owner is gone; its sandbox workflow gives up removing it after the grace time).
     */
    const replaceSandbox = async (why: 'owner_gone' | 'died') => {
      if (owns) {
        // A dead sandbox's records go first: the new one takes the same place (a remote
        // provider's record, a worktree path). A gone owner cannot remove anything: its janitor does.
        if (why === 'died') await destroyBox(box);
        else log.warn('the owner of the sandbox is gone; its worktree stays on its host for the janitor', { path: box.path, owner: box.owner });
        replacements += 1;
        sandbox = undefined;
        const error = await createBox(branch);
        if (!sandbox) throw ApplicationFailure.create({ type: 'sandbox_failure', nonRetryable: true, message: `the sandbox could not be recreated: ${error ?? 'unknown error'}` });
        box = sandbox;
        return;
      }
      const old = boxWorkflowId;
      await getExternalWorkflowHandle(old).signal(releaseSandboxSignal).catch(() => undefined);
      // A dead sandbox's workflow removes its records first: the new one takes the same place (a
      // remote provider's record, a worktree path). A gone owner's cannot, and is not waited for.
      if (why === 'died') await condition(() => sandboxEnded !== undefined, DEAD_SANDBOX_CLEANUP_MS);
      replacements += 1;
      boxWorkflowId = `${streamSandboxWorkflowId(sandboxId)}.r${replacements}`;
      sandbox = undefined;
      sandboxEnded = undefined;
      await startChild(sandboxWorkflow, {
        workflowId: boxWorkflowId,
        args: [{ ...sandboxArgs(), base: branch, notifyOwnerOnEnd: true }],
        parentClosePolicy: ParentClosePolicy.ABANDON,
        staticSummary: `Sandbox for stream ${stream.id} of ${objective.id} (replaces ${old})`,
      });
      await condition(() => sandbox !== undefined || sandboxEnded !== undefined);
      if (!sandbox) throw ApplicationFailure.create({ type: 'sandbox_failure', nonRetryable: true, message: `the sandbox could not be recreated: ${sandboxEnded!.error ?? 'unknown error'}` });
      box = sandbox;
      status.sandboxPath = box.path;
    };
    let sessionId: string | undefined = carried?.sessionId;
    /** The head the last step left committed and collected (COMMIT_IN_STEP): the merge request needs no commit of its own. */
    let committedHead: string | undefined;
    // A step re-entered after a rate-limit wait or guidance continues its iteration loop where it stopped.
    const agentLoops: Record<string, AgentLoopState> = { ...carried?.agentLoops };

    const history = () => status.ledger.map((e) => `${e.step}: ${e.kind} -> ${e.action} (${e.attempt}/${e.maxAttempts}) ${e.result}: ${e.summary}`);
    const addUsage = (run: AgentRunResult) => addRunUsage(status.usage, { ...run.usage, cachedTokens: run.usage.cachedTokens ?? 0 });

    const runAgentStep = async (step: Extract<Step, { type: 'agent' }>, feedback: Feedback | undefined, rebuilt: string | undefined, budgetWaived: boolean): Promise<StepOutcome> => {
      const spec = input.agents[step.role]!;
      const loop = (agentLoops[step.id] ??= newAgentLoop());
      const commitMessage = (agentIteration: number) =>
        step.role === 'builder'
          ? `slipway(${stream.id}): iteration ${status.iteration}${spec.max_iterations > 1 ? `, run ${agentIteration}` : ''}\n\n${stream.task}`
          : `slipway(${stream.id}): left by the ${step.role} (iteration ${status.iteration})`;
      const commitInRun = patched(COMMIT_IN_STEP);
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
            ...(rebuilt ? { rebuilt } : {}),
            resumeSessionId: step.role === 'builder' ? sessionId : undefined,
          },
          step: step.id,
          retry: retryFor(bp, step),
          state: loop,
          ...(budgetWaived ? {} : { beforeRun, allowance: () => runAllowance(budget, stream.id, status.usage) }),
          route: agentRoute(),
          owner: owned ? box.owner : undefined,
          ...(commitInRun ? { commitMessage } : {}),
          onRun: async (run, record) => {
            addUsage(run);
            (status.agentRuns ??= []).push(record);
            committedHead = run.commit?.head;
            if (step.role === 'builder') {
              sessionId = run.sessionId ?? sessionId;
              if (!run.commit) await onBox(() => git().commitWork({ path: box.path, message: commitMessage(record.agentIteration) }));
            }
            const ending = record.result === 'signalled' ? '; completion signal' : record.result === 'invalid_output' ? '; answer unusable' : record.result === 'budget_stopped' ? '; stopped at the budget (hard_limit)' : '';
            const text = `${step.role} run ${record.agentIteration}/${record.maxIterations} (${spec.provider}): ${formatUsage(record)}${ending}`;
            setCurrentDetails(`**${status.phase}** at step \`${step.id}\`${status.iteration ? ` (iteration ${status.iteration})` : ''} — ${text}\n\nStream usage: ${formatTotals(status.usage)}`);
            await emit(text, { agentRun: record });
          },
        });
        // Held back by the budget: the loop goes on at the same run once it may.
        if (outcome.ok || outcome.kind !== 'budget_exhausted') delete agentLoops[step.id];
        return agentStepOutcome(step, outcome);
      } catch (err) {
        if (isCancellation(err)) throw err;
        lostOwner ??= ownerGoneOf(err);
        return { ok: false, failure: toStepFailure(err) };
      }
    };

    const runStep = async (step: RunnableStep, feedback: Feedback | undefined, rebuilt?: string, budgetWaived = false): Promise<StepOutcome> => {
      // Known only right after the step that committed it: any other step may change the sandbox.
      const committed = committedHead;
      committedHead = undefined;
      if (step.type === 'agent') return runAgentStep(step, feedback, rebuilt, budgetWaived);
      if (step.action === 'run_quality_gates') {
        const timeout = input.gates.reduce((sum, g) => sum + g.timeout_seconds, 0);
        const commit = patched(COMMIT_IN_STEP) ? { commit: { message: `slipway(${stream.id}): left after the gates (iteration ${status.iteration})` } } : {};
        try {
          const gates = await onBox(() => gateActivities(timeout, retryFor(bp, step), route()).runGates({ path: box.path, gates: input.gates, ...commit }));
          committedHead = gates.commit?.head;
          return gateStepOutcome(gates);
        } catch (err) {
          if (isCancellation(err)) throw err;
          return { ok: false, failure: toStepFailure(err) };
        }
      }
      // signal_merge_ready: hand the head to the merge queue and wait for its decision.
      let head;
      try {
        head = committed !== undefined ? { head: committed } : await onBox(() => git().commitWork({ path: box.path, message: `slipway(${stream.id}): leftovers before merge` }));
      } catch (err) {
        if (!lostOwner) throw err;
        return { ok: false, failure: toStepFailure(err) };
      }
      decision = undefined;
      const request: MergeRequest = { streamId: stream.id, branch: box.branch, headCommit: head.head };
      // With the events before it, in one batch (sent at once: flushNow).
      if (patched(MERGE_REQUEST_IN_EVENTS)) await emit(`ready to merge ${head.head.slice(0, 10)}`, { mergeRequest: request });
      else await parent.signal(streamMergeReadySignal, request);
      if (owns) await idle(() => decision !== undefined);
      else await condition(() => decision !== undefined);
      return mergeStepOutcome(decision!);
    };

    /**
     * Blocks until a human sends guidance through the update, and returns the event that ends the
     * block. A spent budget also ends when the objective says it was raised (no guidance then).
     */
    const blockForGuidance = async (d: Extract<StreamDecision, { type: 'block_for_guidance' }>): Promise<StreamInterpreterEvent> => {
      const blocked: BlockedInfo = { mailbox: d.mailbox, since: new Date().toISOString(), step: d.step, kind: d.kind, summary: d.summary };
      const forBudget = d.kind === 'budget_exhausted';
      status.blocked = blocked;
      status.phase = 'blocked';
      upsertSearchAttributes([{ key: SlipwayPhase, value: 'blocked' }]);
      const send = `\`slipway mail send ${blocked.mailbox} "subject" "body" --objective ${objective.id}\``;
      setCurrentDetails(
        `**blocked** at step \`${d.step}\` — ${d.summary}\n\n${forBudget ? `Raise the budget: \`slipway budget raise ${objective.id} --stream ${stream.id} --usd N\` (or without --stream for the objective's), or let it go on: ${send}` : `Send guidance: ${send}`}`,
      );
      await emit(forBudget ? `budget spent: ${d.summary}; awaiting a raise or guidance (mailbox ${blocked.mailbox})` : `recovery blocked: retry budget exhausted; awaiting guidance (mailbox ${blocked.mailbox})`, { blocked, phase: 'blocked' });
      const answered = () => guidance !== undefined || (forBudget && budgetHold() === undefined);
      if (owns) await idle(answered);
      else await condition(answered);
      const received = guidance;
      guidance = undefined;
      status.blocked = undefined;
      await emit(received ? `guidance applied; resuming at step ${d.step}` : `budget raised; resuming at step ${d.step}`, { blocked: null });
      if (forBudget) return { type: 'budget_available', ...(received ? { guidance: received } : {}) };
      return { type: 'guidance_received', guidance: received! };
    };

    /** Hands the stream over to a new run that carries out `decisions` first. */
    const continueWith = async (state: StreamInterpreterState, decisions: StreamDecision[]): Promise<never> => {
      // Buffered feed events go first (the new run starts with an empty buffer), then handlers:
      // a signal or update taken during the switch is carried, never dropped.
      await flushEvents();
      await condition(allHandlersFinished);
      carrying = true;
      const { agentRuns: _runs, ...kept } = status;
      return continueAsNew<typeof streamWorkflow>({
        ...input,
        carried: {
          run: (carried?.run ?? 1) + 1,
          sandbox: box,
          ...(sandboxEnded ? { sandboxEnded } : {}),
          status: { ...kept, ledger: status.ledger.slice(-LEDGER_KEPT_BY_STREAM) },
          interpreter: state,
          decisions,
          agentLoops,
          ...(sessionId ? { sessionId } : {}),
          ...(decision ? { decision } : {}),
          ...(guidance ? { guidance } : {}),
          sandboxWorkflowId: boxWorkflowId,
          ...(budget ? { budget } : {}),
          ...(replacements > 0 ? { sandboxReplacements: replacements } : {}),
          ...(owns ? { ownsSandbox: true as const, ...(boxState === 'failed' ? { sandboxDied: boxError } : {}) } : {}),
        },
      });
    };

    let state = carried?.interpreter ?? initialState();
    let carriedDecisions = carried?.decisions;
    let event: StreamInterpreterEvent = { type: 'start' };
    let stepsRun = 0;
    for (;;) {
      let decisions: StreamDecision[];
      if (carriedDecisions) {
        decisions = carriedDecisions;
        carriedDecisions = undefined;
      } else {
        const decided = decide(config, state, event);
        state = decided.state;
        decisions = decided.decisions;
        const info = workflowInfo();
        if (bounded && continueAsNewBefore(decisions, { stepsRun, historyLength: info.historyLength, suggested: info.continueAsNewSuggested })) {
          return await continueWith(state, decisions);
        }
      }
      let next: StreamInterpreterEvent | undefined;
      for (const d of decisions) {
        switch (d.type) {
          case 'enter_step':
            status.step = d.step;
            status.iteration = d.iteration;
            await enter(d.phase, d.details);
            break;
          case 'record':
            await record(d.entry, d.text);
            break;
          case 'run_step': {
            stepsRun += 1;
            // A sandbox that died while the stream waited (merge queue, guidance) is made again first.
            if (probing) {
              // Or its owner was found gone while the stream waited (an idle probe).
              const gone = lostOwner;
              lostOwner = undefined;
              await recoverSandbox(d.step.id, gone, gone === undefined ? await sandboxDeath(false) : undefined);
            }
            let outcome = await runStep(d.step, d.feedback, d.rebuilt, d.budgetWaived === true);
            if (probing) {
              // The worker holding the sandbox is gone, or the sandbox died outside Slipway: the
              // step runs again in a new sandbox from the branch (bounded); Temporal's retries cannot.
              while (!outcome.ok) {
                const gone = lostOwner;
                lostOwner = undefined;
                if (!(await recoverSandbox(d.step.id, gone, gone === undefined ? await sandboxDeath(true) : undefined, outcome.failure.summary))) break;
                outcome = await runStep(d.step, d.feedback, d.rebuilt, d.budgetWaived === true);
              }
            }
            // Runs without the probe keep their commands.
            while (lostOwner && !outcome.ok && afterOwnerGone(replacements) === 'recreate') {
              lostOwner = undefined;
              await record(
                { step: d.step.id, kind: 'sandbox_failure', action: 'recreate_sandbox', attempt: replacements + 1, maxAttempts: MAX_SANDBOX_REPLACEMENTS, summary: outcome.failure.summary, result: 'retrying' },
                `sandbox_failure -> recreate the sandbox from ${branch} on another worker (${replacements + 1}/${MAX_SANDBOX_REPLACEMENTS})`,
              );
              await replaceSandbox('owner_gone');
              outcome = await runStep(d.step, d.feedback, d.rebuilt, d.budgetWaived === true);
            }
            lostOwner = undefined;
            next = { type: 'step_finished', outcome, now: Date.now() };
            break;
          }
          case 'wait_for_rate_limit':
            status.phase = 'rate_limited';
            setCurrentDetails(`**rate_limited** — waiting until ${d.resetAt ?? 'back-off'}`);
            if (owns) await idle(() => false, d.waitMs);
            else await sleep(d.waitMs);
            next = { type: 'rate_limit_waited' };
            break;
          case 'reset_onto_integration': {
            committedHead = undefined;
            const reset = await onBox(() => git().resetOntoIntegration({ path: box.path, onto: input.integrationBranch }));
            next = { type: 'reset_onto_integration_done', previousDiff: reset.previousDiff };
            break;
          }
          case 'block_for_guidance':
            // Whoever answers may change the sandbox while the stream waits (slipway attach):
            // the head the last step committed is not the sandbox's any more.
            committedHead = undefined;
            next = await blockForGuidance(d);
            break;
          case 'finish':
            return await finish(d.result, d.text);
        }
      }
      if (!next) throw new Error(`the stream interpreter decided nothing to wait for (after ${event.type})`);
      event = next;
    }
  }
}
