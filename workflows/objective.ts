/**
 * Objective workflow: interprets the objective's blueprint (`standard` by default): plan (or
 * take the streams from the file), optional human approval, one child stream workflow per work
 * item (bounded parallelism, dependencies respected), and the merge queue, which integrates
 * ready streams one at a time into `slipway/<objective>/integration` with post-merge gates.
 * It also gathers its streams' events into the live feed and recovery ledger.
 */
import {
  condition,
  defineQuery,
  defineUpdate,
  getExternalWorkflowHandle,
  isCancellation,
  ParentClosePolicy,
  setCurrentDetails,
  setHandler,
  startChild,
  upsertSearchAttributes,
  workflowInfo,
  type ChildWorkflowHandle,
} from '@temporalio/workflow';
import type { Blueprint, Step } from '../blueprints/schema';
import { FAILURE_KINDS } from '../core/failures';
import { streamWorkflowId } from '../core/ids';
import { SlipwayKind, SlipwayObjective, SlipwayOutcome, SlipwayPhase } from '../core/search-attributes';
import { FINAL_STREAM_PHASES, type ObjectiveOutcome, type ObjectivePhase } from '../core/states';
import {
  emptyTotals,
  type FeedEvent,
  type MergeRequest,
  type ObjectiveInput,
  type ObjectiveResult,
  type ObjectiveStatus,
  type ObjectiveStreamView,
  type StreamResult,
  type StreamSpec,
} from '../core/types';
import { gateActivities, gitActivities } from './activity-options';
import { newAgentLoop, runAgentLoop, withRateLimitWaits } from './agent-runs';
import { fixLimit, nextStep, retryFor, startStep, stepById } from './blueprint-walker';
import { addRunUsage, addTotals, formatTotals, formatUsage } from '../core/usage';
import { failureKindOf, failureMessage } from './failure-info';
import { mergeMessage, mergeQueueFinished, mergeStep, startMerge, type MergeEvent } from './merge-queue';
import { MAX_RATE_LIMIT_WAITS, mergeDecisionSignal, streamEventSignal, streamMergeReadySignal, streamWorkflow } from './stream';

export const objectiveStatusQuery = defineQuery<ObjectiveStatus>('objectiveStatus');
/** Feed lines after `afterSeq` (for `slipway watch`), and whether the objective is done. */
export const objectiveFeedQuery = defineQuery<{ events: FeedEvent[]; done: boolean }, [number]>('objectiveFeed');
/** A human's decision on the plan (`slipway approve` / `slipway reject`). */
export const planDecisionUpdate = defineUpdate<{ accepted: true }, [{ approve: boolean; reason?: string }]>('planDecision');

/** Feed lines kept in workflow state; older ones stay in history (the ledger is kept whole). */
const FEED_LIMIT = 2_000;

export function decideOutcome(streams: Pick<ObjectiveStreamView, 'phase'>[]): ObjectiveOutcome {
  const merged = streams.filter((s) => s.phase === 'merged').length;
  if (streams.length > 0 && merged === streams.length) return 'completed';
  // A stream whose work changed nothing did not fail, but its intent did not land either.
  const unchanged = streams.filter((s) => s.phase === 'no_changes').length;
  return merged > 0 || unchanged > 0 ? 'partial' : 'failed';
}

export async function objectiveWorkflow(input: ObjectiveInput): Promise<ObjectiveResult> {
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
  const feed: FeedEvent[] = [];
  let seq = 0;
  let done = false;
  let streams: StreamSpec[] = input.streams;
  let planDecision: { approve: boolean; reason?: string } | undefined;
  const mergeQueue: MergeRequest[] = [];
  const running = new Map<string, ChildWorkflowHandle<typeof streamWorkflow>>();
  let childEnded = false;
  let streamBlueprint: Blueprint | undefined;

  const view = (id: string) => status.streams.find((s) => s.id === id);
  const say = (source: string, text: string) => {
    feed.push({ seq: ++seq, at: new Date().toISOString(), source, text });
    if (feed.length > FEED_LIMIT) feed.splice(0, feed.length - FEED_LIMIT);
  };
  const refreshBlocked = () => {
    const blocked = status.streams.some((s) => s.phase === 'blocked');
    const outcome = blocked ? 'blocked' : undefined;
    if (status.outcome !== outcome && !done) {
      status.outcome = outcome;
      upsertSearchAttributes([{ key: SlipwayOutcome, value: outcome ?? null }]);
    }
  };
  // The planner's runs count too; streams report theirs with every event.
  const plannerUsage = emptyTotals();
  const sumUsage = () => {
    status.usage = status.streams.reduce((sum, s) => (s.usage ? addTotals(sum, s.usage) : sum), { ...plannerUsage });
  };

  setHandler(objectiveStatusQuery, () => status);
  setHandler(objectiveFeedQuery, (afterSeq) => ({ events: feed.filter((e) => e.seq > afterSeq), done }));
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
  setHandler(streamMergeReadySignal, (request) => {
    mergeQueue.push(request);
  });
  setHandler(streamEventSignal, (event) => {
    const v = view(event.streamId);
    if (!v) return;
    if (!FINAL_STREAM_PHASES.includes(v.phase)) v.phase = event.phase;
    v.iterations = event.iteration;
    if (event.blocked !== undefined) v.blocked = event.blocked ?? undefined;
    if (event.usage) v.usage = event.usage;
    if (event.ledger) status.ledger.push(event.ledger);
    if (event.agentRun) (status.agentRuns ??= []).push(event.agentRun);
    say(event.streamId, event.text);
    sumUsage();
    refreshBlocked();
    setCurrentDetails(details());
  });
  upsertSearchAttributes([
    { key: SlipwayKind, value: 'objective' },
    { key: SlipwayObjective, value: input.id },
  ]);
  const details = () => `**${status.phase}**${status.outcome ? ` (${status.outcome})` : ''}\n\n${summarizeStreams(status.streams)}\n\nAgent usage: ${formatTotals(status.usage)}`;
  const enter = (phase: ObjectivePhase, text: string) => {
    status.phase = phase;
    upsertSearchAttributes([{ key: SlipwayPhase, value: phase }]);
    say('objective', `${phase}: ${text}`);
    setCurrentDetails(details());
  };

  enter('preparing', `creating the integration branch from \`${input.baseBranch}\``);
  let prepared: Awaited<ReturnType<typeof git.prepareObjective>>;
  try {
    prepared = await git.prepareObjective({ objectiveId: input.id, repository: input.repository, baseBranch: input.baseBranch, sandbox: input.sandbox });
  } catch (err) {
    if (isCancellation(err)) throw err;
    // Nothing was started: end as failed with the reason rather than as a failed workflow.
    const error = `could not prepare the integration branch: ${failureMessage(err)}`;
    done = true;
    status.outcome = 'failed';
    upsertSearchAttributes([{ key: SlipwayOutcome, value: 'failed' }]);
    enter('done', `outcome **failed**: ${error}`);
    return { ...status, outcome: 'failed', error };
  }
  status.integrationBranch = prepared.integrationBranch;
  status.baseCommit = prepared.baseCommit;

  const setStreams = (specs: StreamSpec[]) => {
    streams = specs;
    status.streams = specs.map((s) => ({ id: s.id, task: s.task, phase: 'waiting', iterations: 0 }));
  };
  setStreams(streams);

  // --- stream scheduling ---------------------------------------------------------------------------
  const startEligible = async () => {
    if (!streamBlueprint) return;
    for (const spec of streams) {
      const v = view(spec.id)!;
      if (v.phase !== 'waiting' || running.has(spec.id)) continue;
      const deps = spec.depends_on.map((d) => view(d)!);
      const brokenDep = deps.find((d) => d.phase === 'failed' || d.phase === 'escalated');
      if (brokenDep) {
        v.phase = 'failed';
        v.failure = { kind: 'unknown', summary: `dependency "${brokenDep.id}" did not merge` };
        say(spec.id, `failed: ${v.failure.summary}`);
        continue;
      }
      if (deps.some((d) => d.phase !== 'merged') || running.size >= input.maxParallelStreams) continue;
      // Dependents start from the integration branch, which already holds their dependencies.
      const base = spec.depends_on.length > 0 ? prepared.integrationBranch : prepared.baseCommit;
      const handle = await startChild(streamWorkflow, {
        workflowId: streamWorkflowId(input.id, spec.id),
        args: [
          {
            objective: { id: input.id, objective: input.objective, repository: input.repository, objectiveDir: input.objectiveDir },
            stream: spec,
            base,
            integrationBranch: prepared.integrationBranch,
            gates: input.gates,
            agents: input.agents,
            blueprint: streamBlueprint,
            maxFixIterations: input.maxFixIterations,
            onExhausted: input.onExhausted,
            parentWorkflowId: workflowInfo().workflowId,
            sandbox: input.sandbox,
          },
        ],
        // Cancelled, not terminated, when the objective ends early: a stream releases its sandbox
        // on the way out (it outlives the stream's runs, ADR 0008).
        parentClosePolicy: ParentClosePolicy.REQUEST_CANCEL,
        staticSummary: `Stream ${spec.id}: ${truncate(spec.task, 120)}`,
        staticDetails: `Objective \`${input.id}\`, blueprint \`${streamBlueprint.id}\`, builds on \`${base === prepared.baseCommit ? input.baseBranch : prepared.integrationBranch}\`.`,
      });
      running.set(spec.id, handle);
      v.phase = 'provisioning';
      handle
        .result()
        .then(applyStreamResult)
        .catch((err) => {
          const stream = view(spec.id)!;
          stream.phase = 'failed';
          stream.failure = { kind: failureKindOf(err), summary: failureMessage(err) };
          say(spec.id, `failed: ${stream.failure.summary}`);
        })
        .finally(() => {
          running.delete(spec.id);
          childEnded = true;
          refreshBlocked();
        });
    }
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
  };

  // --- the merge queue (workflows/merge-queue.ts decides) -------------------------------------------
  let integrationTip: string | undefined = prepared.integrationTip;
  const mergeOne = async (request: MergeRequest) => {
    enter('merging', `merging stream ${request.streamId}`);
    view(request.streamId)!.phase = 'merging';
    let merge = startMerge(request.streamId, integrationTip);
    let event: MergeEvent = {
      type: 'merge_finished',
      result: await git.mergeStream({
        mergerPath: prepared.mergerPath,
        branch: request.branch,
        headCommit: request.headCommit,
        // Only the queue moves the integration branch: a tip it did not leave there is refused.
        expectedTip: integrationTip,
        message: mergeMessage(request.streamId, prepared.integrationBranch, input.id, input.objective),
      }),
    };
    for (;;) {
      const step = mergeStep(merge, event, { postMergeGates: input.postMergeGates.length > 0 });
      merge = step.state;
      const action = step.action;
      if (action.type === 'run_post_merge_gates') {
        const timeout = input.postMergeGates.reduce((sum, g) => sum + g.timeout_seconds, 0);
        const gates = await gateActivities(timeout).runGates({ path: prepared.mergerPath, gates: input.postMergeGates });
        event = { type: 'post_merge_gates_finished', passed: gates.passed, failureReport: gates.failureReport };
      } else if (action.type === 'reset_integration') {
        await git.resetIntegration({ mergerPath: prepared.mergerPath, commit: action.commit });
        event = { type: 'integration_reset' };
      } else {
        integrationTip = merge.tip;
        if (action.landed) status.mergeOrder.push(request.streamId);
        say('merge-queue', action.feed);
        await getExternalWorkflowHandle(streamWorkflowId(input.id, request.streamId)).signal(mergeDecisionSignal, action.decision);
        return;
      }
    }
  };

  /** The merge queue: runs until every stream has reached a final phase. */
  const runMergeQueue = async () => {
    enter('running', `${streams.length} streams, up to ${input.maxParallelStreams} at a time`);
    for (;;) {
      await startEligible();
      const waitingStreams = streams.filter((s) => view(s.id)!.phase === 'waiting').length;
      if (mergeQueueFinished({ running: running.size, queued: mergeQueue.length, waitingStreams, canStartStreams: streamBlueprint !== undefined })) break;
      await condition(() => mergeQueue.length > 0 || childEnded);
      childEnded = false;
      while (mergeQueue.length > 0) await mergeOne(mergeQueue.shift()!);
      if (status.phase === 'merging') enter('running', 'streams in progress');
    }
  };

  // --- the blueprint interpreter ---------------------------------------------------------------------
  let planned = false;
  let feedbackForPlanner: string | undefined;
  const fixCounts: Record<string, number> = {};
  let failure: string | undefined;
  let step: Step | undefined = startStep(root);
  try {
    while (step && !failure) {
      const current: Step = step;
      let failed: { kind: 'plan_rejection' | 'configuration_error' | 'agent_runtime_transient'; summary: string } | undefined;
      switch (current.type) {
        case 'agent': {
          if (current.role !== 'planner') {
            failed = { kind: 'configuration_error', summary: `a ${current.role} step cannot run at objective level` };
            break;
          }
          if (current.optional && streams.length > 0 && !feedbackForPlanner) break; // streams given: nothing to plan
          const spec = input.agents.planner;
          if (!spec) {
            failed = { kind: 'configuration_error', summary: 'the objective lists no streams and no planner agent is configured' };
            break;
          }
          enter('planning', 'the planner is splitting the objective into streams');
          const planLoop = newAgentLoop();
          const outcome = await withRateLimitWaits(
            () =>
              runAgentLoop({
                input: {
                  role: 'planner',
                  spec,
                  sandboxPath: prepared.mergerPath,
                  repository: input.repository,
                  objectiveDir: input.objectiveDir,
                  objective: { id: input.id, text: input.objective },
                  stream: { id: 'plan', task: input.objective, branch: prepared.integrationBranch },
                  targetBranch: prepared.integrationBranch,
                  iteration: (fixCounts.approve ?? 0) + 1,
                  feedback: feedbackForPlanner ? { kind: 'plan_rejection', summary: feedbackForPlanner, details: '' } : undefined,
                },
                step: current.id,
                retry: retryFor(root, current),
                state: planLoop,
                onRun: async (_run, record) => {
                  addRunUsage(plannerUsage, record);
                  (status.agentRuns ??= []).push(record);
                  sumUsage();
                  say('planner', `planner run (${spec.provider}): ${formatUsage(record)}${record.result === 'invalid_output' ? '; answer unusable' : ''}`);
                  setCurrentDetails(details());
                },
              }),
            MAX_RATE_LIMIT_WAITS,
            (wait) => {
              status.ledger.push({
                at: new Date().toISOString(),
                step: current.id,
                kind: 'provider_rate_limit',
                action: FAILURE_KINDS.provider_rate_limit.action,
                attempt: wait.n,
                maxAttempts: MAX_RATE_LIMIT_WAITS,
                summary: `${wait.summary}; waiting ${Math.ceil(wait.waitMs / 1000)} s until ${wait.resetAt ?? 'the default back-off'}`,
                result: 'waiting',
              });
              say('planner', `provider_rate_limit -> wait until ${wait.resetAt ?? `${wait.waitMs / 1000} s from now`} (${wait.n}/${MAX_RATE_LIMIT_WAITS})`);
            },
          );
          if (!outcome.ok) {
            failed = { kind: 'agent_runtime_transient', summary: outcome.summary };
            break;
          }
          const run = outcome.last;
          setStreams(run.plan ?? []);
          planned = true;
          feedbackForPlanner = undefined;
          say('planner', `planned ${streams.length} streams: ${streams.map((s) => s.id).join(', ')}`);
          break;
        }
        case 'human': {
          if (current.optional && !planned && !input.requireApproval) break;
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
          say('objective', `dispatching ${streams.length} streams with blueprint ${ref.id}`);
          break;
        }
        case 'deterministic': {
          if (current.action === 'dispatch_streams') {
            streamBlueprint = input.blueprint.refs['build-review'];
            if (!streamBlueprint) failed = { kind: 'configuration_error', summary: 'dispatch_streams needs the build-review blueprint' };
          } else if (current.action === 'merge_queue') {
            await runMergeQueue();
          } else if (current.action === 'run_quality_gates' && input.gates.length > 0) {
            const timeout = input.gates.reduce((sum, g) => sum + g.timeout_seconds, 0);
            const gates = await gateActivities(timeout, retryFor(root, current)).runGates({ path: prepared.mergerPath, gates: input.gates });
            if (!gates.passed) failure = `gates failed on ${prepared.integrationBranch}`;
          } else if (current.action === 'mark_complete') {
            step = undefined;
            continue;
          }
          break;
        }
      }
      if (failed) {
        const limit = fixLimit(root, current, overrides);
        const count = fixCounts[current.id] ?? 0;
        const canLoop = failed.kind === 'plan_rejection' && current.on_fail && count < limit;
        status.ledger.push({
          at: new Date().toISOString(),
          step: current.id,
          kind: failed.kind,
          action: FAILURE_KINDS[failed.kind].action,
          attempt: canLoop ? count + 1 : limit,
          maxAttempts: limit,
          summary: failed.summary,
          result: canLoop ? 'retrying' : 'failed',
        });
        if (canLoop) {
          fixCounts[current.id] = count + 1;
          feedbackForPlanner = failed.summary;
          step = stepById(root, current.on_fail!);
          continue;
        }
        failure = failed.summary;
        break;
      }
      step = nextStep(root, current);
    }
    // Streams dispatched by a blueprint without its own merge step still get merged.
    if (!failure && streamBlueprint && (running.size > 0 || streams.some((s) => view(s.id)!.phase === 'waiting'))) await runMergeQueue();
  } catch (err) {
    if (isCancellation(err)) throw err;
    failure = failureMessage(err);
  }

  enter('finishing', 'removing the merger worktree');
  const finished = await git.finishObjective({ repository: input.repository, objectiveId: input.id });
  const outcome: ObjectiveOutcome = failure ? 'failed' : decideOutcome(status.streams);
  done = true;
  status.outcome = outcome;
  upsertSearchAttributes([{ key: SlipwayOutcome, value: outcome }]);
  enter('done', `outcome **${outcome}**${failure ? ` (${failure})` : ''}: ${status.mergeOrder.length}/${status.streams.length} streams merged into \`${prepared.integrationBranch}\``);
  return { ...status, outcome, integrationHead: finished.integrationHead, error: failure };
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

function summarizeStreams(streams: ObjectiveStreamView[]): string {
  return streams
    .map((s) => `- ${s.id}: ${s.phase}${s.blocked ? ` (mailbox ${s.blocked.mailbox})` : ''}${s.failure ? ` (${s.failure.summary})` : ''}${s.usage?.runs ? ` — ${formatUsage(s.usage)}` : ''}`)
    .join('\n');
}
