/**
 * Objective workflow: interprets the objective's blueprint (`standard` by default): plan (or
 * take the streams from the file), optional human approval, one child stream workflow per work
 * item (bounded parallelism, dependencies respected), and the merge queue, which integrates
 * ready streams one at a time, or several waiting ones as a batch, into
 * `slipway/<objective>/integration` with post-merge gates.
 * It also gathers its streams' events into the live feed and recovery ledger.
 *
 * A thin shell: the decisions are pure modules, each table-tested without a server:
 * `./dispatch` (which streams start, from which commit), `./planner-step` (planning, approval,
 * the plan as streams, failed steps), `./feed` (the feed and stream events), `./merge-queue`
 * (one stream's merge), `./merge-batch` (batches and their bisection), `./objective-rollover`
 * (when a run continues as new). This file carries them out with Temporal.
 */
import {
  CancellationScope,
  ParentClosePolicy,
  TemporalFailure,
  allHandlersFinished,
  condition,
  continueAsNew,
  defineQuery,
  defineUpdate,
  getExternalWorkflowHandle,
  isCancellation,
  log,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  startChild,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { OBJECTIVE_BASELINE, patchesOf } from './patches';
import type { WorkflowEndActivities } from '../activities/workflow-ends';
import type { Blueprint, Step } from '../core/blueprint-schema';
import { FINAL_STREAM_PHASES } from '../core/states';
import { OBJECTIVE_STATUS_QUERY, streamWorkflowId } from '../core/ids';
import { SlipwayCostUsd, SlipwayKind, SlipwayObjective, SlipwayOutcome, SlipwayPhase } from '../core/search-attributes';
import { formatIssuePath, streamGraphIssues } from '../core/stream-graph';
import type { ObjectiveOutcome, ObjectivePhase } from '../core/states';
import {
  emptyTotals,
  type FeedEvent,
  type MergeDecision,
  type MergeRequest,
  type ObjectiveInput,
  type ObjectiveResult,
  type ObjectiveStatus,
  type ObjectiveStreamView,
  type StreamEvent,
  type StreamResult,
  type StreamSpec,
} from '../core/types';
import { addRunUsage, addTotals, formatUsage } from '../core/usage';
import { gateActivities, gitActivities, localGitActivities, ownerRoute } from './activity-options';
import { newAgentLoop, runAgentLoop, withRateLimitWaits } from './agent-runs';
import { fixLimit, nextStep, retryFor, startStep, stepById } from './blueprint-walker';
import { dispatch, streamStart, type DispatchDecision } from './dispatch';
import { failureKindOf, failureMessage } from './failure-info';
import { appendFeed, applyStreamEvent, emptyFeed, feedAfter, objectiveDetails } from './feed';
import { shouldContinueAsNew, streamsToAwaitAtEnd, trimCarry } from './objective-rollover';
import { mergeMessage, mergeQueueFinished, mergeStep, startMerge, type MergeEvent } from './merge-queue';
import { batchSize, batchStep, startBatch } from './merge-batch';
import { afterStepFailure, approvalNeeded, plannerRunInput, plannerStepAction, rateLimitWait, streamsFromPlan, type ObjectiveStepFailure } from './planner-step';
import { budgetLeaseSignal, MAX_RATE_LIMIT_WAITS, mergeDecisionSignal, streamBudgetSignal, streamEventSignal, streamEventsSignal, streamMergeReadySignal, streamWorkflow } from './stream';
import { budgetExhausted, formatLimit, objectiveLease, raisedLimit, raiseProblems, streamBudgetOf, type BudgetLimit, type BudgetRaise, type StreamBudgetUpdate } from '../core/budget';

export const objectiveStatusQuery = defineQuery<ObjectiveStatus>(OBJECTIVE_STATUS_QUERY);
/** Feed lines after `afterSeq` (for `slipway watch`), and whether the objective is done. */
export const objectiveFeedQuery = defineQuery<{ events: FeedEvent[]; done: boolean }, [number]>('objectiveFeed');
/** A human's decision on the plan (`slipway approve` / `slipway reject`). */
export const planDecisionUpdate = defineUpdate<{ accepted: true }, [{ approve: boolean; reason?: string }]>('planDecision');
/**
 * `slipway budget raise`: a new limit for the objective or one stream. Validated: positive
 * figures above what is already spent; the streams hear of it by signal.
 */
export const budgetRaiseUpdate = defineUpdate<{ objectiveId: string; stream?: string; limit: BudgetLimit }, [BudgetRaise]>('budgetRaise');

/**
 * Dependents start from their dependency's merge commit (./dispatch) instead of the integration
 * branch's name once that dependency has landed; before, they started when the stream reported
 * itself merged, at another point of the command sequence.
 */
const DISPATCH_FROM_MERGE_COMMIT = 'dispatch-from-merge-commit';
/** Streams are started with `ParentClosePolicy.ABANDON`, so the objective may continue as new while they run. */
const ABANDONED_CHILDREN = 'objective-children-abandoned';
/** The streams that may start are started together instead of one workflow task each. */
const PARALLEL_STARTS = 'parallel-stream-starts';
/** The objective's cost is kept in the `SlipwayCostUsd` search attribute (a command 0.1.0 never issued). */
const COST_ATTRIBUTE = 'objective-cost-attribute';
/** The merger worktree's activities run on the worker that prepared it (docs/adr/0013-worker-ownership.md). */
const MERGER_OWNER_ROUTING = 'merger-owner-routing';
/**
 * The merger worktree is made by its own activity in parallel with the first streams instead of
 * before them, and bare (git only: no ignored files, no project setup) when nothing else runs in it.
 */
const LAZY_MERGER = 'lazy-merger';
/** A remote repository is cloned by the worker that prepares the objective, which then holds it (docs/adr/0028). */
const REMOTE_REPOSITORY_ON_OWNER = 'remote-repository-on-owner';
/**
 * A stream's merge, post-merge gates and revert run in one activity (`mergeWithGates`) instead of
 * one each, and the next merge starts without waiting for the decision signal's round trip.
 */
const ONE_ACTIVITY_MERGE = 'one-activity-merge';
/**
 * Two or more streams waiting in the merge queue are merged and gated as one batch, bisected when
 * its post-merge gates fail (./merge-batch, docs/adr/0031-batch-merges.md).
 */
const BATCH_MERGE = 'batch-merge';
/**
 * A merger with nothing but git to do (the bare one of LAZY_MERGER) is the integration branch
 * alone, made by `prepareObjective`: merges need no worktree (docs/adr/0033), so no `prepareMerger`.
 */
const MERGER_WITHOUT_WORKTREE = 'merger-without-worktree';
/**
 * `prepareObjective` (resolve the base, claim the id: git on the user's repository, ~50 ms) is a
 * local activity on the worker running the objective, which then holds the merger as before
 * (ADR 0013): no activity task and no workflow task of its own (ADR 0034). A remote repository's
 * fetch stays an activity.
 */
const PREPARE_LOCALLY = 'prepare-objective-local';
/**
 * An objective with no merger worktree (MERGER_WITHOUT_WORKTREE) and no remote to push to ends
 * without `finishObjective`: there is nothing to remove or push, and the integration head is the
 * tip its own merges left (only the queue moves the branch, by compare-and-swap). One activity and
 * one workflow task less on the way to the result (docs/adr/0037).
 */
const FINISH_WITHOUT_ACTIVITY = 'finish-without-activity';
/**
 * A continued-as-new run takes a stream's final event as its end (it has no handle on the streams
 * an earlier run started), and that event is sent while the stream removes its sandbox (docs/adr/
 * 0037): its result waits until its streams have closed, so it never comes before that cleanup.
 */
const RESUMED_WAITS_FOR_STREAMS = 'resumed-waits-for-streams';
const workflowEnds = proxyActivities<WorkflowEndActivities>({ startToCloseTimeout: '10 minutes', retry: { maximumAttempts: 3 } });
/** How long a cancelled objective waits for its streams to clean up before it ends anyway. */
const STREAM_CANCEL_WAIT = '10 minutes';
/** Streams under an objective's limit ask it before each agent run (`budgetLeaseSignal`; ADR 0017, 3). */
const OBJECTIVE_BUDGET_LEASES = 'objective-budget-leases';

export function decideOutcome(streams: Pick<ObjectiveStreamView, 'phase'>[]): ObjectiveOutcome {
  const merged = streams.filter((s) => s.phase === 'merged').length;
  if (streams.length > 0 && merged === streams.length) return 'completed';
  // A stream whose work changed nothing did not fail, but its intent did not land either.
  const unchanged = streams.filter((s) => s.phase === 'no_changes').length;
  return merged > 0 || unchanged > 0 ? 'partial' : 'failed';
}

export async function objectiveWorkflow(input: ObjectiveInput): Promise<ObjectiveResult> {
  // First, before any command: the baseline is decided in the run's first workflow task (./patches).
  const patched = patchesOf(OBJECTIVE_BASELINE);
  const root = input.blueprint.root;
  const overrides = { maxFixIterations: input.maxFixIterations, onExhausted: input.onExhausted };
  const git = gitActivities(retryFor(root, root.steps[0]));
  const status: ObjectiveStatus = {
    objectiveId: input.id,
    phase: 'preparing',
    blueprint: root.id,
    integrationBranch: '',
    streams: [],
    mergeOrder: [],
    ledger: [],
    usage: emptyTotals(),
    needsAttention: [],
  };
  const resume = input.resume;
  if (resume) Object.assign(status, resume.status);
  else if (input.budget) status.budget = { ...input.budget };
  let feed = resume?.feed ?? emptyFeed();
  let done = false;
  let streams: StreamSpec[] = resume?.streams ?? input.streams;
  let planDecision: { approve: boolean; reason?: string } | undefined;
  const mergeQueue: MergeRequest[] = [...(resume?.mergeQueue ?? [])];
  /** Streams started and not ended. A resumed run knows them by id and hears their end through their final event. */
  const running = new Set<string>(resume?.running ?? []);
  const abandoned = new Set<string>(resume?.running ?? []);
  let cancelled = false;
  let childEnded = false;
  let streamBlueprintKey: string | undefined = resume?.streamBlueprint;
  let streamBlueprint: Blueprint | undefined = streamBlueprintKey ? input.blueprint.refs[streamBlueprintKey] : undefined;

  const view = (id: string) => status.streams.find((s) => s.id === id);
  const say = (source: string, text: string, at = new Date().toISOString()) => {
    feed = appendFeed(feed, { at, source, text });
  };
  const refreshBlocked = () => {
    const blocked = status.streams.some((s) => s.phase === 'blocked');
    const outcome = blocked ? 'blocked' : undefined;
    if (status.outcome !== outcome && !done) {
      status.outcome = outcome;
      upsertSearchAttributes([{ key: SlipwayOutcome, value: outcome ?? null }]);
    }
  };
  // The planner's runs count too; streams report theirs with their events.
  const plannerUsage = resume?.plannerUsage ?? emptyTotals();
  let costShown = resume?.status.usage.costUsd ?? 0;
  const sumUsage = () => {
    status.usage = status.streams.reduce((sum, s) => (s.usage ? addTotals(sum, s.usage) : sum), { ...plannerUsage });
    // Only when it changed: one command per change, not per event.
    if (status.usage.costUsd !== costShown && patched(COST_ATTRIBUTE)) {
      costShown = status.usage.costUsd;
      upsertSearchAttributes([{ key: SlipwayCostUsd, value: costShown }]);
    }
  };
  const details = () => objectiveDetails(status);
  const enter = (phase: ObjectivePhase, text: string) => {
    status.phase = phase;
    upsertSearchAttributes([{ key: SlipwayPhase, value: phase }]);
    say('objective', `${phase}: ${text}`);
    setCurrentDetails(details());
  };
  const applyEvent = (event: StreamEvent) => {
    const index = status.streams.findIndex((s) => s.id === event.streamId);
    if (index < 0) return;
    const v = (status.streams[index] = applyStreamEvent(status.streams[index], event));
    // Today's streams send their merge request in their events batch (workflows/stream.ts).
    if (event.mergeRequest) mergeQueue.push(event.mergeRequest);
    if (event.ledger) status.ledger.push(event.ledger);
    if (event.agentRun) (status.agentRuns ??= []).push(event.agentRun);
    // The run reported its cost (or the stream stopped running agents for now): no longer in flight.
    if (event.agentRun || event.blocked || event.ledger) releaseLease(event.streamId);
    say(event.streamId, event.text, event.at);
    // A resumed run has no handle on the streams it did not start: their final event is their end.
    if (resume && running.has(v.id) && FINAL_STREAM_PHASES.includes(event.phase)) {
      v.phase = event.phase;
      v.blocked = undefined;
      if (event.phase !== 'merged' && !v.failure) v.failure = { kind: 'unknown', summary: event.text };
      if (event.phase === 'escalated') status.needsAttention.push(v.id);
      running.delete(v.id);
      releaseLease(v.id);
      childEnded = true;
    }
  };
  /** Tells a running stream of a budget change. Best effort: a stream that ended needs no budget. */
  const tellStream = (id: string, update: StreamBudgetUpdate) =>
    getExternalWorkflowHandle(streamWorkflowId(input.id, id))
      .signal(streamBudgetSignal, update)
      .catch((err) => {
        if (!(err instanceof TemporalFailure)) throw err;
      });
  /** Once the objective's limit is reached, its running streams start no new agent run (docs/adr/0017). */
  const checkObjectiveBudget = () => {
    const budget = status.budget;
    if (!budget?.objective || budget.objectiveExhausted) return;
    const reason = budgetExhausted(budget.objective, status.usage, `objective ${input.id}`);
    if (!reason) return;
    budget.objectiveExhausted = reason;
    say('objective', `budget spent: ${reason}; no new agent run starts until \`slipway budget raise ${input.id}\``);
    for (const id of running) void tellStream(id, { objectiveExhausted: reason });
  };
  const releaseLease = (id: string) => {
    const budget = status.budget;
    if (budget?.inFlight?.includes(id)) budget.inFlight = budget.inFlight.filter((s) => s !== id);
  };
  /** Answers the streams waiting to start a run, in the order they asked, as far as it can now. */
  const answerLeases = () => {
    const budget = status.budget;
    if (!budget?.waiting) return;
    for (const [id, seq] of Object.entries(budget.waiting)) {
      if (!running.has(id)) {
        delete budget.waiting[id];
        continue;
      }
      const inFlight = (budget.inFlight ?? []).filter((s) => s !== id).length;
      const decision = objectiveLease(budget.objective, `objective ${input.id}`, status.usage, inFlight);
      if (decision.type === 'wait') continue;
      delete budget.waiting[id];
      if (decision.type === 'grant') budget.inFlight = [...(budget.inFlight ?? []).filter((s) => s !== id), id];
      void tellStream(id, { lease: seq, ...(decision.type === 'exhausted' ? { objectiveExhausted: decision.reason } : {}) });
    }
    if (Object.keys(budget.waiting).length === 0) delete budget.waiting;
  };
  const afterEvents = () => {
    sumUsage();
    checkObjectiveBudget();
    answerLeases();
    refreshBlocked();
    setCurrentDetails(details());
  };

  setHandler(objectiveStatusQuery, () => status);
  setHandler(objectiveFeedQuery, (afterSeq) => ({ events: feedAfter(feed, afterSeq), done }));
  setHandler(
    planDecisionUpdate,
    (decision) => {
      planDecision = decision;
      return { accepted: true };
    },
    {
      validator: (decision) => {
        if (status.phase !== 'awaiting_approval') throw new Error(`objective "${input.id}" is not waiting for approval (it is ${status.phase})`);
        if (!decision.approve && !decision.reason?.trim()) throw new Error('a rejection needs a reason');
      },
    },
  );
  setHandler(
    budgetRaiseUpdate,
    async (raise) => {
      const budget = (status.budget ??= { onExhausted: 'block' });
      if (raise.stream !== undefined) {
        const limit = raisedLimit(budget.streams?.[raise.stream] ?? budget.stream, raise);
        budget.streams = { ...budget.streams, [raise.stream]: limit };
        say('human', `budget of stream ${raise.stream} raised to ${formatLimit(limit)}`);
        if (running.has(raise.stream)) await tellStream(raise.stream, { limit });
        return { objectiveId: input.id, stream: raise.stream, limit };
      }
      const limit = raisedLimit(budget.objective, raise);
      budget.objective = limit;
      say('human', `budget of the objective raised to ${formatLimit(limit)}`);
      if (budget.objectiveExhausted) {
        delete budget.objectiveExhausted;
        await Promise.all([...running].map((id) => tellStream(id, { objectiveExhausted: null })));
      }
      answerLeases();
      return { objectiveId: input.id, limit };
    },
    {
      validator: (raise) => {
        if (done) throw new Error(`objective "${input.id}" has ended; there is nothing to raise`);
        let problems: string[];
        if (raise.stream !== undefined) {
          const v = view(raise.stream);
          if (!v) throw new Error(`unknown stream "${raise.stream}" in objective ${input.id} (streams: ${status.streams.map((s) => s.id).join(', ') || 'none yet'})`);
          if (FINAL_STREAM_PHASES.includes(v.phase)) throw new Error(`stream "${raise.stream}" has ended (${v.phase}); there is nothing to raise`);
          const limit = status.budget?.streams?.[raise.stream] ?? status.budget?.stream;
          problems = raiseProblems(raise, { limit, spent: v.usage ?? emptyTotals(), whose: `stream ${raise.stream}` });
        } else problems = raiseProblems(raise, { limit: status.budget?.objective, spent: status.usage, whose: `objective ${input.id}` });
        if (problems.length > 0) throw new Error(problems.join('; '));
      },
    },
  );
  setHandler(budgetLeaseSignal, (request) => {
    const budget = status.budget;
    if (!budget) return;
    releaseLease(request.streamId);
    budget.waiting = { ...budget.waiting, [request.streamId]: request.seq };
    answerLeases();
  });
  setHandler(streamMergeReadySignal, (request) => {
    mergeQueue.push(request);
  });
  // Streams of 0.1.0 send one event per signal; today's send them in batches (./feed).
  setHandler(streamEventSignal, (event) => {
    applyEvent(event);
    afterEvents();
  });
  setHandler(streamEventsSignal, (events) => {
    for (const event of events) applyEvent(event);
    afterEvents();
  });
  upsertSearchAttributes([
    { key: SlipwayKind, value: 'objective' },
    { key: SlipwayObjective, value: input.id },
  ]);

  /** Ends the objective as failed with a reason, when nothing was started. */
  const failEarly = (error: string): ObjectiveResult => {
    done = true;
    status.outcome = 'failed';
    upsertSearchAttributes([{ key: SlipwayOutcome, value: 'failed' }]);
    enter('done', `outcome **failed**: ${error}`);
    return { ...status, outcome: 'failed', error };
  };

  // The loader checks the file; a client that starts the workflow directly is held to the same bounds.
  const inputIssues = streamGraphIssues(input.streams);
  if (inputIssues.length > 0) return failEarly(`invalid input: ${inputIssues.map((i) => `${formatIssuePath(i.path)}: ${i.message}`).join('; ')}`);

  const setStreams = (specs: StreamSpec[]) => {
    streams = specs;
    status.streams = specs.map((s) => ({ id: s.id, task: s.task, phase: 'waiting', iterations: 0 }));
  };
  let prepared: Awaited<ReturnType<typeof git.prepareObjective>>;
  // The merger worktree is held by the worker that prepared the objective (it holds the
  // repository); its activities wait for that worker, since the repository cannot move (docs/adr/0013).
  const mergerRoute = () => (prepared.owner !== undefined && patched(MERGER_OWNER_ROUTING) ? ownerRoute(prepared.owner, { waitForOwner: true }) : undefined);
  const mergerGit = () => {
    const route = mergerRoute();
    return route ? gitActivities(retryFor(root, root.steps[0]), route) : git;
  };
  /** Settles once the merger worktree exists (at once when prepareObjective made it); its failure is kept for the first use. */
  let mergerMade: Promise<void> = Promise.resolve();
  let mergerFailure: unknown;
  const mergerReady = async () => {
    await mergerMade;
    if (mergerFailure !== undefined) throw mergerFailure;
  };
  if (resume) prepared = resume.prepared;
  else {
    // Only inputs of this version name a remote; older histories never reach the marker.
    const remote = input.remote !== undefined && patched(REMOTE_REPOSITORY_ON_OWNER) ? input.remote : undefined;
    enter('preparing', remote ? `fetching \`${input.repository}\` and creating the integration branch` : `creating the integration branch from \`${input.baseBranch}\``);
    const deferMerger = patched(LAZY_MERGER);
    // Only git runs in the merger unless post-merge gates, objective gates or the planner need the project's files.
    const objectiveGates = input.gates.length > 0 && root.steps.some((st) => st.type === 'deterministic' && st.action === 'run_quality_gates');
    const bare = input.postMergeGates.length === 0 && !objectiveGates && input.streams.length > 0;
    // A rejected plan sends the planner back to work in the merger: with a planner and a human
    // step that may reject, the merger keeps its (bare) worktree.
    const replanPossible =
      input.agents.planner !== undefined && (input.requireApproval === true || root.steps.some((st) => st.type === 'blueprint_ref' || (st.type === 'human' && !st.optional)));
    const withoutMerger = deferMerger && bare && !replanPossible && patched(MERGER_WITHOUT_WORKTREE);
    try {
      const prepare = deferMerger && !remote && patched(PREPARE_LOCALLY) ? localGitActivities(retryFor(root, root.steps[0])).prepareObjective : git.prepareObjective;
      prepared = await prepare({
        objectiveId: input.id,
        repository: input.repository,
        baseBranch: input.baseBranch,
        ...(remote ? { remote } : {}),
        sandbox: input.sandbox,
        ...(deferMerger ? { deferMerger } : {}),
        ...(withoutMerger ? { withoutMerger } : {}),
      });
      if (remote && prepared.repository !== undefined && prepared.baseBranch !== undefined) {
        // From here on (and across continue-as-new) everything works on the owner's clone, at the commit resolved there.
        input = { ...input, repository: prepared.repository, baseBranch: prepared.baseBranch, remote: { ...remote, commit: prepared.baseCommit } };
      }
      // Nothing to make when prepareObjective made the integration branch alone (a git without merge-tree --write-tree cannot).
      if (deferMerger && !prepared.withoutMerger) {
        // Not cancellable: a cancelled objective removes the merger only once its create has ended.
        mergerMade = CancellationScope.nonCancellable(() =>
          mergerGit().prepareMerger({ objectiveId: input.id, repository: input.repository, baseCommit: prepared.baseCommit, sandbox: input.sandbox, bare }),
        ).then(
          () => undefined,
          (err) => {
            mergerFailure = err;
          },
        );
      }
    } catch (err) {
      if (isCancellation(err) && CancellationScope.current().consideredCancelled) {
        // Cancelled while preparing: nothing started but the merger worktree, which goes. (A remote's
        // clone is on a worker not known yet: nothing to remove from here.)
        if (!remote) await CancellationScope.nonCancellable(() => git.finishObjective({ repository: input.repository, objectiveId: input.id }));
        done = true;
        status.outcome = 'cancelled';
        upsertSearchAttributes([{ key: SlipwayOutcome, value: 'cancelled' }]);
        enter('done', 'outcome **cancelled** while preparing');
        return { ...status, outcome: 'cancelled' };
      }
      if (!(err instanceof TemporalFailure) || isCancellation(err)) throw err;
      // Nothing was started: end as failed with the reason rather than as a failed workflow.
      return failEarly(`could not prepare the integration branch: ${failureMessage(err)}`);
    }
    status.integrationBranch = prepared.integrationBranch;
    status.baseCommit = prepared.baseCommit;
    setStreams(streams);
  }

  // --- stream dispatch (workflows/dispatch.ts decides) -----------------------------------------------
  const landed = (): Record<string, string> => {
    const byCommit = patched(DISPATCH_FROM_MERGE_COMMIT);
    const out: Record<string, string> = {};
    for (const v of status.streams) {
      if (byCommit && v.mergeCommit) out[v.id] = v.mergeCommit;
      else if (!byCommit && v.phase === 'merged') out[v.id] = prepared.integrationBranch;
    }
    return out;
  };
  const startEligible = async () => {
    if (!streamBlueprint) return;
    const blueprint = streamBlueprint;
    const decisions = dispatch({
      streams,
      views: status.streams,
      running: running.size,
      maxParallel: input.maxParallelStreams,
      baseCommit: prepared.baseCommit,
      landed: streams.some((s) => s.depends_on.length > 0) ? landed() : {},
      mergeOrder: status.mergeOrder,
    });
    const starts: Extract<DispatchDecision, { type: 'start' }>[] = [];
    for (const d of decisions) {
      if (d.type === 'start') {
        starts.push(d);
        continue;
      }
      const v = view(d.streamId)!;
      v.phase = 'failed';
      v.failure = { kind: 'unknown', summary: d.summary };
      say(d.streamId, `failed: ${d.summary}`);
    }
    const start = async (d: Extract<DispatchDecision, { type: 'start' }>) => {
      const spec = streams.find((s) => s.id === d.streamId)!;
      const abandon = patched(ABANDONED_CHILDREN);
      const child = streamStart(input, spec, {
        base: d.base,
        baseCommit: prepared.baseCommit,
        integrationBranch: prepared.integrationBranch,
        blueprint,
        parentWorkflowId: workflowInfo().workflowId,
        ...(status.budget ? { budget: { ...streamBudgetOf(status.budget, spec.id), ...(status.budget.objective && patched(OBJECTIVE_BUDGET_LEASES) ? { leased: true as const } : {}) } } : {}),
      });
      const handle = await startChild(streamWorkflow, {
        workflowId: streamWorkflowId(input.id, spec.id),
        ...(abandon ? { parentClosePolicy: ParentClosePolicy.ABANDON } : {}),
        args: [child.input],
        staticSummary: child.summary,
        staticDetails: child.details,
      });
      running.add(spec.id);
      if (abandon) abandoned.add(spec.id);
      view(spec.id)!.phase = 'provisioning';
      handle
        .result()
        .then(applyStreamResult)
        .catch((err) => {
          if (!(err instanceof TemporalFailure)) throw err;
          const stream = view(spec.id)!;
          stream.phase = 'failed';
          stream.failure = { kind: failureKindOf(err), summary: failureMessage(err) };
          say(spec.id, `failed: ${stream.failure.summary}`);
        })
        .finally(() => {
          running.delete(spec.id);
          childEnded = true;
          releaseLease(spec.id);
          answerLeases();
          refreshBlocked();
        });
    };
    // All at once: one workflow task starts them all (0.1.0 waited for each start in turn).
    if (starts.length > 1 && patched(PARALLEL_STARTS)) await Promise.all(starts.map(start));
    else for (const d of starts) await start(d);
  };
  const applyStreamResult = (result: StreamResult) => {
    const v = view(result.streamId)!;
    v.iterations = result.iterations;
    v.phase = result.status;
    v.mergeCommit = result.mergeCommit;
    v.failure = result.failure;
    v.usage = result.usage;
    v.blocked = undefined;
    if (result.status === 'escalated') status.needsAttention.push(result.streamId);
    sumUsage();
    checkObjectiveBudget();
  };

  // --- the merge queue (workflows/merge-queue.ts decides) -------------------------------------------
  let integrationTip: string | undefined = resume ? resume.integrationTip : prepared.integrationTip;
  /** Decision signals on their way (ONE_ACTIVITY_MERGE): awaited before the run ends or continues as new. */
  const decisionsSent = new Set<Promise<void>>();
  const mergeOne = async (request: MergeRequest) => {
    await mergerReady();
    enter('merging', `merging stream ${request.streamId}`);
    view(request.streamId)!.phase = 'merging';
    let merge = startMerge(request.streamId, integrationTip);
    const mergeRequest = {
      mergerPath: prepared.mergerPath,
      branch: request.branch,
      headCommit: request.headCommit,
      // Only the queue moves the integration branch: a tip it did not leave there is refused.
      expectedTip: integrationTip,
      message: mergeMessage(request.streamId, prepared.integrationBranch, input.id, input.objective),
    };
    const gatesTimeout = input.postMergeGates.reduce((sum, g) => sum + g.timeout_seconds, 0);
    // One activity: its result answers every step of ./merge-queue's state machine in turn.
    const inOne = patched(ONE_ACTIVITY_MERGE);
    const whole = inOne ? await gateActivities(gatesTimeout, retryFor(root, root.steps[0]), mergerRoute()).mergeWithGates({ ...mergeRequest, gates: input.postMergeGates }) : undefined;
    let event: MergeEvent = { type: 'merge_finished', result: whole ? whole.merge : await mergerGit().mergeStream(mergeRequest) };
    for (;;) {
      const step = mergeStep(merge, event, { postMergeGates: input.postMergeGates.length > 0 });
      merge = step.state;
      const action = step.action;
      if (action.type === 'run_post_merge_gates') {
        const gates = whole ? whole.gates! : await gateActivities(gatesTimeout, undefined, mergerRoute()).runGates({ path: prepared.mergerPath, gates: input.postMergeGates });
        event = { type: 'post_merge_gates_finished', passed: gates.passed, failureReport: gates.failureReport };
      } else if (action.type === 'reset_integration') {
        if (!whole) await mergerGit().resetIntegration({ mergerPath: prepared.mergerPath, commit: action.commit });
        else if (!whole.reset) throw new Error(`mergeWithGates did not revert the failed merge of ${request.streamId}`);
        event = { type: 'integration_reset' };
      } else {
        integrationTip = merge.tip;
        if (action.landed) {
          status.mergeOrder.push(request.streamId);
          // Known here, before the stream ends: its dependents may start from it at once.
          if (action.decision.status === 'merged') view(request.streamId)!.mergeCommit = action.decision.commit;
        }
        say('merge-queue', action.feed);
        const told = tell(request.streamId, action.decision);
        if (!inOne) return told;
        // The next merge may start in this workflow task; the stream hears its decision meanwhile.
        decisionsSent.add(told);
        void told.finally(() => decisionsSent.delete(told));
        return;
      }
    }
  };
  /** Sends a stream its merge decision. */
  const tell = (streamId: string, decision: MergeDecision) =>
    getExternalWorkflowHandle(streamWorkflowId(input.id, streamId))
      .signal(mergeDecisionSignal, decision)
      .catch((err) => {
        // The stream ended meanwhile (cancelled or terminated by hand): its result says how; the
        // decision has no one to tell, and the other streams go on.
        if (!(err instanceof TemporalFailure) || isCancellation(err)) throw err;
        say('merge-queue', `stream ${streamId} ended before it heard the decision: ${failureMessage(err)}`);
      });
  /**
   * Several waiting streams merged and gated as one activity (BATCH_MERGE); a batch failing its
   * post-merge gates is bisected by ./merge-batch until the culprit is alone and the rest landed.
   */
  const mergeBatch = async (requests: MergeRequest[]) => {
    await mergerReady();
    enter('merging', `merging streams ${requests.map((r) => r.streamId).join(', ')} as one batch`);
    for (const r of requests) view(r.streamId)!.phase = 'merging';
    const byId = new Map(requests.map((r) => [r.streamId, r]));
    const gatesTimeout = input.postMergeGates.reduce((sum, g) => sum + g.timeout_seconds, 0);
    let batch = startBatch(requests.map((r) => r.streamId), integrationTip);
    while (batch.groups.length > 0) {
      const group = batch.groups[0].map((id) => byId.get(id)!);
      const tried = await gateActivities(gatesTimeout, retryFor(root, root.steps[0]), mergerRoute()).mergeBatch({
        mergerPath: prepared.mergerPath,
        // Only the queue moves the integration branch: a tip it did not leave there is refused.
        expectedTip: integrationTip,
        items: group.map((r) => ({ branch: r.branch, headCommit: r.headCommit, message: mergeMessage(r.streamId, prepared.integrationBranch, input.id, input.objective) })),
        gates: input.postMergeGates,
      });
      if (tried.gates && !tried.gates.passed && !tried.reset && tried.merges.some((m) => m.status === 'merged')) throw new Error(`mergeBatch did not revert the failed batch ${batch.groups[0].join(', ')}`);
      const step = batchStep(batch, tried, { postMergeGates: input.postMergeGates.length > 0 });
      batch = step.state;
      integrationTip = batch.tip;
      for (const line of step.feed) say('merge-queue', line);
      for (const d of step.decisions) {
        if (d.landed) {
          status.mergeOrder.push(d.streamId);
          if (d.decision.status === 'merged') view(d.streamId)!.mergeCommit = d.decision.commit;
        }
        say('merge-queue', d.feed);
        const told = tell(d.streamId, d.decision);
        decisionsSent.add(told);
        void told.finally(() => decisionsSent.delete(told));
      }
    }
  };

  const historyFull = () => {
    const info = workflowInfo();
    const runningNotAbandoned = [...running].filter((id) => !abandoned.has(id)).length;
    return shouldContinueAsNew({ historyLength: info.historyLength, suggested: info.continueAsNewSuggested, limit: input.continueAsNewAfterEvents, runningNotAbandoned });
  };
  /** Hands the objective to a new run (./objective-rollover): its streams keep running. */
  const rollover = async (step: string | undefined): Promise<never> => {
    await mergerReady();
    await Promise.all(decisionsSent);
    await condition(allHandlersFinished);
    const carry = trimCarry({
      runs: (resume?.runs ?? 0) + 1,
      prepared: { integrationBranch: prepared.integrationBranch, baseCommit: prepared.baseCommit, mergerPath: prepared.mergerPath, integrationTip: prepared.integrationTip, ...(prepared.owner !== undefined ? { owner: prepared.owner } : {}), ...(prepared.withoutMerger ? { withoutMerger: true as const } : {}) },
      integrationTip,
      status,
      feed,
      streams,
      streamBlueprint: streamBlueprintKey!,
      step,
      fixCounts,
      mergeQueue,
      // A stream whose final event came already has ended for the next run, whose handle on it is gone.
      running: [...running].filter((id) => !FINAL_STREAM_PHASES.includes(view(id)!.phase)),
      plannerUsage,
    });
    return continueAsNew<typeof objectiveWorkflow>({ ...input, resume: carry });
  };

  /** The merge queue: runs until every stream has reached a final phase. `step`: the interpreter's step holding it. */
  const runMergeQueue = async (step?: string) => {
    enter('running', `${streams.length} streams, up to ${input.maxParallelStreams} at a time`);
    for (;;) {
      await startEligible();
      const waitingStreams = streams.filter((s) => view(s.id)!.phase === 'waiting').length;
      if (mergeQueueFinished({ running: running.size, queued: mergeQueue.length, waitingStreams, canStartStreams: streamBlueprint !== undefined })) break;
      if (historyFull()) await rollover(step);
      // Stream events alone can grow the history while nothing merges: wake for that too.
      await condition(() => mergeQueue.length > 0 || childEnded || historyFull());
      childEnded = false;
      while (mergeQueue.length > 0) {
        const batch = batchSize(mergeQueue.length);
        if (batch > 0 && patched(BATCH_MERGE)) await mergeBatch(mergeQueue.splice(0, batch));
        else await mergeOne(mergeQueue.shift()!);
      }
      if (status.phase === 'merging') enter('running', 'streams in progress');
    }
  };

  // --- the planner step (workflows/planner-step.ts decides) -------------------------------------------
  const runPlanner = async (current: Extract<Step, { type: 'agent' }>, feedback: string | undefined, iteration: number): Promise<ObjectiveStepFailure | undefined> => {
    const spec = input.agents.planner!;
    enter('planning', 'the planner is splitting the objective into streams');
    await mergerReady();
    // Kept across rate-limit waits: the loop continues at the run it stopped at.
    const loop = newAgentLoop();
    const outcome = await withRateLimitWaits(
      () =>
        runAgentLoop({
          input: plannerRunInput(input, { mergerPath: prepared.mergerPath, integrationBranch: prepared.integrationBranch, iteration, feedback }),
          step: current.id,
          retry: retryFor(root, current),
          state: loop,
          route: prepared.owner !== undefined && patched(MERGER_OWNER_ROUTING) ? ownerRoute(prepared.owner, { waitForOwner: true, agents: true }) : undefined,
          onRun: async (_run, record) => {
            addRunUsage(plannerUsage, record);
            (status.agentRuns ??= []).push(record);
            sumUsage();
            checkObjectiveBudget();
            say('planner', `planner run (${spec.provider}): ${formatUsage(record)}${record.result === 'invalid_output' ? '; answer unusable' : ''}`);
            setCurrentDetails(details());
          },
        }),
      MAX_RATE_LIMIT_WAITS,
      (wait) => {
        const waiting = rateLimitWait(current.id, wait, { maxWaits: MAX_RATE_LIMIT_WAITS, at: new Date().toISOString() });
        status.ledger.push(waiting.entry);
        say('planner', waiting.feed);
      },
    );
    if (!outcome.ok) return { kind: 'agent_runtime_transient', summary: outcome.summary };
    const plan = streamsFromPlan(outcome.last.plan);
    if (!plan.ok) return plan.failure;
    setStreams(plan.streams);
    say('planner', `planned ${streams.length} streams: ${streams.map((s) => s.id).join(', ')}`);
    return undefined;
  };

  // --- the blueprint interpreter ---------------------------------------------------------------------
  let planned = false;
  let feedbackForPlanner: string | undefined;
  const fixCounts: Record<string, number> = { ...resume?.fixCounts };
  let failure: string | undefined;
  // A resumed run goes back to the step that held the merge queue (none: the queue after the blueprint).
  let step: Step | undefined = resume ? (resume.step ? stepById(root, resume.step) : undefined) : startStep(root);
  try {
    while (step && !failure) {
      const current: Step = step;
      let failed: ObjectiveStepFailure | undefined;
      switch (current.type) {
        case 'agent': {
          const action = plannerStepAction(current, { streams: streams.length, feedback: feedbackForPlanner, plannerConfigured: input.agents.planner !== undefined });
          if (action.type === 'fail') failed = action.failure;
          else if (action.type === 'plan') {
            failed = await runPlanner(current, feedbackForPlanner, (fixCounts.approve ?? 0) + 1);
            if (!failed) {
              planned = true;
              feedbackForPlanner = undefined;
            }
          }
          break;
        }
        case 'human': {
          if (!approvalNeeded(current, { planned, requireApproval: input.requireApproval === true })) break;
          status.pendingApproval = { streams, prompt: current.prompt };
          planDecision = undefined;
          enter('awaiting_approval', `waiting for \`slipway approve ${input.id}\` or \`slipway reject ${input.id} --reason ...\``);
          await condition(() => planDecision !== undefined);
          status.pendingApproval = undefined;
          if (planDecision!.approve) {
            say('human', 'plan approved');
            break;
          }
          say('human', `plan rejected: ${planDecision!.reason}`);
          failed = { kind: 'plan_rejection', summary: planDecision!.reason ?? 'rejected' };
          break;
        }
        case 'blueprint_ref': {
          const ref = input.blueprint.refs[current.ref];
          if (!ref) {
            failed = { kind: 'configuration_error', summary: `blueprint "${current.ref}" was not resolved` };
            break;
          }
          streamBlueprint = ref;
          streamBlueprintKey = current.ref;
          say('objective', `dispatching ${streams.length} streams with blueprint ${ref.id}`);
          break;
        }
        case 'deterministic': {
          if (current.action === 'dispatch_streams') {
            streamBlueprintKey = 'build-review';
            streamBlueprint = input.blueprint.refs[streamBlueprintKey];
            if (!streamBlueprint) failed = { kind: 'configuration_error', summary: 'dispatch_streams needs the build-review blueprint' };
          } else if (current.action === 'merge_queue') {
            await runMergeQueue(current.id);
          } else if (current.action === 'run_quality_gates' && input.gates.length > 0) {
            await mergerReady();
            const timeout = input.gates.reduce((sum, g) => sum + g.timeout_seconds, 0);
            const gates = await gateActivities(timeout, retryFor(root, current), mergerRoute()).runGates({ path: prepared.mergerPath, gates: input.gates });
            if (!gates.passed) failure = `gates failed on ${prepared.integrationBranch}`;
          } else if (current.action === 'mark_complete') {
            step = undefined;
            continue;
          }
          break;
        }
      }
      if (failed) {
        const after = afterStepFailure(current, failed, { fixCount: fixCounts[current.id] ?? 0, fixLimit: fixLimit(root, current, overrides), at: new Date().toISOString() });
        status.ledger.push(after.entry);
        if (after.next.type === 'loop') {
          fixCounts[current.id] = (fixCounts[current.id] ?? 0) + 1;
          feedbackForPlanner = after.next.feedback;
          step = stepById(root, after.next.step);
          continue;
        }
        failure = after.next.error;
        break;
      }
      step = nextStep(root, current);
    }
    // Streams dispatched by a blueprint without its own merge step still get merged.
    if (!failure && streamBlueprint && (running.size > 0 || streams.some((s) => view(s.id)!.phase === 'waiting'))) await runMergeQueue();
  } catch (err) {
    if (isCancellation(err) && CancellationScope.current().consideredCancelled) cancelled = true;
    else {
      // Only Temporal failures end the objective as failed: a bug fails the workflow task, and a fixed deploy resumes it.
      if (!(err instanceof TemporalFailure) || isCancellation(err)) throw err;
      failure = failureMessage(err);
    }
  }

  if (cancelled) {
    // `slipway cancel`: every running stream is asked by its workflow id (a child's own
    // cancellation targets the run this objective started, which a stream that continued as new
    // has left; a previous run's streams are no children at all). Their sandboxes are cleaned up
    // before the objective ends; what was merged stays on the integration branch.
    await CancellationScope.nonCancellable(async () => {
      enter('finishing', `cancelled: stopping ${running.size} running stream${running.size === 1 ? '' : 's'}`);
      for (const id of running) {
        try {
          await getExternalWorkflowHandle(streamWorkflowId(input.id, id)).cancel();
        } catch (err) {
          if (!(err instanceof TemporalFailure)) throw err; // it ended meanwhile
        }
      }
      if (!(await condition(() => running.size === 0, STREAM_CANCEL_WAIT))) say('objective', `${running.size} streams did not end within ${STREAM_CANCEL_WAIT} of the cancellation`);
    });
    for (const v of status.streams) {
      if (v.phase === 'waiting') {
        v.phase = 'failed';
        v.failure = { kind: 'unknown', summary: 'cancelled before it started' };
      }
    }
  }

  if (resume && patched(RESUMED_WAITS_FOR_STREAMS)) {
    const ending = streamsToAwaitAtEnd(status.streams).map((id) => streamWorkflowId(input.id, id));
    if (ending.length > 0) {
      await CancellationScope.nonCancellable(() => workflowEnds.workflowsClosed({ workflowIds: ending })).catch((err) => {
        if (!(err instanceof TemporalFailure)) throw err;
        log.warn('could not tell whether the ended streams have closed; the result may come before their cleanup', { error: failureMessage(err) });
      });
    }
  }
  const nothingToFinish = prepared.withoutMerger === true && input.remote === undefined && integrationTip !== undefined && patched(FINISH_WITHOUT_ACTIVITY);
  if (!nothingToFinish) enter('finishing', 'removing the merger worktree');
  await mergerMade;
  await Promise.all(decisionsSent);
  const finished: Awaited<ReturnType<typeof git.finishObjective>> = nothingToFinish
    ? { integrationHead: integrationTip }
    : await CancellationScope.nonCancellable(() => mergerGit().finishObjective({ repository: input.repository, objectiveId: input.id }));
  const outcome: ObjectiveOutcome = cancelled ? 'cancelled' : failure ? 'failed' : decideOutcome(status.streams);
  done = true;
  status.outcome = outcome;
  upsertSearchAttributes([{ key: SlipwayOutcome, value: outcome }]);
  // A rejected push (the remote's branch moved on) is reported, never forced (lib/remote-repository.ts).
  const pushed = finished.pushError ? `; ${finished.pushError}` : finished.pushedTo ? `, pushed to ${finished.pushedTo}` : '';
  enter('done', `outcome **${outcome}**${failure ? ` (${failure})` : ''}: ${status.mergeOrder.length}/${status.streams.length} streams merged into \`${prepared.integrationBranch}\`${pushed}`);
  return { ...status, outcome, integrationHead: finished.integrationHead, error: failure ?? finished.pushError };
}
