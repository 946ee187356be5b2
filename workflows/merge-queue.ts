/**
 * The merge queue's decisions, pure: one stream's merge as a small state machine (merge ->
 * post-merge gates -> revert on failure -> decision for the stream), the integration tip the
 * queue expects, and when the queue has nothing left to wait for.
 *
 * The objective workflow (workflows/objective.ts) is the shell: it runs the activities
 * (`mergeStream`, `runGates`, `resetIntegration`), feeds their results here as events and carries
 * out the actions (run the post-merge gates, reset the integration branch, send the decision to
 * the stream). Bundled into workflow code: types and pure helpers only.
 */
import type { MergeDecision } from '../core/types';

/** What `mergeStream` reports (structurally the activity's `MergeOutcome`). */
export type MergeResult =
  | { status: 'merged'; commit: string; previous: string }
  | { status: 'no_changes'; summary: string }
  | { status: 'conflict'; files: string[]; details: string };

export type MergeStage =
  | { type: 'merging' }
  /** Merged as `commit` over `previous`; the post-merge gates run on the integration branch. */
  | { type: 'post_merge_gates'; commit: string; previous: string }
  /** The post-merge gates failed: the integration branch goes back to `previous`. */
  | { type: 'reverting'; previous: string; failureReport: string }
  | { type: 'done'; decision: MergeDecision };

export interface MergeState {
  streamId: string;
  /** The integration tip the queue left there; `mergeStream` refuses any other. */
  tip?: string;
  stage: MergeStage;
}

export type MergeEvent =
  | { type: 'merge_finished'; result: MergeResult }
  | { type: 'post_merge_gates_finished'; passed: boolean; failureReport: string }
  | { type: 'integration_reset' };

export type MergeAction =
  | { type: 'run_post_merge_gates' }
  | { type: 'reset_integration'; commit: string }
  /** Tell the stream; `landed` says whether the stream joins the merge order. */
  | { type: 'send_decision'; decision: MergeDecision; landed: boolean; feed: string };

export interface MergeContext {
  /** Whether post-merge gates are configured. */
  postMergeGates: boolean;
}

export function startMerge(streamId: string, tip: string | undefined): MergeState {
  return { streamId, tip, stage: { type: 'merging' } };
}

/** The commit message of a stream's merge into the integration branch. */
export function mergeMessage(streamId: string, integrationBranch: string, objectiveId: string, objective: string): string {
  return `slipway: merge stream ${streamId} into ${integrationBranch}\n\nObjective ${objectiveId}: ${objective}`;
}

const EXPECTS: Record<MergeStage['type'], MergeEvent['type'] | undefined> = {
  merging: 'merge_finished',
  post_merge_gates: 'post_merge_gates_finished',
  reverting: 'integration_reset',
  done: undefined,
};

/** One step of a stream's merge. Throws on an event the merge does not wait for (a shell bug). */
export function mergeStep(state: MergeState, event: MergeEvent, ctx: MergeContext): { state: MergeState; action: MergeAction } {
  const stage = state.stage;
  if (EXPECTS[stage.type] !== event.type) throw new Error(`merge of ${state.streamId} is ${stage.type}; it does not take ${event.type}`);
  const decide = (decision: MergeDecision, tip: string | undefined) => ({
    state: { ...state, tip, stage: { type: 'done' as const, decision } },
    action: { type: 'send_decision' as const, decision, landed: decision.status === 'merged', feed: feedLine(state.streamId, decision) },
  });

  if (event.type === 'merge_finished') {
    const r = event.result;
    if (r.status === 'no_changes') return decide({ status: 'no_changes', summary: r.summary }, state.tip);
    if (r.status === 'conflict') {
      return decide({ status: 'rejected', kind: 'merge_conflict', summary: `merge conflict in ${r.files.join(', ') || 'unknown files'}`, details: r.details }, state.tip);
    }
    if (!ctx.postMergeGates) return decide({ status: 'merged', commit: r.commit }, r.commit);
    return { state: { ...state, stage: { type: 'post_merge_gates', commit: r.commit, previous: r.previous } }, action: { type: 'run_post_merge_gates' } };
  }
  if (event.type === 'post_merge_gates_finished') {
    const { commit, previous } = stage as Extract<MergeStage, { type: 'post_merge_gates' }>;
    if (event.passed) return decide({ status: 'merged', commit }, commit);
    return { state: { ...state, stage: { type: 'reverting', previous, failureReport: event.failureReport } }, action: { type: 'reset_integration', commit: previous } };
  }
  // integration_reset: the merge was reverted; the queue's tip is the commit before it.
  const { previous, failureReport } = stage as Extract<MergeStage, { type: 'reverting' }>;
  return decide({ status: 'rejected', kind: 'post_merge_gate_failure', summary: 'post-merge gates failed; the merge was reverted', details: failureReport }, previous);
}

/** The merge queue's feed line for a decision. */
export function feedLine(streamId: string, decision: MergeDecision): string {
  if (decision.status === 'merged') return `merged ${streamId} as ${decision.commit.slice(0, 10)}`;
  if (decision.status === 'no_changes') return `no changes: ${streamId} not merged (${decision.summary})`;
  return `${decision.kind}: ${streamId} not merged (${decision.summary})`;
}

/**
 * The queue is finished when no stream runs, nothing waits to merge, and no stream still waits
 * to start (streams can only wait when there is a stream blueprint to start them with).
 */
export function mergeQueueFinished(q: { running: number; queued: number; waitingStreams: number; canStartStreams: boolean }): boolean {
  return q.running === 0 && q.queued === 0 && (q.waitingStreams === 0 || !q.canStartStreams);
}
