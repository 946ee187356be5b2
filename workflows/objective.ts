/**
 * Objective workflow: runs one child stream workflow per stream (bounded parallelism,
 * dependencies respected) and integrates finished streams one at a time through the merge
 * queue into `slipway/<objective>/integration`, with post-merge gates after each merge.
 */
import {
  condition,
  defineQuery,
  getExternalWorkflowHandle,
  setCurrentDetails,
  setHandler,
  startChild,
  upsertSearchAttributes,
  workflowInfo,
  type ChildWorkflowHandle,
} from '@temporalio/workflow';
import { streamWorkflowId } from '../core/ids';
import { SlipwayKind, SlipwayObjective, SlipwayOutcome, SlipwayPhase } from '../core/search-attributes';
import type { ObjectiveOutcome, ObjectivePhase } from '../core/states';
import type { MergeDecision, MergeRequest, ObjectiveInput, ObjectiveResult, ObjectiveStatus, ObjectiveStreamView, StreamResult } from '../core/types';
import { gateActivities, gitActivities } from './activity-options';
import { failureKindOf, failureMessage, mergeDecisionSignal, streamMergeReadySignal, streamWorkflow } from './stream';

export const objectiveStatusQuery = defineQuery<ObjectiveStatus>('objectiveStatus');

export function decideOutcome(streams: Pick<ObjectiveStreamView, 'phase'>[]): ObjectiveOutcome {
  const merged = streams.filter((s) => s.phase === 'merged').length;
  if (merged === streams.length) return 'completed';
  return merged > 0 ? 'partial' : 'failed';
}

export async function objectiveWorkflow(input: ObjectiveInput): Promise<ObjectiveResult> {
  const git = gitActivities();
  const postMergeTimeout = input.postMergeGates.reduce((sum, g) => sum + g.timeout_seconds, 0);
  const postMergeGates = gateActivities(postMergeTimeout);
  const status: ObjectiveStatus = {
    objectiveId: input.id,
    phase: 'preparing',
    integrationBranch: '',
    streams: input.streams.map((s) => ({ id: s.id, phase: 'waiting', iterations: 0 })),
    mergeOrder: [],
  };
  const view = (id: string) => status.streams.find((s) => s.id === id)!;
  const mergeQueue: MergeRequest[] = [];
  const running = new Map<string, ChildWorkflowHandle<typeof streamWorkflow>>();
  let childEnded = false;

  setHandler(objectiveStatusQuery, () => status);
  setHandler(streamMergeReadySignal, (request) => {
    mergeQueue.push(request);
    view(request.streamId).phase = 'merge_ready';
  });
  upsertSearchAttributes([
    { key: SlipwayKind, value: 'objective' },
    { key: SlipwayObjective, value: input.id },
  ]);
  const enter = (phase: ObjectivePhase, details: string) => {
    status.phase = phase;
    upsertSearchAttributes([{ key: SlipwayPhase, value: phase }]);
    setCurrentDetails(`**${phase}** — ${details}\n\n${summarizeStreams(status.streams)}`);
  };

  enter('preparing', `creating the integration branch from \`${input.baseBranch}\``);
  const prepared = await git.prepareObjective({ objectiveId: input.id, repository: input.repository, baseBranch: input.baseBranch });
  status.integrationBranch = prepared.integrationBranch;
  status.baseCommit = prepared.baseCommit;

  const startEligible = async () => {
    for (const spec of input.streams) {
      const v = view(spec.id);
      if (v.phase !== 'waiting' || running.has(spec.id)) continue;
      const deps = spec.depends_on.map(view);
      const brokenDep = deps.find((d) => d.phase === 'failed');
      if (brokenDep) {
        v.phase = 'failed';
        v.failure = { kind: 'unknown', summary: `dependency "${brokenDep.id}" failed` };
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
            gates: input.gates,
            agents: input.agents,
            maxFixIterations: input.maxFixIterations,
            parentWorkflowId: workflowInfo().workflowId,
          },
        ],
        staticSummary: `Stream ${spec.id}: ${truncate(spec.task, 120)}`,
        staticDetails: `Objective \`${input.id}\`, builds on \`${base === prepared.baseCommit ? input.baseBranch : prepared.integrationBranch}\`.`,
      });
      running.set(spec.id, handle);
      v.phase = 'provisioning';
      handle
        .result()
        .then((result) => applyStreamResult(result))
        .catch((err) => {
          const stream = view(spec.id);
          stream.phase = 'failed';
          stream.failure = { kind: failureKindOf(err), summary: failureMessage(err) };
        })
        .finally(() => {
          running.delete(spec.id);
          childEnded = true;
        });
    }
  };
  const applyStreamResult = (result: StreamResult) => {
    const v = view(result.streamId);
    v.iterations = result.iterations;
    v.phase = result.status === 'merged' ? 'merged' : 'failed';
    v.mergeCommit = result.mergeCommit;
    v.failure = result.failure;
  };

  const mergeOne = async (request: MergeRequest) => {
    enter('merging', `merging stream ${request.streamId}`);
    view(request.streamId).phase = 'merging';
    const streamHandle = getExternalWorkflowHandle(streamWorkflowId(input.id, request.streamId));
    const merged = await git.mergeStream({
      mergerPath: prepared.mergerPath,
      branch: request.branch,
      headCommit: request.headCommit,
      message: `slipway: merge stream ${request.streamId} into ${prepared.integrationBranch}\n\nObjective ${input.id}: ${input.objective}`,
    });
    let decision: MergeDecision;
    if (merged.status === 'conflict') {
      decision = {
        status: 'rejected',
        kind: 'merge_conflict',
        summary: `merge conflict in ${merged.files.join(', ') || 'unknown files'}`,
        details: merged.details,
      };
    } else {
      decision = { status: 'merged', commit: merged.commit };
      if (input.postMergeGates.length > 0) {
        const gates = await postMergeGates.runGates({ path: prepared.mergerPath, gates: input.postMergeGates });
        if (!gates.passed) {
          await git.resetIntegration({ mergerPath: prepared.mergerPath, commit: merged.previous });
          decision = { status: 'rejected', kind: 'post_merge_gate_failure', summary: 'post-merge gates failed; the merge was reverted', details: gates.failureReport };
        }
      }
    }
    if (decision.status === 'merged') status.mergeOrder.push(request.streamId);
    await streamHandle.signal(mergeDecisionSignal, decision);
  };

  enter('running', `${input.streams.length} streams, up to ${input.maxParallelStreams} at a time`);
  for (;;) {
    await startEligible();
    if (running.size === 0 && mergeQueue.length === 0) break;
    await condition(() => mergeQueue.length > 0 || childEnded);
    childEnded = false;
    while (mergeQueue.length > 0) await mergeOne(mergeQueue.shift()!);
    if (status.phase === 'merging') enter('running', 'streams in progress');
  }

  enter('finishing', 'removing the merger worktree');
  const finished = await git.finishObjective({ repository: input.repository, objectiveId: input.id });
  const outcome = decideOutcome(status.streams);
  status.outcome = outcome;
  upsertSearchAttributes([{ key: SlipwayOutcome, value: outcome }]);
  enter('done', `outcome **${outcome}**: ${status.mergeOrder.length}/${input.streams.length} streams merged into \`${prepared.integrationBranch}\``);
  return { ...status, outcome, integrationHead: finished.integrationHead };
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

function summarizeStreams(streams: ObjectiveStreamView[]): string {
  return streams.map((s) => `- ${s.id}: ${s.phase}${s.failure ? ` (${s.failure.summary})` : ''}`).join('\n');
}
