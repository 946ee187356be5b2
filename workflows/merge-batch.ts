/**
 * Batch merges with bisection, pure (issue 17, docs/adr/0031-batch-merges.md). When several
 * streams wait in the merge queue, they are merged one after the other and gated once, in one
 * activity (`mergeBatch`). A batch whose post-merge gates fail is reverted as a whole and bisected:
 * its halves are tried in turn (the first half's streams land before the second half is tried on
 * top of them), until the stream that fails the gates on its own (the culprit) is left; it takes
 * the normal post-merge-gate-failure path, and the others land.
 *
 * Each stream's decision is made by ./merge-queue's state machine, fed what the batch did, so a
 * decision reads the same whether the stream was merged alone or in a batch.
 * Bundled into workflow code: types and pure helpers only.
 */
import type { MergeDecision } from '../core/types';
import { mergeStep, startMerge, type MergeEvent, type MergeResult } from './merge-queue';

/**
 * Most streams merged and gated as one batch: a failing batch of n takes about 2·log2(n) more
 * tries to find one culprit, and the rest of the queue waits for the next batch.
 */
export const MAX_BATCH = 8;

export interface BatchState {
  /** Groups of stream ids still to try, in order; the first is tried next. */
  groups: string[][];
  /** The integration tip the next try starts from (`mergeBatch` refuses any other). */
  tip: string | undefined;
}

/** What one try of a group reported: each stream's merge in the group's order, and the gates on all of them. */
export interface BatchTry {
  merges: MergeResult[];
  /** Absent when nothing was merged or no post-merge gates are configured. */
  gates?: { passed: boolean; failureReport: string };
}

export interface BatchDecision {
  streamId: string;
  decision: MergeDecision;
  /** Whether the stream joins the merge order. */
  landed: boolean;
  feed: string;
}

/** Whether the queue's waiting requests go as one batch (more than one waits). */
export function batchSize(queued: number, max = MAX_BATCH): number {
  return queued > 1 ? Math.min(queued, max) : 0;
}

export function startBatch(streamIds: string[], tip: string | undefined): BatchState {
  return { groups: streamIds.length > 0 ? [streamIds] : [], tip };
}

/**
 * Takes the report of the first group's try. Final decisions come out in merge order; a group
 * whose gates failed with two or more streams merged is split in halves (tried in turn), and with
 * one merged stream that stream is the culprit, while the group's other streams (a conflict or no
 * change, decided beside it) are tried again without it.
 */
export function batchStep(state: BatchState, tried: BatchTry, ctx: { postMergeGates: boolean }): { state: BatchState; decisions: BatchDecision[]; feed: string[] } {
  const [group, ...rest] = state.groups;
  if (!group) throw new Error('the batch has no group left to try');
  if (tried.merges.length !== group.length) throw new Error(`a try of ${group.length} streams reported ${tried.merges.length} merges`);
  const merged = group.filter((_, i) => tried.merges[i].status === 'merged');
  const failed = ctx.postMergeGates && merged.length > 0 && tried.gates !== undefined && !tried.gates.passed;

  if (!failed) {
    const decisions: BatchDecision[] = [];
    let tip = state.tip;
    group.forEach((streamId, i) => {
      const events: MergeEvent[] = [{ type: 'merge_finished', result: tried.merges[i] }];
      if (ctx.postMergeGates && tried.merges[i].status === 'merged') events.push({ type: 'post_merge_gates_finished', passed: true, failureReport: '' });
      const made = decide(streamId, tip, events, ctx);
      tip = made.tip;
      decisions.push(made.decision);
    });
    return { state: { groups: rest, tip }, decisions, feed: [] };
  }

  if (merged.length === 1) {
    const culprit = merged[0];
    const i = group.indexOf(culprit);
    const made = decide(
      culprit,
      state.tip,
      [
        { type: 'merge_finished', result: tried.merges[i] },
        { type: 'post_merge_gates_finished', passed: false, failureReport: tried.gates!.failureReport },
        { type: 'integration_reset' },
      ],
      ctx,
    );
    const others = group.filter((id) => id !== culprit);
    return {
      state: { groups: others.length > 0 ? [others, ...rest] : rest, tip: state.tip },
      decisions: [made.decision],
      feed: group.length > 1 ? [`batch ${group.join(', ')}: ${culprit} fails the post-merge gates; the others are tried again without it`] : [],
    };
  }

  const half = Math.ceil(group.length / 2);
  const halves = [group.slice(0, half), group.slice(half)];
  return {
    state: { groups: [...halves, ...rest], tip: state.tip },
    decisions: [],
    feed: [`batch ${group.join(', ')} failed its post-merge gates and was reverted: bisecting into ${halves.map((h) => h.join(', ')).join(' | ')}`],
  };
}

/** One stream's decision through ./merge-queue's state machine. */
function decide(streamId: string, tip: string | undefined, events: MergeEvent[], ctx: { postMergeGates: boolean }): { decision: BatchDecision; tip: string | undefined } {
  let merge = startMerge(streamId, tip);
  for (const event of events) {
    const step = mergeStep(merge, event, ctx);
    merge = step.state;
    if (step.action.type === 'send_decision') {
      const { decision, landed, feed } = step.action;
      return { decision: { streamId, decision, landed, feed }, tip: merge.tip };
    }
  }
  throw new Error(`the merge of ${streamId} in a batch reached no decision`);
}
