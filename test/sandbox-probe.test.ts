/** The stream sandbox probe's decisions (core/sandbox-probe.ts): pure, table-tested. */
import { describe, expect, it } from 'vitest';
import { MAX_SANDBOX_REPLACEMENTS } from '../core/routing';
import { afterProbe, deathMessage, sandboxAction, type ProbeOutcome } from '../core/sandbox-probe';

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
