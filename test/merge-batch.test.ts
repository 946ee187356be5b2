/**
 * Batch merges with bisection (workflows/merge-batch.ts), without Temporal: single steps as a
 * table, then whole batches played against a gate that judges the integration branch's content,
 * including a failure that only a combination of streams causes.
 */
import { describe, expect, it } from 'vitest';
import { batchSize, batchStep, MAX_BATCH, startBatch, type BatchDecision, type BatchState, type BatchTry } from '../workflows/merge-batch';
import type { MergeResult } from '../workflows/merge-queue';

const merged = (id: string, previous = 'tip0'): MergeResult => ({ status: 'merged', commit: `m-${id}`, previous });
const conflict: MergeResult = { status: 'conflict', files: ['x.js'], details: 'CONFLICT' };
const unchanged: MergeResult = { status: 'no_changes', summary: 'nothing new' };
const summary = (d: BatchDecision) => `${d.streamId}:${d.decision.status === 'rejected' ? d.decision.kind : d.decision.status}${d.landed ? '+' : ''}`;

interface StepCase {
  name: string;
  groups: string[][];
  tried: BatchTry;
  postMergeGates?: boolean;
  decisions: string[];
  groupsAfter: string[][];
  tip: string;
  feed: RegExp[];
}

const cases: StepCase[] = [
  {
    name: 'no post-merge gates: every merged stream lands in order, the tip is the last merge',
    groups: [['a', 'b', 'c']],
    tried: { merges: [merged('a'), merged('b', 'm-a'), merged('c', 'm-b')] },
    postMergeGates: false,
    decisions: ['a:merged+', 'b:merged+', 'c:merged+'],
    groupsAfter: [],
    tip: 'm-c',
    feed: [],
  },
  {
    name: 'gates pass: a conflict and an unchanged stream are decided beside the landed ones',
    groups: [['a', 'b', 'c', 'd'], ['e']],
    tried: { merges: [merged('a'), conflict, unchanged, merged('d', 'm-a')], gates: { passed: true, failureReport: '' } },
    decisions: ['a:merged+', 'b:merge_conflict', 'c:no_changes', 'd:merged+'],
    groupsAfter: [['e']],
    tip: 'm-d',
    feed: [],
  },
  {
    name: 'gates fail with four merged: reverted and split in halves, nothing decided',
    groups: [['a', 'b', 'c', 'd'], ['e']],
    tried: { merges: [merged('a'), merged('b'), merged('c'), merged('d')], gates: { passed: false, failureReport: 'R' } },
    decisions: [],
    groupsAfter: [['a', 'b'], ['c', 'd'], ['e']],
    tip: 'tip0',
    feed: [/batch a, b, c, d failed its post-merge gates and was reverted: bisecting into a, b \| c, d/],
  },
  {
    name: 'an odd group splits with the larger half first',
    groups: [['a', 'b', 'c']],
    tried: { merges: [merged('a'), merged('b'), merged('c')], gates: { passed: false, failureReport: 'R' } },
    decisions: [],
    groupsAfter: [['a', 'b'], ['c']],
    tip: 'tip0',
    feed: [/bisecting into a, b \| c/],
  },
  {
    name: 'gates fail with one merged stream: it is the culprit, the conflicted one is tried again without it',
    groups: [['a', 'b']],
    tried: { merges: [conflict, merged('b')], gates: { passed: false, failureReport: 'REPORT' } },
    decisions: ['b:post_merge_gate_failure'],
    groupsAfter: [['a']],
    tip: 'tip0',
    feed: [/batch a, b: b fails the post-merge gates; the others are tried again without it/],
  },
  {
    name: 'a single stream failing the gates: the normal post-merge gate failure',
    groups: [['d'], ['e']],
    tried: { merges: [merged('d')], gates: { passed: false, failureReport: 'REPORT' } },
    decisions: ['d:post_merge_gate_failure'],
    groupsAfter: [['e']],
    tip: 'tip0',
    feed: [],
  },
  {
    name: 'nothing merged: no gates ran, every stream is decided',
    groups: [['a', 'b']],
    tried: { merges: [conflict, unchanged] },
    decisions: ['a:merge_conflict', 'b:no_changes'],
    groupsAfter: [],
    tip: 'tip0',
    feed: [],
  },
];

describe('batch merges: one step', () => {
  for (const c of cases) {
    it(c.name, () => {
      const out = batchStep({ groups: c.groups, tip: 'tip0' }, c.tried, { postMergeGates: c.postMergeGates ?? true });
      expect(out.decisions.map(summary)).toEqual(c.decisions);
      expect(out.state.groups).toEqual(c.groupsAfter);
      expect(out.state.tip).toBe(c.tip);
      expect(out.feed).toHaveLength(c.feed.length);
      c.feed.forEach((re, i) => expect(out.feed[i]).toMatch(re));
    });
  }

  it('the culprit hears the same decision as a stream merged alone, with the gates\' report', () => {
    const out = batchStep({ groups: [['d']], tip: 'tip0' }, { merges: [merged('d')], gates: { passed: false, failureReport: 'REPORT' } }, { postMergeGates: true });
    expect(out.decisions[0]).toEqual({
      streamId: 'd',
      decision: { status: 'rejected', kind: 'post_merge_gate_failure', summary: 'post-merge gates failed; the merge was reverted', details: 'REPORT' },
      landed: false,
      feed: 'post_merge_gate_failure: d not merged (post-merge gates failed; the merge was reverted)',
    });
  });

  it('refuses a report that does not match the group, and a batch with nothing left', () => {
    expect(() => batchStep({ groups: [['a', 'b']], tip: 't' }, { merges: [merged('a')] }, { postMergeGates: false })).toThrow(/2 streams reported 1/);
    expect(() => batchStep({ groups: [], tip: 't' }, { merges: [] }, { postMergeGates: false })).toThrow(/no group left/);
  });

  it('batches only when more than one stream waits, at most MAX_BATCH', () => {
    expect([0, 1, 2, 5, MAX_BATCH, MAX_BATCH + 3].map((n) => batchSize(n))).toEqual([0, 0, 2, 5, MAX_BATCH, MAX_BATCH]);
    expect(startBatch([], 't').groups).toEqual([]);
  });
});

/**
 * Plays a batch to its end: each try merges the group on top of what landed, and the gate passes
 * unless `fails` says the integration branch's content (landed streams + the group) is bad.
 */
function play(streams: string[], fails: (content: Set<string>) => boolean) {
  let state: BatchState = startBatch(streams, 'tip0');
  const landed: string[] = [];
  const decisions: string[] = [];
  let tries = 0;
  while (state.groups.length > 0) {
    const group = state.groups[0];
    tries++;
    const content = new Set([...landed, ...group]);
    const out = batchStep(state, { merges: group.map((id) => merged(id)), gates: fails(content) ? { passed: false, failureReport: 'R' } : { passed: true, failureReport: '' } }, { postMergeGates: true });
    for (const d of out.decisions) {
      decisions.push(summary(d));
      if (d.landed) landed.push(d.streamId);
    }
    state = out.state;
    expect(tries).toBeLessThan(64);
  }
  return { landed, decisions, tries, tip: state.tip };
}

describe('batch merges: bisection to the culprit', () => {
  const ids = ['a', 'b', 'c', 'd', 'e'];

  it('a batch that passes lands in one try', () => {
    const r = play(ids, () => false);
    expect(r.tries).toBe(1);
    expect(r.landed).toEqual(ids);
    expect(r.tip).toBe('m-e');
  });

  it('a failure only b and d cause together: d (the later) is the culprit, every other stream lands', () => {
    const r = play(ids, (c) => c.has('b') && c.has('d'));
    expect(r.decisions.filter((d) => d.includes('failure'))).toEqual(['d:post_merge_gate_failure']);
    expect(r.landed).toEqual(['a', 'b', 'c', 'e']);
    expect(r.tip).toBe('m-e');
  });

  it('the combination with a stream that landed in an earlier batch: the new one is the culprit', () => {
    // b landed before (content outside this batch): the batch a, c, d, e fails because of d.
    const before = new Set(['b']);
    const r = play(['a', 'c', 'd', 'e'], (c) => before.has('b') && c.has('d'));
    expect(r.decisions.filter((d) => d.includes('failure'))).toEqual(['d:post_merge_gate_failure']);
    expect(r.landed).toEqual(['a', 'c', 'e']);
  });

  it('two culprits failing on their own are both found; the rest land', () => {
    const r = play(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'], (c) => c.has('c') || c.has('g'));
    expect(r.decisions.filter((d) => d.includes('failure')).sort()).toEqual(['c:post_merge_gate_failure', 'g:post_merge_gate_failure']);
    expect(r.landed).toEqual(['a', 'b', 'd', 'e', 'f', 'h']);
  });

  it('a gate that always fails rejects each stream once and lands nothing', () => {
    const r = play(ids, () => true);
    expect(r.landed).toEqual([]);
    expect(r.decisions.sort()).toEqual(ids.map((id) => `${id}:post_merge_gate_failure`));
    expect(r.tip).toBe('tip0');
  });

  it('one culprit among MAX_BATCH takes at most 2·log2(n) + 1 tries', () => {
    const batch = Array.from({ length: MAX_BATCH }, (_, i) => `s${i}`);
    for (const culprit of batch) {
      const r = play(batch, (c) => c.has(culprit));
      expect(r.landed).toEqual(batch.filter((id) => id !== culprit));
      expect(r.tries).toBeLessThanOrEqual(2 * Math.log2(MAX_BATCH) + 1);
    }
  });
});
