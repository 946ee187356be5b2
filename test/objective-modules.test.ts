/**
 * The objective workflow's decisions, without Temporal: stream dispatch (workflows/dispatch.ts),
 * the planner step (workflows/planner-step.ts), the feed and stream-event batching
 * (workflows/feed.ts), when the objective continues as new (workflows/objective-rollover.ts)
 * and the stream graph's bounds (core/stream-graph.ts).
 */
import { describe, expect, it } from 'vitest';
import type { Step } from '../core/blueprint-schema';
import { MAX_STREAMS, streamGraphIssues } from '../core/stream-graph';
import type { StreamPhase } from '../core/states';
import type { ObjectiveInput, ObjectiveStatus, ObjectiveStreamView, StreamEvent } from '../core/types';
import { ObjectiveFileSchema } from '../core/objective-schema';
import { PlanSchema } from '../agents/structured';
import { dispatch, streamStart, type DispatchDecision, type DispatchState } from '../workflows/dispatch';
import { appendFeed, applyStreamEvent, emptyFeed, FEED_LIMIT, feedAfter, flushNow, objectiveDetails } from '../workflows/feed';
import { CARRIED_AGENT_RUNS, CARRIED_FEED_LINES, CARRIED_LEDGER_ENTRIES, DEFAULT_CONTINUE_AS_NEW_AFTER, shouldContinueAsNew, streamsToAwaitAtEnd, trimCarry } from '../workflows/objective-rollover';
import { afterStepFailure, approvalNeeded, plannerRunInput, plannerStepAction, rateLimitWait, streamsFromPlan } from '../workflows/planner-step';

const spec = (id: string, depends_on: string[] = []) => ({ id, task: `task ${id}`, depends_on });
const many = (n: number) => Array.from({ length: n }, (_, i) => spec(`s${i}`));

describe('stream dispatch', () => {
  const state = (over: Partial<DispatchState> & { phases: Record<string, StreamPhase> }): DispatchState => {
    const { phases, ...rest } = over;
    return {
      streams: Object.keys(phases).map((id) => spec(id)),
      views: Object.entries(phases).map(([id, phase]) => ({ id, phase })),
      running: 0,
      maxParallel: 3,
      baseCommit: 'BASE',
      landed: {},
      mergeOrder: [],
      ...rest,
    };
  };
  const cases: { name: string; state: DispatchState; expected: DispatchDecision[] }[] = [
    {
      name: 'independent streams start from the base commit, in order, up to the bound',
      state: state({ phases: { a: 'waiting', b: 'waiting', c: 'waiting', d: 'waiting' }, maxParallel: 2 }),
      expected: [
        { type: 'start', streamId: 'a', base: 'BASE' },
        { type: 'start', streamId: 'b', base: 'BASE' },
      ],
    },
    {
      name: 'running streams take slots; a full objective starts nothing',
      state: state({ phases: { a: 'building', b: 'waiting' }, running: 3 }),
      expected: [],
    },
    {
      name: 'streams already started are not started again',
      state: state({ phases: { a: 'provisioning', b: 'merged', c: 'waiting' }, running: 1 }),
      expected: [{ type: 'start', streamId: 'c', base: 'BASE' }],
    },
    {
      name: 'a dependent waits while its dependency has not landed',
      state: { ...state({ phases: { a: 'merging', b: 'waiting' } }), streams: [spec('a'), spec('b', ['a'])] },
      expected: [],
    },
    {
      name: 'a dependent starts from the merge commit of its dependency, not a branch name',
      state: { ...state({ phases: { a: 'merging', b: 'waiting' }, landed: { a: 'MERGE_A' }, mergeOrder: ['a'] }), streams: [spec('a'), spec('b', ['a'])] },
      expected: [{ type: 'start', streamId: 'b', base: 'MERGE_A' }],
    },
    {
      name: 'with several dependencies: the merge commit of the one that landed last',
      state: {
        ...state({ phases: { a: 'merged', b: 'merged', x: 'merged', c: 'waiting' }, landed: { a: 'MA', b: 'MB', x: 'MX' }, mergeOrder: ['b', 'x', 'a'] }),
        streams: [spec('a'), spec('b'), spec('x'), spec('c', ['b', 'a'])],
      },
      expected: [{ type: 'start', streamId: 'c', base: 'MA' }],
    },
    {
      name: 'a dependency that failed, escalated or changed nothing fails its dependent (no wait for ever)',
      state: {
        ...state({ phases: { f: 'failed', e: 'escalated', n: 'no_changes', a: 'waiting', b: 'waiting', c: 'waiting' } }),
        streams: [spec('f'), spec('e'), spec('n'), spec('a', ['f']), spec('b', ['e']), spec('c', ['n'])],
      },
      expected: [
        { type: 'fail', streamId: 'a', summary: 'dependency "f" did not merge (it ended failed)' },
        { type: 'fail', streamId: 'b', summary: 'dependency "e" did not merge (it ended escalated)' },
        { type: 'fail', streamId: 'c', summary: 'dependency "n" did not merge (it ended no_changes)' },
      ],
    },
    {
      name: 'a failed dependent is reported even when no slot is free',
      state: { ...state({ phases: { f: 'failed', a: 'waiting', z: 'waiting' }, running: 3 }), streams: [spec('f'), spec('a', ['f']), spec('z')] },
      expected: [{ type: 'fail', streamId: 'a', summary: 'dependency "f" did not merge (it ended failed)' }],
    },
  ];
  for (const c of cases) it(c.name, () => expect(dispatch(c.state)).toEqual(c.expected));
});

describe('planner step', () => {
  const planner = { id: 'plan', type: 'agent', role: 'planner', optional: true } as Extract<Step, { type: 'agent' }>;
  it.each([
    { name: 'streams given, nothing rejected: skipped', step: planner, ctx: { streams: 2, plannerConfigured: true }, expected: 'skip' },
    { name: 'streams given but the plan was rejected: plans again', step: planner, ctx: { streams: 2, feedback: 'no', plannerConfigured: true }, expected: 'plan' },
    { name: 'no streams: plans', step: planner, ctx: { streams: 0, plannerConfigured: true }, expected: 'plan' },
    { name: 'a required planner plans even with streams', step: { ...planner, optional: false }, ctx: { streams: 2, plannerConfigured: true }, expected: 'plan' },
    { name: 'no streams and no planner: configuration error', step: planner, ctx: { streams: 0, plannerConfigured: false }, expected: /no planner agent is configured/ },
    { name: 'a builder at objective level: configuration error', step: { ...planner, role: 'builder' }, ctx: { streams: 0, plannerConfigured: true }, expected: /a builder step cannot run at objective level/ },
  ] as const)('$name', ({ step, ctx, expected }) => {
    const action = plannerStepAction(step as Extract<Step, { type: 'agent' }>, ctx);
    if (typeof expected === 'string') expect(action.type).toBe(expected);
    else expect(action.type === 'fail' && action.failure).toMatchObject({ kind: 'configuration_error', summary: expect.stringMatching(expected) });
  });

  it.each([
    { optional: false, planned: false, requireApproval: false, expected: true },
    { optional: true, planned: false, requireApproval: false, expected: false },
    { optional: true, planned: true, requireApproval: false, expected: true },
    { optional: true, planned: false, requireApproval: true, expected: true },
  ])('approval of an optional=$optional human step, planned=$planned, require=$requireApproval: $expected', ({ optional, expected, ...ctx }) => {
    expect(approvalNeeded({ id: 'approve', type: 'human', optional } as Extract<Step, { type: 'human' }>, ctx)).toBe(expected);
  });

  it('takes a valid plan as the streams', () => {
    const plan = [spec('a'), spec('b', ['a'])];
    expect(streamsFromPlan(plan)).toEqual({ ok: true, streams: plan });
  });

  it.each([
    { name: 'no plan', plan: undefined, summary: 'the planner returned no streams' },
    { name: 'an empty plan', plan: [], summary: 'the planner returned no streams' },
    {
      name: `more than ${MAX_STREAMS} streams: fails naming the field (never truncated)`,
      plan: many(MAX_STREAMS + 1),
      summary: `the planner's plan is invalid: streams: too many streams: ${MAX_STREAMS + 1}, at most ${MAX_STREAMS} allowed; split the objective into several`,
    },
    { name: 'duplicate ids', plan: [spec('a'), spec('a')], summary: `the planner's plan is invalid: streams[1].id: duplicate stream id "a"` },
    { name: 'an unknown dependency', plan: [spec('a', ['zz'])], summary: `the planner's plan is invalid: streams[0].depends_on[0]: unknown stream "zz"` },
    { name: 'a cycle', plan: [spec('a', ['b']), spec('b', ['a'])], summary: `the planner's plan is invalid: streams[0].depends_on: dependency cycle: a -> b -> a` },
  ])('refuses $name', ({ plan, summary }) => {
    expect(streamsFromPlan(plan)).toEqual({ ok: false, failure: { kind: 'agent_runtime_transient', summary } });
  });

  it('exactly MAX_STREAMS streams are fine', () => {
    expect(streamsFromPlan(many(MAX_STREAMS)).ok).toBe(true);
  });

  const approve = { id: 'approve', type: 'human', on_fail: 'plan' } as Step;
  it.each([
    { name: 'a rejected plan loops back to the planner with the reason', step: approve, kind: 'plan_rejection', fixCount: 0, next: { type: 'loop', step: 'plan', feedback: 'too big' }, attempt: 1, result: 'retrying' },
    { name: 'the last allowed rejection still loops', step: approve, kind: 'plan_rejection', fixCount: 2, next: { type: 'loop', step: 'plan', feedback: 'too big' }, attempt: 3, result: 'retrying' },
    { name: 'a rejection past the fix budget ends the objective', step: approve, kind: 'plan_rejection', fixCount: 3, next: { type: 'fail', error: 'too big' }, attempt: 3, result: 'failed' },
    { name: 'a rejection with nowhere to go ends it', step: { id: 'approve', type: 'human' } as Step, kind: 'plan_rejection', fixCount: 0, next: { type: 'fail', error: 'too big' }, attempt: 3, result: 'failed' },
    { name: 'a configuration error never loops', step: approve, kind: 'configuration_error', fixCount: 0, next: { type: 'fail', error: 'too big' }, attempt: 3, result: 'failed' },
  ] as const)('$name', ({ step, kind, fixCount, next, attempt, result }) => {
    const after = afterStepFailure(step, { kind, summary: 'too big' }, { fixCount, fixLimit: 3, at: 'T' });
    expect(after.next).toEqual(next);
    expect(after.entry).toMatchObject({ at: 'T', step: 'approve', kind, attempt, maxAttempts: 3, summary: 'too big', result });
  });
});

describe('feed', () => {
  it('numbers lines, answers from a cursor and keeps the last FEED_LIMIT lines', () => {
    let feed = emptyFeed();
    for (let i = 1; i <= FEED_LIMIT + 5; i++) feed = appendFeed(feed, { at: 'T', source: 's', text: `line ${i}` });
    expect(feed.seq).toBe(FEED_LIMIT + 5);
    expect(feed.events).toHaveLength(FEED_LIMIT);
    expect(feed.events[0]).toEqual({ seq: 6, at: 'T', source: 's', text: 'line 6' });
    expect(feedAfter(feed, FEED_LIMIT + 3).map((e) => e.text)).toEqual([`line ${FEED_LIMIT + 4}`, `line ${FEED_LIMIT + 5}`]);
    expect(feedAfter(feed, feed.seq)).toEqual([]);
  });

  const event = (over: Partial<StreamEvent>): StreamEvent => ({ streamId: 's', phase: 'building', iteration: 1, text: 't', ...over });
  const view: ObjectiveStreamView = { id: 's', phase: 'provisioning', iterations: 0 };
  it.each([
    { name: 'takes the phase and iteration', before: view, event: event({ phase: 'gates', iteration: 2 }), after: { phase: 'gates', iterations: 2 } },
    { name: 'a final phase is kept against a late event', before: { ...view, phase: 'merged' as const }, event: event({ phase: 'reviewing' }), after: { phase: 'merged' } },
    {
      name: 'a block is set, and cleared by null',
      before: view,
      event: event({ phase: 'blocked', blocked: { mailbox: 'm', since: 'T', step: 'x', kind: 'unknown', summary: 'S' } }),
      after: { phase: 'blocked', blocked: { mailbox: 'm' } },
    },
    { name: 'null clears the block', before: { ...view, blocked: { mailbox: 'm', since: 'T', step: 'x', kind: 'unknown' as const, summary: 'S' } }, event: event({ blocked: null }), after: { blocked: undefined } },
    { name: 'usage is replaced', before: view, event: event({ usage: { inputTokens: 1, outputTokens: 2, cachedTokens: 0, costUsd: 0, runs: 1 } }), after: { usage: { runs: 1 } } },
  ])('stream event: $name', ({ before, event: e, after }) => {
    expect(applyStreamEvent(before, e)).toMatchObject(after);
  });

  it.each([
    { name: 'an ordinary phase line waits for the batch', e: event({ phase: 'building' }), now: false },
    { name: 'an agent run waits for the batch', e: event({ phase: 'reviewing', agentRun: {} as StreamEvent['agentRun'] }), now: false },
    { name: 'a ledger entry waits for the batch', e: event({ phase: 'gates', ledger: {} as StreamEvent['ledger'] }), now: false },
    { name: 'merge-ready goes at once (before the merge request)', e: event({ phase: 'merge_ready' }), now: true },
    { name: 'a block goes at once', e: event({ phase: 'blocked', blocked: {} as StreamEvent['blocked'] }), now: true },
    { name: 'guidance applied (block cleared) goes at once', e: event({ phase: 'building', blocked: null }), now: true },
    ...(['merged', 'no_changes', 'escalated', 'failed'] as const).map((phase) => ({ name: `the end (${phase}) goes at once`, e: event({ phase }), now: true })),
  ])('flush: $name', ({ e, now }) => expect(flushNow(e)).toBe(now));

  it.each([
    { name: 'merge-ready waits for the merge request it goes with', e: event({ phase: 'merge_ready' }), now: false },
    { name: 'the merge request goes at once, with the events before it', e: event({ phase: 'merge_ready', mergeRequest: { streamId: 's', branch: 'b', headCommit: 'c' } }), now: true },
    { name: 'a block still goes at once', e: event({ phase: 'blocked', blocked: {} as StreamEvent['blocked'] }), now: true },
  ])('flush with the merge request in the events: $name', ({ e, now }) => expect(flushNow(e, { requestInEvents: true })).toBe(now));
});

describe('stream graph bounds', () => {
  it('the file and the planner schema refuse more than MAX_STREAMS streams, naming the field', () => {
    const file = { objective: 'o', repository: '/r', streams: many(MAX_STREAMS + 1) };
    const fileResult = ObjectiveFileSchema.safeParse(file);
    expect(fileResult.success).toBe(false);
    expect(fileResult.error!.issues).toContainEqual(expect.objectContaining({ path: ['streams'], message: expect.stringContaining(`too many streams: ${MAX_STREAMS + 1}, at most ${MAX_STREAMS}`) }));
    const plan = PlanSchema.safeParse({ streams: many(MAX_STREAMS + 1) });
    expect(plan.success).toBe(false);
    expect(plan.error!.issues[0]).toMatchObject({ path: ['streams'], message: expect.stringContaining('too many streams') });
    expect(ObjectiveFileSchema.safeParse({ ...file, streams: many(MAX_STREAMS) }).success).toBe(true);
  });

  it('finds a self-dependency before calling it a cycle', () => {
    expect(streamGraphIssues([spec('a', ['a'])])).toEqual([{ path: ['streams', 0, 'depends_on', 0], message: 'a stream cannot depend on itself' }]);
  });
});

describe('objective rollover', () => {
  it.each([
    { name: 'below the default limit: stays', s: { historyLength: DEFAULT_CONTINUE_AS_NEW_AFTER - 1, suggested: false, limit: undefined, runningNotAbandoned: 0 }, expected: false },
    { name: 'at the default limit: continues as new', s: { historyLength: DEFAULT_CONTINUE_AS_NEW_AFTER, suggested: false, limit: undefined, runningNotAbandoned: 0 }, expected: true },
    { name: 'a lower limit from the input', s: { historyLength: 41, suggested: false, limit: 40, runningNotAbandoned: 0 }, expected: true },
    { name: 'the server suggests it', s: { historyLength: 10, suggested: true, limit: undefined, runningNotAbandoned: 0 }, expected: true },
    { name: 'never while a stream would be terminated with the run', s: { historyLength: 50_000, suggested: true, limit: undefined, runningNotAbandoned: 1 }, expected: false },
  ])('$name', ({ s, expected }) => expect(shouldContinueAsNew(s)).toBe(expected));

  it('trims what grows without bound and keeps the feed cursor', () => {
    let feed = emptyFeed();
    for (let i = 0; i < CARRIED_FEED_LINES + 50; i++) feed = appendFeed(feed, { at: 'T', source: 'x', text: `${i}` });
    const entry = { at: 'T', step: 's', kind: 'unknown' as const, action: 'a', attempt: 1, maxAttempts: 1, summary: 's', result: 'failed' as const };
    const carry = trimCarry({
      runs: 1,
      prepared: { integrationBranch: 'i', baseCommit: 'b', mergerPath: '/m', integrationTip: 't' },
      status: {
        objectiveId: 'o', phase: 'running', blueprint: 'standard', integrationBranch: 'i', streams: [], mergeOrder: [], needsAttention: [],
        usage: { inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: 0, runs: 0 },
        ledger: Array.from({ length: CARRIED_LEDGER_ENTRIES + 5 }, () => entry),
        agentRuns: Array.from({ length: CARRIED_AGENT_RUNS + 5 }, () => ({}) as NonNullable<ObjectiveStatus['agentRuns']>[number]),
      },
      feed,
      streams: [],
      streamBlueprint: 'build-review',
      fixCounts: {},
      mergeQueue: [],
      running: ['a'],
      plannerUsage: { inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: 0, runs: 0 },
    });
    expect(carry.feed.seq).toBe(CARRIED_FEED_LINES + 50);
    expect(carry.feed.events).toHaveLength(CARRIED_FEED_LINES);
    expect(carry.feed.events.at(-1)!.seq).toBe(CARRIED_FEED_LINES + 50);
    expect(carry.status.ledger).toHaveLength(CARRIED_LEDGER_ENTRIES);
    expect(carry.status.agentRuns).toHaveLength(CARRIED_AGENT_RUNS);
    expect(carry.running).toEqual(['a']);
  });

  it('a resumed run waits at its end for the streams in a final phase only (their cleanup may still run); running and waiting ones run on', () => {
    const phases: Array<[StreamPhase, boolean]> = [
      ['merged', true], ['no_changes', true], ['escalated', true], ['failed', true],
      ['waiting', false], ['provisioning', false], ['building', false], ['merging', false], ['blocked', false],
    ];
    expect(streamsToAwaitAtEnd(phases.map(([phase], i) => ({ id: `s${i}`, phase })))).toEqual(phases.flatMap(([, waited], i) => (waited ? [`s${i}`] : [])));
  });
});

describe('what the shell hands to Temporal', () => {
  const input = {
    id: 'obj', objective: 'the objective', repository: '/repo', baseBranch: 'main', objectiveDir: '/dir', maxParallelStreams: 3,
    gates: [], postMergeGates: [], agents: { planner: { provider: 'script' } }, streams: [], blueprint: { root: {}, refs: {} },
  } as unknown as ObjectiveInput;
  const blueprint = { id: 'build-review' } as ObjectiveInput['blueprint']['root'];

  it.each([
    { name: 'an independent stream builds on the base branch', base: 'BASE', details: 'Objective `obj`, blueprint `build-review`, builds on `main`.' },
    { name: 'a dependent names the merge commit it builds on', base: 'MERGE', details: 'Objective `obj`, blueprint `build-review`, builds on `MERGE`.' },
  ])('stream start: $name', ({ base, details }) => {
    const start = streamStart(input, spec('s1'), { base, baseCommit: 'BASE', integrationBranch: 'slipway/obj/integration', blueprint, parentWorkflowId: 'objective:obj' });
    expect(start.input).toMatchObject({ base, integrationBranch: 'slipway/obj/integration', parentWorkflowId: 'objective:obj', stream: spec('s1'), blueprint });
    expect(start.details).toBe(details);
    expect(start.summary).toBe('Stream s1: task s1');
    expect(streamStart(input, { ...spec('s2'), task: 'x'.repeat(200) }, { base, baseCommit: 'BASE', integrationBranch: 'i', blueprint, parentWorkflowId: 'p' }).summary).toHaveLength('Stream s2: '.length + 120);
  });

  it('the planner works in the merger worktree, with a rejected plan as feedback', () => {
    expect(plannerRunInput(input, { mergerPath: '/m', integrationBranch: 'i', iteration: 2, feedback: 'too big' })).toMatchObject({
      role: 'planner', sandboxPath: '/m', targetBranch: 'i', iteration: 2, stream: { id: 'plan', task: 'the objective', branch: 'i' },
      feedback: { kind: 'plan_rejection', summary: 'too big' },
    });
    expect(plannerRunInput(input, { mergerPath: '/m', integrationBranch: 'i', iteration: 1 }).feedback).toBeUndefined();
  });

  it.each([
    { resetAt: '2026-01-01T00:00:00Z', waitMs: 61_500, summary: 'limited; waiting 62 s until 2026-01-01T00:00:00Z', feed: 'provider_rate_limit -> wait until 2026-01-01T00:00:00Z (2/5)' },
    { resetAt: undefined, waitMs: 30_000, summary: 'limited; waiting 30 s until the default back-off', feed: 'provider_rate_limit -> wait until 30 s from now (2/5)' },
  ])('a planner rate-limit wait until $resetAt', ({ resetAt, waitMs, summary, feed }) => {
    const wait = rateLimitWait('plan', { n: 2, resetAt, waitMs, summary: 'limited' }, { maxWaits: 5, at: 'T' });
    expect(wait.entry).toEqual({ at: 'T', step: 'plan', kind: 'provider_rate_limit', action: expect.any(String), attempt: 2, maxAttempts: 5, summary, result: 'waiting' });
    expect(wait.feed).toBe(feed);
  });

  it('the details show the phase, each stream and the usage', () => {
    const usage = { inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: 0, runs: 0 };
    const text = objectiveDetails({ phase: 'running', outcome: 'blocked', usage, streams: [{ id: 'a', phase: 'blocked', iterations: 1, blocked: { mailbox: 'builder-a', since: 'T', step: 's', kind: 'unknown', summary: 'S' } }, { id: 'b', phase: 'failed', iterations: 1, failure: { kind: 'unknown', summary: 'broke' } }] });
    expect(text.split('\n').slice(0, 4)).toEqual(['**running** (blocked)', '', '- a: blocked (mailbox builder-a)', '- b: failed (broke)']);
  });
});
