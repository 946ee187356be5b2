/**
 * The stream blueprint interpreter (workflows/stream-interpreter.ts), without Temporal: each case
 * scripts what the shell would report (step outcomes, waits, resets, guidance) and checks the
 * decisions, in order, and how the stream ends.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { BlueprintSchema, type Blueprint, type BlueprintInput } from '../core/blueprint-schema';
import type { AgentSpec, Guidance } from '../core/types';
import {
  agentStepOutcome,
  continueAsNewBefore,
  CONTINUE_AS_NEW_AFTER_EVENTS,
  decide,
  gateStepOutcome,
  initialState,
  MAX_RATE_LIMIT_WAITS,
  rateLimitWaitMs,
  mergeStepOutcome,
  type StepFailure,
  type StepOutcome,
  type StreamDecision,
  type StreamEnding,
  type StreamInterpreterConfig,
  type StreamInterpreterEvent,
  type StreamInterpreterState,
} from '../workflows/stream-interpreter';

const BUILD_REVIEW = BlueprintSchema.parse(parse(readFileSync(path.join(__dirname, '..', 'blueprints', 'build-review.yaml'), 'utf8')));
const agent = { provider: 'script' } as AgentSpec;

function config(over: Partial<StreamInterpreterConfig> = {}): StreamInterpreterConfig {
  return {
    streamId: 's1',
    task: 'add greet',
    blueprint: BUILD_REVIEW,
    agents: { builder: agent },
    gates: [{ name: 'test' }],
    integrationBranch: 'slipway/o/integration',
    ...over,
  };
}

const blueprint = (bp: Partial<BlueprintInput> & Pick<BlueprintInput, 'steps'>): Blueprint => BlueprintSchema.parse({ id: 'custom', level: 'stream', ...bp });

// --- a scripted shell -------------------------------------------------------------------------------

/** What the shell reports when the interpreter waits: a step's outcome, a wait's end, a reset, guidance. */
type Reply = StepOutcome | { waited: true } | { reset: string } | { guidance: Guidance } | { budget: 'raised' | Guidance };

const ok: StepOutcome = { ok: true };
const fail = (kind: StepFailure['kind'], summary: string = kind, extra: Partial<StepFailure> = {}): StepOutcome => ({ ok: false, failure: { kind, summary, details: `${summary} details`, ...extra } });
const merged = (commit = 'abcdef0123456789'): StepOutcome => ({ ok: true, merged: commit, done: true });
const noChanges = (summary = 'nothing over integration'): StepOutcome => ({ ok: true, unchanged: summary, done: true });
const guidance = (subject = 'try X'): Reply => ({ guidance: { agent: 'builder-s1', subject, body: 'do X' } });
const NOW = Date.parse('2025-01-01T00:00:00Z');

/** One line per decision, short enough to read a whole run in a table. */
function line(d: StreamDecision): string {
  switch (d.type) {
    case 'enter_step':
      return `enter ${d.step}#${d.iteration}`;
    case 'run_step':
      return `run ${d.step.id}${d.feedback ? ` (${d.feedback.kind}${d.feedback.guidance ? ' +guidance' : ''})` : ''}${d.budgetWaived ? ' past budget' : ''}`;
    case 'record':
      return `ledger ${d.entry.step} ${d.entry.kind} ${d.entry.result} ${d.entry.attempt}/${d.entry.maxAttempts}`;
    case 'wait_for_rate_limit':
      return `wait ${d.waitMs}`;
    case 'reset_onto_integration':
      return 'reset';
    case 'block_for_guidance':
      return `block ${d.step} @${d.mailbox}`;
    case 'finish':
      return `finish ${d.result.status}`;
  }
}

interface Run {
  trace: string[];
  decisions: StreamDecision[];
  ending?: StreamEnding;
  text?: string;
  state: StreamInterpreterState;
}

/** Drives the interpreter with the replies in order; stops at the end or when the replies run out. */
function drive(cfg: StreamInterpreterConfig, replies: Reply[]): Run {
  let state = initialState();
  let event: StreamInterpreterEvent = { type: 'start' };
  const decisions: StreamDecision[] = [];
  const queue = [...replies];
  for (;;) {
    const decided = decide(cfg, state, event);
    state = decided.state;
    decisions.push(...decided.decisions);
    const last = decided.decisions.at(-1);
    if (!last) throw new Error('no decision');
    if (last.type === 'finish') return { trace: decisions.map(line), decisions, ending: last.result, text: last.text, state };
    const reply = queue.shift();
    if (!reply) return { trace: decisions.map(line), decisions, state };
    if (last.type === 'run_step') {
      expect('ok' in reply, `reply for run_step ${last.step.id}`).toBe(true);
      event = { type: 'step_finished', outcome: reply as StepOutcome, now: NOW };
    } else if (last.type === 'wait_for_rate_limit') {
      expect(reply).toEqual({ waited: true });
      event = { type: 'rate_limit_waited' };
    } else if (last.type === 'reset_onto_integration') {
      expect('reset' in reply).toBe(true);
      event = { type: 'reset_onto_integration_done', previousDiff: (reply as { reset: string }).reset };
    } else if (last.type === 'block_for_guidance' && state.awaiting.type === 'budget_available') {
      expect('budget' in reply, 'a budget block ends with a raise or guidance').toBe(true);
      const budget = (reply as { budget: 'raised' | Guidance }).budget;
      event = budget === 'raised' ? { type: 'budget_available' } : { type: 'budget_available', guidance: budget };
    } else if (last.type === 'block_for_guidance') {
      expect('guidance' in reply).toBe(true);
      event = { type: 'guidance_received', guidance: (reply as { guidance: Guidance }).guidance };
    } else throw new Error(`unexpected last decision ${last.type}`);
  }
}

// --- cases ---------------------------------------------------------------------------------------------

interface Case {
  name: string;
  cfg?: Partial<StreamInterpreterConfig>;
  replies: Reply[];
  trace: string[];
  ending?: Partial<StreamEnding>;
}

const cases: Case[] = [
  {
    name: 'happy path: build, gates, (no reviewer: skipped), merge -> merged',
    replies: [ok, ok, merged()],
    trace: ['enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready', 'finish merged'],
    ending: { status: 'merged', mergeCommit: 'abcdef0123456789' },
  },
  {
    name: 'with a reviewer and no gates: the gates step passes at once',
    cfg: { agents: { builder: agent, reviewer: agent }, gates: [] },
    replies: [ok, ok, merged()],
    trace: ['enter build#1', 'run build', 'enter gates#1', 'enter review#1', 'run review', 'enter merge_ready#1', 'run merge_ready', 'finish merged'],
    ending: { status: 'merged' },
  },
  {
    name: 'fix loop: a gate failure goes back to the builder with the failure, then is recorded recovered',
    replies: [ok, fail('quality_gate_failure'), ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates',
      'ledger gates quality_gate_failure retrying 1/3', 'enter build#2', 'run build (quality_gate_failure)', 'enter gates#2', 'run gates',
      'ledger gates quality_gate_failure recovered 1/3', 'enter review#2', 'enter merge_ready#2', 'run merge_ready', 'finish merged',
    ],
    ending: { status: 'merged' },
  },
  {
    name: 'fix loop bounded by max_fix_iterations, then ask_human blocks at the failing step',
    cfg: { maxFixIterations: 1 },
    replies: [ok, fail('quality_gate_failure'), ok, fail('quality_gate_failure')],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates',
      'ledger gates quality_gate_failure retrying 1/1', 'enter build#2', 'run build (quality_gate_failure)', 'enter gates#2', 'run gates',
      'ledger gates quality_gate_failure blocked 1/1', 'block gates @builder-s1',
    ],
  },
  {
    name: 'review rejection exhausts its loop (reviewer acts through the builder) -> escalate',
    cfg: { agents: { builder: agent, reviewer: agent }, maxFixIterations: 1, onExhausted: 'escalate' },
    replies: [ok, ok, fail('review_rejection'), ok, ok, fail('review_rejection')],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'run review',
      'ledger review review_rejection retrying 1/1', 'enter build#2', 'run build (review_rejection)', 'enter gates#2', 'run gates', 'enter review#2', 'run review (review_rejection)',
      'ledger review review_rejection escalated 1/1', 'finish escalated',
    ],
    ending: { status: 'escalated', failure: { kind: 'review_rejection', summary: 'fix loop exhausted after 2 iterations: review_rejection' } },
  },
  {
    name: 'max_fix_iterations 0 and fail: the first gate failure fails the stream',
    cfg: { maxFixIterations: 0, onExhausted: 'fail' },
    replies: [ok, fail('quality_gate_failure', 'gate "test" exited with 1')],
    trace: ['enter build#1', 'run build', 'enter gates#1', 'run gates', 'ledger gates quality_gate_failure failed 0/0', 'finish failed'],
    ending: { status: 'failed', failure: { kind: 'quality_gate_failure', summary: 'fix loop exhausted after 1 iterations: gate "test" exited with 1' } },
  },
  {
    name: 'retry budget exhausted (agent crash after Temporal retries) -> fail, attempts from the retry profile',
    cfg: { onExhausted: 'fail' },
    replies: [fail('agent_runtime_transient', 'exit 1')],
    trace: ['enter build#1', 'run build', 'ledger build agent_runtime_transient failed 6/6', 'finish failed'],
    ending: { status: 'failed', failure: { kind: 'agent_runtime_transient', summary: 'the agent crashed, hung or exited abnormally: exit 1' } },
  },
  {
    name: 'retry budget exhausted -> escalate',
    cfg: { onExhausted: 'escalate' },
    replies: [fail('sandbox_failure', 'disk full')],
    trace: ['enter build#1', 'run build', 'ledger build sandbox_failure escalated 6/6', 'finish escalated'],
    ending: { status: 'escalated' },
  },
  {
    name: 'retry budget exhausted -> ask_human; guidance resumes at the blocked step with a fresh budget',
    replies: [fail('agent_runtime_transient'), guidance(), ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'ledger build agent_runtime_transient blocked 6/6', 'block build @builder-s1',
      'ledger build agent_runtime_transient guidance_applied 1/1', 'enter build#2', 'run build (agent_runtime_transient +guidance)',
      'ledger build agent_runtime_transient recovered 0/3', 'enter gates#2', 'run gates', 'enter review#2', 'enter merge_ready#2', 'run merge_ready', 'finish merged',
    ],
    ending: { status: 'merged' },
  },
  {
    name: 'exhausted fix loop -> ask_human; guidance resumes at the on_fail target (the builder)',
    cfg: { maxFixIterations: 0 },
    replies: [ok, fail('quality_gate_failure'), guidance(), ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'ledger gates quality_gate_failure blocked 0/0', 'block gates @builder-s1',
      'ledger gates quality_gate_failure guidance_applied 1/1', 'enter build#2', 'run build (quality_gate_failure +guidance)', 'enter gates#2', 'run gates',
      'ledger gates quality_gate_failure recovered 0/0', 'enter review#2', 'enter merge_ready#2', 'run merge_ready', 'finish merged',
    ],
  },
  {
    name: 'merge_conflict: reset onto integration, rebuild from the builder with the old diff',
    replies: [ok, ok, fail('merge_conflict', 'conflict in a.js'), { reset: 'OLD DIFF' }, ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready',
      'reset', 'ledger merge_ready merge_conflict retrying 1/2', 'enter build#2', 'run build (merge_conflict)', 'enter gates#2', 'run gates', 'enter review#2',
      'enter merge_ready#2', 'run merge_ready', 'ledger merge_ready merge_conflict recovered 1/2', 'finish merged',
    ],
    ending: { status: 'merged' },
  },
  {
    name: 'post_merge_gate_failure: restart the stream at its start step, no reset',
    replies: [ok, ok, fail('post_merge_gate_failure'), ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready',
      'ledger merge_ready post_merge_gate_failure retrying 1/2', 'enter build#2', 'run build (post_merge_gate_failure)', 'enter gates#2', 'run gates', 'enter review#2',
      'enter merge_ready#2', 'run merge_ready', 'ledger merge_ready post_merge_gate_failure recovered 1/2', 'finish merged',
    ],
  },
  {
    name: 'merge trouble bounded by the merge step (2), then the exhaustion mode (fail)',
    cfg: { onExhausted: 'fail' },
    replies: [ok, ok, fail('post_merge_gate_failure'), ok, ok, fail('post_merge_gate_failure'), ok, ok, fail('post_merge_gate_failure')],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready',
      'ledger merge_ready post_merge_gate_failure retrying 1/2', 'enter build#2', 'run build (post_merge_gate_failure)', 'enter gates#2', 'run gates', 'enter review#2', 'enter merge_ready#2', 'run merge_ready',
      'ledger merge_ready post_merge_gate_failure retrying 2/2', 'enter build#3', 'run build (post_merge_gate_failure)', 'enter gates#3', 'run gates', 'enter review#3', 'enter merge_ready#3', 'run merge_ready',
      'ledger merge_ready post_merge_gate_failure failed 2/2', 'finish failed',
    ],
    ending: { status: 'failed', failure: { kind: 'post_merge_gate_failure', summary: 'a gate failed after the merge: post_merge_gate_failure' } },
  },
  {
    name: 'merge conflict exhausted -> ask_human; guidance rebuilds from the builder',
    cfg: { blueprint: blueprint({ ...BUILD_REVIEW, steps: BUILD_REVIEW.steps.map((s) => (s.id === 'merge_ready' ? { ...s, max_fix_iterations: 0 } : s)) }) },
    replies: [ok, ok, fail('merge_conflict'), guidance(), ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready',
      'ledger merge_ready merge_conflict blocked 0/0', 'block merge_ready @builder-s1', 'ledger merge_ready merge_conflict guidance_applied 1/1',
      'enter build#2', 'run build (merge_conflict +guidance)', 'enter gates#2', 'run gates', 'enter review#2', 'enter merge_ready#2', 'run merge_ready',
      'ledger merge_ready merge_conflict recovered 0/0', 'finish merged',
    ],
  },
  {
    name: 'rate-limit waits do not count as builder iterations and spend no fix attempt',
    replies: [fail('provider_rate_limit', '429', { resetAt: new Date(NOW + 30_000).toISOString() }), { waited: true }, fail('provider_rate_limit', '429'), { waited: true }, ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'ledger build provider_rate_limit waiting 1/10', 'wait 30000', 'enter build#1', 'run build',
      'ledger build provider_rate_limit waiting 2/10', 'wait 60000', 'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready', 'finish merged',
    ],
    ending: { status: 'merged' },
  },
  {
    name: 'a reset time in the past waits at least a second',
    replies: [fail('provider_rate_limit', '429', { resetAt: new Date(NOW - 60_000).toISOString() })],
    trace: ['enter build#1', 'run build', 'ledger build provider_rate_limit waiting 1/10', 'wait 1000'],
  },
  {
    name: 'no_changes from the merge queue ends the stream as no_changes',
    replies: [ok, ok, noChanges('the branch brings nothing over integration')],
    trace: ['enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready', 'finish no_changes'],
    ending: { status: 'no_changes', failure: { kind: 'unknown', summary: 'the branch brings nothing over integration' } },
  },
  {
    name: 'a blueprint that ends without merging fails as configuration_error',
    cfg: { blueprint: blueprint({ steps: [{ id: 'build', type: 'agent', role: 'builder', next: 'gates' }, { id: 'gates', type: 'deterministic', action: 'run_quality_gates' }] }) },
    replies: [ok, ok],
    trace: ['enter build#1', 'run build', 'enter gates#1', 'run gates', 'finish failed'],
    ending: { status: 'failed', failure: { kind: 'configuration_error', summary: 'blueprint custom ended without merging' } },
  },
  {
    name: 'mark_complete ends the blueprint (without a merge: failed)',
    cfg: { blueprint: blueprint({ steps: [{ id: 'build', type: 'agent', role: 'builder', next: 'done' }, { id: 'done', type: 'deterministic', action: 'mark_complete', next: 'build' }] }) },
    replies: [ok],
    trace: ['enter build#1', 'run build', 'enter done#1', 'finish failed'],
  },
  {
    name: 'a human step blocks for approval and goes on with the next step',
    cfg: { blueprint: blueprint({ steps: [{ id: 'ask', type: 'human', prompt: 'go?', next: 'build' }, { id: 'build', type: 'agent', role: 'builder', next: 'merge' }, { id: 'merge', type: 'deterministic', action: 'signal_merge_ready' }] }) },
    replies: [guidance('yes'), ok, merged()],
    trace: ['enter ask#0', 'block ask @builder-s1', 'enter build#1', 'run build', 'enter merge#1', 'run merge', 'finish merged'],
  },
  {
    name: 'a required agent that is not configured is a configuration_error (exhaustion mode decides)',
    cfg: { agents: {}, onExhausted: 'fail' },
    replies: [],
    trace: ['enter build#0', 'ledger build configuration_error failed 6/6', 'finish failed'],
    ending: { status: 'failed', failure: { kind: 'configuration_error', summary: 'the configuration is invalid: step "build" needs a builder agent; none is configured' } },
  },
  {
    name: 'an objective-level action in a stream is a configuration_error',
    cfg: { onExhausted: 'escalate', blueprint: blueprint({ steps: [{ id: 'q', type: 'deterministic', action: 'merge_queue' }] }) },
    replies: [],
    trace: ['enter q#0', 'ledger q configuration_error escalated 4/4', 'finish escalated'],
  },
  {
    name: 'a broken on_fail target fails the stream after the decisions taken so far',
    cfg: { blueprint: blueprint({ steps: [{ id: 'build', type: 'agent', role: 'builder', next: 'gates' }, { id: 'gates', type: 'deterministic', action: 'run_quality_gates', on_fail: 'nowhere' }] }) },
    replies: [ok, fail('quality_gate_failure')],
    trace: ['enter build#1', 'run build', 'enter gates#1', 'run gates', 'finish failed'],
    ending: { status: 'failed', failure: { kind: 'unknown', summary: 'blueprint custom has no step "nowhere"' } },
  },
  {
    name: 'a spent budget blocks before the run (mailbox of the builder); a raise runs the same iteration again',
    cfg: { budgetOnExhausted: 'block' },
    replies: [fail('budget_exhausted', 'stream s1 spent $1.00 of its $1.00 budget'), { budget: 'raised' }, ok, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'ledger build budget_exhausted blocked 1/1', 'block build @builder-s1',
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'enter merge_ready#1', 'run merge_ready', 'finish merged',
    ],
    ending: { status: 'merged' },
  },
  {
    name: 'a budget given only by a raise (no on_exhausted in the input) blocks too',
    replies: [fail('budget_exhausted', 'objective o spent $5.00 of its $5.00 budget')],
    trace: ['enter build#1', 'run build', 'ledger build budget_exhausted blocked 1/1', 'block build @builder-s1'],
  },
  {
    name: 'budget on_exhausted: fail ends the stream as failed with budget_exhausted, no retry',
    cfg: { budgetOnExhausted: 'fail', onExhausted: 'ask_human' },
    replies: [fail('budget_exhausted', 'stream s1 spent 1,200 of its 1,000 tokens budget')],
    trace: ['enter build#1', 'run build', 'ledger build budget_exhausted failed 1/1', 'finish failed'],
    ending: { status: 'failed', failure: { kind: 'budget_exhausted', summary: 'stream s1 spent 1,200 of its 1,000 tokens budget' } },
  },
  {
    name: 'guidance on a budget block lets that step go on past the budget; the next agent step is held to it again',
    cfg: { budgetOnExhausted: 'block', agents: { builder: agent, reviewer: agent } },
    replies: [ok, ok, fail('budget_exhausted', 'spent'), { budget: { agent: 'reviewer-s1', subject: 'finish the review', body: 'go on' } }, ok, merged()],
    trace: [
      'enter build#1', 'run build', 'enter gates#1', 'run gates', 'enter review#1', 'run review', 'ledger review budget_exhausted blocked 1/1', 'block review @reviewer-s1',
      'ledger review budget_exhausted guidance_applied 1/1', 'enter review#1', 'run review (budget_exhausted +guidance) past budget', 'enter merge_ready#1', 'run merge_ready', 'finish merged',
    ],
  },
  {
    name: 'the waiver ends with its step: a fix-loop rebuild is held to the budget again',
    cfg: { budgetOnExhausted: 'block', agents: { builder: agent, reviewer: agent } },
    replies: [fail('budget_exhausted', 'spent'), { budget: { agent: 'builder-s1', subject: 'go', body: 'go on' } }, ok, ok, fail('review_rejection', 'no'), ok],
    trace: [
      'enter build#1', 'run build', 'ledger build budget_exhausted blocked 1/1', 'block build @builder-s1',
      'ledger build budget_exhausted guidance_applied 1/1', 'enter build#1', 'run build (budget_exhausted +guidance) past budget',
      'enter gates#1', 'run gates', 'enter review#1', 'run review (budget_exhausted +guidance)', 'ledger review review_rejection retrying 1/3', 'enter build#2', 'run build (review_rejection +guidance)',
      'enter gates#2', 'run gates',
    ],
  },
];

describe('stream interpreter', () => {
  it.each(cases)('$name', (c) => {
    const run = drive(config(c.cfg), c.replies);
    expect(run.trace).toEqual(c.trace);
    if (c.ending) expect(run.ending).toMatchObject(c.ending);
  });

  it('rate limits beyond MAX_RATE_LIMIT_WAITS count as a failure of the step', () => {
    const limited = fail('provider_rate_limit', '429');
    const replies: Reply[] = [];
    for (let i = 0; i < MAX_RATE_LIMIT_WAITS; i++) replies.push(limited, { waited: true });
    replies.push(limited);
    const run = drive(config({ onExhausted: 'fail' }), replies);
    expect(run.trace.filter((l) => l.startsWith('wait'))).toHaveLength(MAX_RATE_LIMIT_WAITS);
    expect(run.trace.slice(-2)).toEqual(['ledger build provider_rate_limit failed 6/6', 'finish failed']);
    expect(run.state.iteration).toBe(1);
  });

  it('feedback carries the failure details, the previous diff after a conflict, and guidance', () => {
    const run = drive(config({ maxFixIterations: 0 }), [ok, ok, fail('merge_conflict', 'conflict in a.js'), { reset: 'OLD DIFF' }, ok, fail('quality_gate_failure', 'gate failed'), guidance('use Y')]);
    const builds = run.decisions.filter((d): d is Extract<StreamDecision, { type: 'run_step' }> => d.type === 'run_step' && d.step.id === 'build');
    expect(builds[0].feedback).toBeUndefined();
    expect(builds[1].feedback).toEqual({
      kind: 'merge_conflict',
      summary: 'conflict in a.js',
      details: 'conflict in a.js details\n\nYour previous change (now to be re-applied on top of slipway/o/integration):\nOLD DIFF',
    });
    expect(builds[2].feedback).toEqual({ kind: 'quality_gate_failure', summary: 'gate failed', details: 'gate failed details', guidance: 'use Y\ndo X' });
  });

  it('after a conflict rebuild, every later review (not the builder) sees the conflict and the earlier change', () => {
    const cfg = config({ agents: { builder: agent, reviewer: agent } });
    const reviewRejected = fail('review_rejection', 'overwrote the other change');
    const run = drive(cfg, [ok, ok, ok, fail('merge_conflict', 'conflict in a.js'), { reset: 'OLD DIFF' }, ok, ok, reviewRejected, ok, ok, ok, merged()]);
    const runs = run.decisions.filter((d): d is Extract<StreamDecision, { type: 'run_step' }> => d.type === 'run_step');
    const reviews = runs.filter((d) => d.step.id === 'review');
    expect(reviews).toHaveLength(3);
    expect(reviews[0].rebuilt).toBeUndefined();
    // Kept after a later failure of another kind (the review's own rejection) replaced the feedback.
    for (const review of reviews.slice(1)) expect(review.rebuilt).toBe('conflict in a.js details\n\nYour previous change (now to be re-applied on top of slipway/o/integration):\nOLD DIFF');
    expect(runs.filter((d) => d.step.id !== 'review').every((d) => d.rebuilt === undefined)).toBe(true);
    expect(run.ending?.status).toBe('merged');
  });

  it('ledger entries carry the action of the failure kind and readable feed texts', () => {
    const run = drive(config(), [ok, fail('quality_gate_failure', 'gate "test" exited with 1')]);
    const rec = run.decisions.find((d) => d.type === 'record');
    expect(rec).toEqual({
      type: 'record',
      entry: { step: 'gates', kind: 'quality_gate_failure', action: 'rerun_builder_with_gate_output', attempt: 1, maxAttempts: 3, summary: 'gate "test" exited with 1', result: 'retrying' },
      text: 'quality_gate_failure -> rerun builder (1/3)',
    });
  });

  it('refuses an event it does not wait for, and leaves the given state untouched', () => {
    const start = initialState();
    const first = decide(config(), start, { type: 'start' });
    expect(start).toEqual(initialState());
    expect(() => decide(config(), first.state, { type: 'rate_limit_waited' })).toThrow(/waits for step_finished/);
    const before = JSON.stringify(first.state);
    decide(config(), first.state, { type: 'step_finished', outcome: fail('agent_runtime_transient'), now: NOW });
    expect(JSON.stringify(first.state)).toBe(before);
  });
});

describe('step outcomes', () => {
  const builder = BUILD_REVIEW.steps[0] as Extract<Blueprint['steps'][number], { type: 'agent' }>;
  const reviewer = BUILD_REVIEW.steps[2] as Extract<Blueprint['steps'][number], { type: 'agent' }>;
  it.each([
    { name: 'agent loop failed', got: agentStepOutcome(builder, { ok: false, summary: 'no answer' }), want: fail('agent_runtime_transient', 'no answer', { details: 'no answer' }) },
    { name: 'builder done', got: agentStepOutcome(builder, { ok: true, last: {} }), want: ok },
    { name: 'reviewer approves', got: agentStepOutcome(reviewer, { ok: true, last: { verdict: { verdict: 'approve', findings: [] } } }), want: ok },
    {
      name: 'reviewer rejects',
      got: agentStepOutcome(reviewer, { ok: true, last: { verdict: { verdict: 'reject', summary: 'no tests', findings: ['a', 'b'] } } }),
      want: fail('review_rejection', 'no tests', { details: '- a\n- b' }),
    },
    { name: 'reviewer without verdict', got: agentStepOutcome(reviewer, { ok: true, last: {} }), want: fail('review_rejection', 'the reviewer rejected the change', { details: '' }) },
    { name: 'gates pass', got: gateStepOutcome({ passed: true, results: [], failureReport: '' }), want: ok },
    {
      name: 'gate exits non-zero',
      got: gateStepOutcome({ passed: false, results: [{ name: 'lint', passed: true, timedOut: false, exitCode: 0 }, { name: 'test', passed: false, timedOut: false, exitCode: 1 }], failureReport: 'R' }),
      want: fail('quality_gate_failure', 'gate "test" exited with 1', { details: 'R' }),
    },
    { name: 'gate times out', got: gateStepOutcome({ passed: false, results: [{ name: 'test', passed: false, timedOut: true, exitCode: null }], failureReport: 'R' }), want: fail('quality_gate_failure', 'gate "test" timed out', { details: 'R' }) },
    { name: 'merged', got: mergeStepOutcome({ status: 'merged', commit: 'c1' }), want: { ok: true, merged: 'c1', done: true } },
    { name: 'no changes', got: mergeStepOutcome({ status: 'no_changes', summary: 'n' }), want: { ok: true, unchanged: 'n', done: true } },
    { name: 'rejected', got: mergeStepOutcome({ status: 'rejected', kind: 'merge_conflict', summary: 's', details: 'd' }), want: fail('merge_conflict', 's', { details: 'd' }) },
  ])('$name', ({ got, want }) => {
    expect(got).toEqual(want);
  });
});

describe('rate-limit waits (shared with the planner)', () => {
  it.each([
    { resetAt: undefined, want: 60_000 },
    { resetAt: new Date(NOW + 42_000).toISOString(), want: 42_000 },
    { resetAt: new Date(NOW + 200).toISOString(), want: 1_000 },
    { resetAt: new Date(NOW - 5_000).toISOString(), want: 1_000 },
    // Agent output is untrusted: a far-away reset is capped, garbage gets the default (it gave NaN).
    { resetAt: new Date(NOW + 30 * 24 * 3600_000).toISOString(), want: 6 * 3600_000 },
    { resetAt: '9999-12-31T23:59:59Z', want: 6 * 3600_000 },
    { resetAt: 'soon', want: 60_000 },
  ])('reset at $resetAt -> $want ms', ({ resetAt, want }) => {
    expect(rateLimitWaitMs(resetAt, NOW)).toBe(want);
  });
});

describe('purity', () => {
  it('imports only types, core tables and the blueprint walker (no Temporal, no activities)', () => {
    const source = readFileSync(path.join(__dirname, '..', 'workflows', 'stream-interpreter.ts'), 'utf8');
    const imports = [...source.matchAll(/^import (type )?.*? from '([^']+)';$/gms)].map((m) => ({ typeOnly: Boolean(m[1]), from: m[2] }));
    expect(imports.length).toBeGreaterThan(0);
    for (const i of imports) {
      const allowed = i.from.startsWith('../core/') || i.from === './blueprint-walker' || (i.typeOnly && i.from === '../core/blueprint-schema');
      expect(allowed, `import from ${i.from}`).toBe(true);
    }
    expect(source).not.toMatch(/Date\.now\(\)|new Date\(|Math\.random/);
  });
});

describe('continue-as-new points (bounded stream history)', () => {
  const gateFailure = fail('quality_gate_failure', 'gate "test" exited with 1');
  const rec = (result: 'retrying' | 'recovered' | 'guidance_applied' | 'waiting' | 'blocked'): StreamDecision => ({
    type: 'record',
    entry: { step: 'gates', kind: 'quality_gate_failure', action: 'fix_loop', attempt: 1, maxAttempts: 3, summary: 's', result },
    text: 't',
  });
  const enterBuild: StreamDecision = { type: 'enter_step', step: 'build', iteration: 2, phase: 'building', details: 'd' };
  const fresh = { stepsRun: 1, historyLength: 100, suggested: false };
  it.each([
    { name: 'a fix loop starts', decisions: [rec('retrying'), enterBuild], run: fresh, want: true },
    { name: 'guidance applied', decisions: [rec('guidance_applied'), enterBuild], run: fresh, want: true },
    { name: 'a step passed after recovery (same iteration)', decisions: [rec('recovered'), enterBuild], run: fresh, want: false },
    { name: 'a rate-limit wait', decisions: [rec('waiting'), { type: 'wait_for_rate_limit', waitMs: 1000 } as StreamDecision], run: fresh, want: false },
    { name: 'nothing run yet in this run', decisions: [rec('retrying'), enterBuild], run: { ...fresh, stepsRun: 0 }, want: false },
    { name: 'the history reached the bound', decisions: [enterBuild], run: { ...fresh, historyLength: CONTINUE_AS_NEW_AFTER_EVENTS }, want: true },
    { name: 'just below the bound', decisions: [enterBuild], run: { ...fresh, historyLength: CONTINUE_AS_NEW_AFTER_EVENTS - 1 }, want: false },
    { name: 'Temporal suggests it', decisions: [enterBuild], run: { ...fresh, suggested: true }, want: true },
    { name: 'the stream ends: nothing to carry', decisions: [rec('blocked'), { type: 'finish', result: { status: 'failed' }, text: 'x' } as StreamDecision], run: { ...fresh, suggested: true }, want: false },
  ])('$name -> $want', ({ decisions, run, want }) => {
    expect(continueAsNewBefore(decisions, run)).toBe(want);
  });

  it('carrying the state and pending decisions through JSON at every such point changes nothing, one run per fix iteration', () => {
    const cfg = config({ agents: { builder: agent, reviewer: agent }, maxFixIterations: 4 });
    // Gates fail four times, pass on the fifth build; the reviewer then approves and the merge lands.
    const replies: Reply[] = [ok, gateFailure, ok, gateFailure, ok, gateFailure, ok, gateFailure, ok, ok, ok, merged()];
    const whole = drive(cfg, replies);

    // The same replies, but a new "run" whenever the shell would continue as new: state and
    // decisions go through JSON, as through Temporal's payload converter.
    let state = initialState();
    let event: StreamInterpreterEvent = { type: 'start' };
    let carried: StreamDecision[] | undefined;
    const trace: string[] = [];
    const queue = [...replies];
    let runs = 1;
    let stepsRun = 0;
    for (;;) {
      let decisions: StreamDecision[];
      if (carried) {
        decisions = carried;
        carried = undefined;
      } else {
        const decided = decide(cfg, state, event);
        state = decided.state;
        decisions = decided.decisions;
        if (continueAsNewBefore(decisions, { stepsRun, historyLength: 0, suggested: false })) {
          ({ state, decisions: carried } = JSON.parse(JSON.stringify({ state, decisions })) as { state: StreamInterpreterState; decisions: StreamDecision[] });
          runs += 1;
          stepsRun = 0;
          continue;
        }
      }
      trace.push(...decisions.map(line));
      const last = decisions.at(-1)!;
      if (last.type === 'finish') break;
      expect(last.type).toBe('run_step');
      stepsRun += 1;
      event = { type: 'step_finished', outcome: queue.shift() as StepOutcome, now: NOW };
    }
    expect(trace).toEqual(whole.trace);
    expect(whole.ending).toMatchObject({ status: 'merged' });
    expect(runs).toBe(5); // the first run and one per fix iteration
  });
});
