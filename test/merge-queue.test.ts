/**
 * The merge queue's decisions (workflows/merge-queue.ts), without Temporal: each case scripts what
 * the activities report and checks the actions, the decision sent to the stream and the
 * integration tip the queue expects next.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { MergeDecision } from '../core/types';
import { mergeMessage, mergeQueueFinished, mergeStep, startMerge, type MergeAction, type MergeEvent, type MergeState } from '../workflows/merge-queue';

interface Case {
  name: string;
  postMergeGates: boolean;
  events: MergeEvent[];
  actions: MergeAction['type'][];
  decision: MergeDecision;
  tip: string | undefined;
  landed: boolean;
  feed: string;
}

const merged = (commit = 'c0ffee1234567890', previous = 'tip0'): MergeEvent => ({ type: 'merge_finished', result: { status: 'merged', commit, previous } });

const cases: Case[] = [
  {
    name: 'merged, no post-merge gates: the stream lands and the tip moves',
    postMergeGates: false,
    events: [merged()],
    actions: ['send_decision'],
    decision: { status: 'merged', commit: 'c0ffee1234567890' },
    tip: 'c0ffee1234567890',
    landed: true,
    feed: 'merged s1 as c0ffee1234',
  },
  {
    name: 'merged, post-merge gates pass',
    postMergeGates: true,
    events: [merged(), { type: 'post_merge_gates_finished', passed: true, failureReport: '' }],
    actions: ['run_post_merge_gates', 'send_decision'],
    decision: { status: 'merged', commit: 'c0ffee1234567890' },
    tip: 'c0ffee1234567890',
    landed: true,
    feed: 'merged s1 as c0ffee1234',
  },
  {
    name: 'merged, post-merge gates fail: revert to the previous tip, restart the stream',
    postMergeGates: true,
    events: [merged(), { type: 'post_merge_gates_finished', passed: false, failureReport: 'REPORT' }, { type: 'integration_reset' }],
    actions: ['run_post_merge_gates', 'reset_integration', 'send_decision'],
    decision: { status: 'rejected', kind: 'post_merge_gate_failure', summary: 'post-merge gates failed; the merge was reverted', details: 'REPORT' },
    tip: 'tip0',
    landed: false,
    feed: 'post_merge_gate_failure: s1 not merged (post-merge gates failed; the merge was reverted)',
  },
  {
    name: 'conflict: sent back to the builder, tip unchanged',
    postMergeGates: true,
    events: [{ type: 'merge_finished', result: { status: 'conflict', files: ['a.js', 'b.js'], details: 'D' } }],
    actions: ['send_decision'],
    decision: { status: 'rejected', kind: 'merge_conflict', summary: 'merge conflict in a.js, b.js', details: 'D' },
    tip: 'tip0',
    landed: false,
    feed: 'merge_conflict: s1 not merged (merge conflict in a.js, b.js)',
  },
  {
    name: 'conflict without file names',
    postMergeGates: false,
    events: [{ type: 'merge_finished', result: { status: 'conflict', files: [], details: '' } }],
    actions: ['send_decision'],
    decision: { status: 'rejected', kind: 'merge_conflict', summary: 'merge conflict in unknown files', details: '' },
    tip: 'tip0',
    landed: false,
    feed: 'merge_conflict: s1 not merged (merge conflict in unknown files)',
  },
  {
    name: 'no changes: nothing merged, no gates, the stream ends no_changes',
    postMergeGates: true,
    events: [{ type: 'merge_finished', result: { status: 'no_changes', summary: 'nothing new' } }],
    actions: ['send_decision'],
    decision: { status: 'no_changes', summary: 'nothing new' },
    tip: 'tip0',
    landed: false,
    feed: 'no changes: s1 not merged (nothing new)',
  },
];

describe('merge of one stream', () => {
  it.each(cases)('$name', (c) => {
    let state: MergeState = startMerge('s1', 'tip0');
    const actions: MergeAction[] = [];
    for (const event of c.events) {
      const step = mergeStep(state, event, { postMergeGates: c.postMergeGates });
      state = step.state;
      actions.push(step.action);
    }
    expect(actions.map((a) => a.type)).toEqual(c.actions);
    const last = actions.at(-1)!;
    expect(last).toEqual({ type: 'send_decision', decision: c.decision, landed: c.landed, feed: c.feed });
    expect(state.stage).toEqual({ type: 'done', decision: c.decision });
    expect(state.tip).toBe(c.tip);
    if (c.actions.includes('reset_integration')) expect(actions.find((a) => a.type === 'reset_integration')).toEqual({ type: 'reset_integration', commit: 'tip0' });
  });

  it('refuses an event the merge does not wait for', () => {
    const start = startMerge('s1', undefined);
    expect(() => mergeStep(start, { type: 'integration_reset' }, { postMergeGates: true })).toThrow(/merging; it does not take integration_reset/);
    const done = mergeStep(start, merged(), { postMergeGates: false }).state;
    expect(() => mergeStep(done, merged(), { postMergeGates: false })).toThrow(/done/);
  });

  it('names the stream, the branch and the objective in the merge message', () => {
    expect(mergeMessage('s1', 'slipway/o/integration', 'o', 'add greet')).toBe('slipway: merge stream s1 into slipway/o/integration\n\nObjective o: add greet');
  });
});

describe('merge queue finished', () => {
  it.each([
    { running: 0, queued: 0, waitingStreams: 0, canStartStreams: true, finished: true },
    { running: 1, queued: 0, waitingStreams: 0, canStartStreams: true, finished: false },
    { running: 0, queued: 1, waitingStreams: 0, canStartStreams: true, finished: false },
    { running: 0, queued: 0, waitingStreams: 2, canStartStreams: true, finished: false },
    { running: 0, queued: 0, waitingStreams: 2, canStartStreams: false, finished: true },
  ])('running $running, queued $queued, waiting $waitingStreams (can start: $canStartStreams) -> $finished', ({ finished, ...q }) => {
    expect(mergeQueueFinished(q)).toBe(finished);
  });

  it('the module is pure: it imports only core types', () => {
    const source = readFileSync(path.join(__dirname, '..', 'workflows', 'merge-queue.ts'), 'utf8');
    const froms = [...source.matchAll(/^import (type )?.*? from '([^']+)';$/gms)].map((m) => `${m[1] ?? ''}${m[2]}`);
    expect(froms).toEqual(['type ../core/types']);
  });
});
