/** The stream sandbox probe's decisions (core/sandbox-probe.ts): pure, table-tested. */
import { describe, expect, it } from 'vitest';
import { MAX_SANDBOX_REPLACEMENTS } from '../core/routing';
import { IDLE_PROBE_MAX_MS, afterProbe, deathMessage, idleProbeDelayMs, sandboxAction, type ProbeOutcome } from '../core/sandbox-probe';

describe('afterProbe: what the sandbox workflow does with a probe', () => {
  const cases: Array<[string, ProbeOutcome, ReturnType<typeof afterProbe>]> = [
    ['alive: keep watching', { alive: true }, { action: 'keep_watching' }],
    ['deleted: end with the reason', { alive: false, reason: 'sandbox_deleted', detail: 'Daytona sandbox d1 was deleted' }, { action: 'end', error: 'sandbox_deleted: Daytona sandbox d1 was deleted' }],
    ['stopped outside Slipway: end', { alive: false, reason: 'sandbox_stopped', detail: 'stopped by hand' }, { action: 'end', error: 'sandbox_stopped: stopped by hand' }],
    ['archived: end', { alive: false, reason: 'sandbox_archived', detail: 'archived' }, { action: 'end', error: 'sandbox_archived: archived' }],
    ['worktree removed (local): end', { alive: false, reason: 'directory_removed', detail: '/x is gone' }, { action: 'end', error: 'directory_removed: /x is gone' }],
    ['the probe could not ask (outage, rate limit): keep watching', { failed: 'Daytona: 503' }, { action: 'keep_watching' }],
  ];
  for (const [name, outcome, expected] of cases) it(name, () => expect(afterProbe(outcome)).toEqual(expected));
});

describe('sandboxAction: what a stream does about its sandbox around a step', () => {
  const cases: Array<[string, Parameters<typeof sandboxAction>[0], ReturnType<typeof sandboxAction>['action'], string?]> = [
    ['nothing wrong: keep', { replacementsSoFar: 0 }, 'keep'],
    ['died: recreate from the branch', { died: 'sandbox_deleted: gone', replacementsSoFar: 0 }, 'recreate', 'died'],
    ['owner gone: recreate elsewhere', { ownerGone: 'w1', replacementsSoFar: 1 }, 'recreate', 'owner_gone'],
    ['both: the death is the reason', { ownerGone: 'w1', died: 'sandbox_stopped: x', replacementsSoFar: 0 }, 'recreate', 'died'],
    ['died past the bound: give up (recovery takes the failure)', { died: 'sandbox_deleted: gone', replacementsSoFar: MAX_SANDBOX_REPLACEMENTS }, 'give_up'],
    ['owner gone past the bound: give up', { ownerGone: 'w1', replacementsSoFar: MAX_SANDBOX_REPLACEMENTS }, 'give_up'],
  ];
  for (const [name, input, action, why] of cases) {
    it(name, () => {
      const next = sandboxAction(input);
      expect(next.action).toBe(action);
      if (why) expect(next).toMatchObject({ why });
      if (action !== 'keep') expect((next as { summary: string }).summary).toContain(input.died ?? input.ownerGone!);
    });
  }
  it('a death message names the reason first', () => expect(deathMessage({ reason: 'sandbox_deleted', detail: 'd' })).toBe('sandbox_deleted: d'));
});

describe('idleProbeDelayMs: how often a stream probes its own sandbox while it waits (ADR 0032)', () => {
  const cases: Array<[string, number, number, number]> = [
    ['first probe after probe_seconds', 30_000, 0, 30_000],
    ['then twice as long', 30_000, 1, 60_000],
    ['and again', 30_000, 3, 240_000],
    ['at most an hour', 30_000, 7, IDLE_PROBE_MAX_MS],
    ['an hour for as long as the wait lasts (no overflow)', 30_000, 10_000, IDLE_PROBE_MAX_MS],
    ['a probe_seconds above the cap is kept', 2 * IDLE_PROBE_MAX_MS, 0, 2 * IDLE_PROBE_MAX_MS],
    ['and not grown past itself', 2 * IDLE_PROBE_MAX_MS, 5, 2 * IDLE_PROBE_MAX_MS],
    ['one second (tests): 1, 2, 4 s', 1_000, 2, 4_000],
  ];
  for (const [name, probeMs, probes, expected] of cases) it(name, () => expect(idleProbeDelayMs(probeMs, probes)).toBe(expected));
  it('a day of waiting costs a bounded number of probes', () => {
    let at = 0;
    let probes = 0;
    while (at < 24 * 3600_000) at += idleProbeDelayMs(30_000, probes++);
    expect(probes).toBeLessThan(32);
  });
});
