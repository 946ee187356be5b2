/**
 * The sandbox lifecycle as a transition table (core/sandbox-lifecycle.ts), without Temporal:
 * every legal row, every illegal (state, trigger) pair refused, billing per row, terminal states
 * absorbing, and the table in docs/sandbox-service.md kept equal to the module's.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ABNORMAL_END_REASONS, TERMINATE_REASONS, type EndReason, type SessionKind } from '../core/sandbox-service';
import {
  advance,
  IllegalTransitionError,
  isTerminal,
  LIFECYCLE_OWNERS,
  LIFECYCLE_TABLE,
  LIFECYCLE_TRIGGERS,
  lifecycleRow,
  renderLifecycleTable,
  resumeLifecycle,
  startLifecycle,
  terminateEvent,
  transition,
  triggersFrom,
  type Lifecycle,
  type LifecycleEvent,
  type LifecycleTrigger,
  type TriggerFrom,
} from '../core/sandbox-lifecycle';
import { SANDBOX_STATES, type SandboxState } from '../core/states';

const TRIGGERS = Object.keys(LIFECYCLE_TRIGGERS) as LifecycleTrigger[];

/** The event for a trigger, with a representative reason where it carries one. */
function eventFor(trigger: LifecycleTrigger): LifecycleEvent {
  if (trigger === 'reap') return { trigger, reason: 'account_disabled' };
  if (trigger === 'abnormal_exit') return { trigger, reason: 'directory_removed' };
  return { trigger };
}

/** Reaches `state` from a new sandbox by legal transitions only (the only way to a Lifecycle). */
function reach(state: SandboxState): Lifecycle {
  const paths: Record<SandboxState, LifecycleTrigger[]> = {
    pending: [],
    ready: ['provisioned'],
    suspending: ['provisioned', 'idle'],
    suspended: ['provisioned', 'idle', 'suspend_stored'],
    restoring: ['provisioned', 'idle', 'suspend_stored', 'wake'],
    terminating: ['provisioned', 'delete'],
    terminated: ['provisioned', 'delete', 'destroyed'],
    failed: ['provisioning_failed'],
  };
  return paths[state].reduce((life, trigger) => advance(life, eventFor(trigger)).lifecycle, startLifecycle());
}

type Billing = { close?: [SessionKind, EndReason]; open?: SessionKind };
/**
 * The proposal's lifecycle table and ADR 0004's billing rules, written out independently of the
 * module: [from, trigger, to, owner, billing (with the representative reasons of `eventFor`), end reason].
 */
const EXPECTED: Array<[SandboxState, LifecycleTrigger, SandboxState, keyof typeof LIFECYCLE_OWNERS, Billing, EndReason?]> = [
  ['pending', 'provisioned', 'ready', 'provisioner', { open: 'compute' }],
  ['pending', 'provisioning_timeout', 'failed', 'provisioner', {}, 'provisioning_timeout'],
  ['pending', 'provisioning_failed', 'failed', 'provisioner', {}, 'provisioning_failed'],
  ['pending', 'delete', 'terminating', 'api', {}, 'explicit_delete'],
  ['pending', 'reap', 'terminating', 'reaper', {}, 'account_disabled'],
  ['ready', 'delete', 'terminating', 'api', { close: ['compute', 'explicit_delete'] }, 'explicit_delete'],
  ['ready', 'reap', 'terminating', 'reaper', { close: ['compute', 'account_disabled'] }, 'account_disabled'],
  ['ready', 'deadline', 'terminating', 'timer', { close: ['compute', 'deadline'] }, 'deadline'],
  ['ready', 'absolute_cap', 'terminating', 'timer', { close: ['compute', 'absolute_cap'] }, 'absolute_cap'],
  ['ready', 'abnormal_exit', 'terminating', 'watcher', { close: ['compute', 'directory_removed'] }, 'directory_removed'],
  ['ready', 'idle', 'suspending', 'idle_detector', {}],
  ['suspending', 'suspend_stored', 'suspended', 'suspender', { close: ['compute', 'idle_offload'], open: 'snapshot_storage' }],
  ['suspending', 'suspend_failed', 'ready', 'suspender', {}],
  ['suspended', 'wake', 'restoring', 'api', {}],
  ['suspended', 'delete', 'terminating', 'api', { close: ['snapshot_storage', 'explicit_delete'] }, 'explicit_delete'],
  ['suspended', 'reap', 'terminating', 'reaper', { close: ['snapshot_storage', 'account_disabled'] }, 'account_disabled'],
  ['suspended', 'absolute_cap', 'terminating', 'timer', { close: ['snapshot_storage', 'absolute_cap'] }, 'absolute_cap'],
  ['restoring', 'restored', 'ready', 'provisioner', { close: ['snapshot_storage', 'restored'], open: 'compute' }],
  ['restoring', 'restore_failed', 'failed', 'provisioner', { close: ['snapshot_storage', 'restore_failed'] }, 'restore_failed'],
  ['terminating', 'destroyed', 'terminated', 'terminator', {}],
];

describe('the transition table', () => {
  it('has exactly the expected rows, each (from, trigger) once', () => {
    expect(LIFECYCLE_TABLE.map((r) => [r.from, r.trigger, r.to, r.owner])).toEqual(EXPECTED.map(([from, trigger, to, owner]) => [from, trigger, to, owner]));
    const keys = LIFECYCLE_TABLE.map((r) => `${r.from}/${r.trigger}`);
    expect(new Set(keys).size).toBe(keys.length);
  });

  it('lets every state but the terminal ones move, and reaches every state', () => {
    for (const state of SANDBOX_STATES) expect(triggersFrom(state).length > 0, state).toBe(!isTerminal(state));
    expect(new Set(LIFECYCLE_TABLE.map((r) => r.to))).toEqual(new Set(SANDBOX_STATES.filter((s) => s !== 'pending')));
  });

  describe.each(EXPECTED)('%s --%s--> %s (%s)', (from, trigger, to, owner, billing, ends) => {
    it('moves to the row\'s state, with its owner, billing actions and end reason', () => {
      const life = reach(from);
      const result = transition(life, eventFor(trigger));
      expect(result.ok).toBe(true);
      if (!result.ok) return;
      expect(result).toMatchObject({ from, to, trigger, owner });
      expect(result.lifecycle.state).toBe(to);
      expect(result.endReason).toBe(ends);
      // Closes the session the lifecycle has open (its seq); opens the next of its kind.
      const seqOf = (kind: SessionKind, l: Lifecycle) => (kind === 'compute' ? l.computeSeq : l.storageSeq);
      expect(result.billing.close).toEqual(billing.close ? { kind: billing.close[0], seq: seqOf(billing.close[0], life), reason: billing.close[1] } : undefined);
      expect(result.billing.open).toEqual(billing.open ? { kind: billing.open, seq: seqOf(billing.open, life) + 1 } : undefined);
      expect(seqOf('compute', result.lifecycle)).toBe(life.computeSeq + (billing.open === 'compute' ? 1 : 0));
      expect(seqOf('snapshot_storage', result.lifecycle)).toBe(life.storageSeq + (billing.open === 'snapshot_storage' ? 1 : 0));
      // The input is never changed: a lifecycle is a value.
      expect(life.state).toBe(from);
      expect(Object.isFrozen(result.lifecycle)).toBe(true);
    });
  });
});

describe('illegal transitions', () => {
  const pairs = SANDBOX_STATES.flatMap((state) => TRIGGERS.map((trigger) => [state, trigger] as const));
  const illegal = pairs.filter(([state, trigger]) => !EXPECTED.some(([f, t]) => f === state && t === trigger));

  it('are every (state, trigger) pair the table has no row for', () => {
    expect(pairs).toHaveLength(SANDBOX_STATES.length * TRIGGERS.length);
    expect(illegal).toHaveLength(pairs.length - EXPECTED.length);
  });

  it.each(illegal)('%s --%s--> is refused with a typed error, and advance throws', (state, trigger) => {
    const life = reach(state);
    const result = transition(life, eventFor(trigger));
    expect(result).toMatchObject({ ok: false, error: { code: 'illegal_transition', from: state, trigger } });
    if (!result.ok) expect(result.error.message).toContain(`${trigger} from ${state}`);
    expect(() => advance(life, eventFor(trigger))).toThrow(IllegalTransitionError);
    expect(lifecycleRow(state, trigger)).toBeUndefined();
  });

  it('include a terminate request while suspending or restoring: the workflow holds it until the state settles', () => {
    for (const state of ['suspending', 'restoring'] as const) {
      expect(transition(reach(state), { trigger: 'delete' }).ok).toBe(false);
      expect(transition(reach(state), { trigger: 'absolute_cap' }).ok).toBe(false);
    }
    // Only a ready sandbox dies unseen, and only it reaches its deadline (suspended time is not counted).
    expect(transition(reach('suspended'), { trigger: 'abnormal_exit', reason: 'directory_removed' }).ok).toBe(false);
    expect(transition(reach('suspended'), { trigger: 'deadline' }).ok).toBe(false);
  });
});

describe('terminal states', () => {
  it.each(['terminated', 'failed'] as const)('%s absorbs every trigger', (state) => {
    const life = reach(state);
    expect(isTerminal(state)).toBe(true);
    expect(triggersFrom(state)).toEqual([]);
    for (const trigger of TRIGGERS) {
      const result = transition(life, eventFor(trigger));
      expect(result.ok, `${state} --${trigger}`).toBe(false);
      if (!result.ok) expect(result.error.message).toContain(`${state} is terminal`);
    }
  });
});

describe('reasons', () => {
  it('takes a reaper\'s or watcher\'s reason onto the session it closes and the sandbox\'s end', () => {
    for (const reason of TERMINATE_REASONS.filter((r) => r !== 'explicit_delete')) {
      for (const from of ['ready', 'suspended'] as const) {
        const t = advance(reach(from), { trigger: 'reap', reason });
        expect(t.billing.close?.reason).toBe(reason);
        expect(t.endReason).toBe(reason);
      }
    }
    for (const reason of ABNORMAL_END_REASONS) {
      const t = advance(reach('ready'), { trigger: 'abnormal_exit', reason });
      expect(t.billing.close).toEqual({ kind: 'compute', seq: 1, reason });
      expect(t.endReason).toBe(reason);
    }
  });

  it('maps the terminateSandbox signal: a DELETE or the reaper', () => {
    expect(terminateEvent('explicit_delete')).toEqual({ trigger: 'delete' });
    expect(terminateEvent('deadline')).toEqual({ trigger: 'reap', reason: 'deadline' });
    expect(terminateEvent('account_disabled')).toEqual({ trigger: 'reap', reason: 'account_disabled' });
  });
});

describe('sessions over whole lives', () => {
  /** A seeded walk over legal triggers, with a billing database that checks every close against the open session. */
  function walk(seed: number) {
    let x = seed;
    const rand = (n: number) => {
      x = (x * 1103515245 + 12345) % 2 ** 31;
      return x % n;
    };
    let life = startLifecycle();
    const open = new Map<SessionKind, number>();
    const seen: string[] = [];
    for (let i = 0; i < 200 && !isTerminal(life.state); i++) {
      // Mostly the suspend/restore cycle for 40 steps, so lives are long; then towards an end.
      const legal = triggersFrom(life.state);
      const cyclic = legal.filter((t) => ['provisioned', 'idle', 'suspend_stored', 'suspend_failed', 'wake', 'restored', 'destroyed'].includes(t));
      const ending = legal.filter((t) => !cyclic.includes(t));
      const pool = i < 40 ? (cyclic.length > 0 && rand(10) < 9 ? cyclic : legal) : ending.length > 0 ? ending : legal;
      const trigger = pool[rand(pool.length)]!;
      const t = advance(life, eventFor(trigger));
      seen.push(`${t.from}>${t.to}`);
      if (t.billing.close) {
        expect(open.get(t.billing.close.kind), `${trigger} closes what is open`).toBe(t.billing.close.seq);
        open.delete(t.billing.close.kind);
      }
      if (t.billing.open) {
        expect(open.has(t.billing.open.kind), `${trigger}: one open session per kind`).toBe(false);
        open.set(t.billing.open.kind, t.billing.open.seq);
      }
      life = t.lifecycle;
      // Compute bills while ready or suspending; storage while suspended or restoring; nothing otherwise.
      expect([...open.keys()].sort(), life.state).toEqual(
        life.state === 'ready' || life.state === 'suspending' ? ['compute'] : life.state === 'suspended' || life.state === 'restoring' ? ['snapshot_storage'] : [],
      );
    }
    return { life, open, seen };
  }

  it('walks long lives: several suspend / restore cycles', () => {
    const storage = Array.from({ length: 25 }, (_, i) => walk(i + 1).life.storageSeq);
    expect(Math.max(...storage)).toBeGreaterThanOrEqual(3);
  });

  it.each(Array.from({ length: 25 }, (_, i) => i + 1))('walk %i ends terminal with every session closed, seqs counting up', (seed) => {
    const { life, open, seen } = walk(seed);
    expect(isTerminal(life.state)).toBe(true);
    expect(open.size).toBe(0);
    expect(life.computeSeq).toBe(seen.filter((s) => s.endsWith('>ready') && !s.startsWith('suspending')).length);
    expect(life.storageSeq).toBe(seen.filter((s) => s === 'suspending>suspended').length);
  });
});

describe('continue-as-new', () => {
  it('resumes ready or suspended with their sessions, and carries on through the table', () => {
    const ready = resumeLifecycle({ state: 'ready', computeSeq: 3, storageSeq: 2 });
    expect(advance(ready, { trigger: 'idle' }).to).toBe('suspending');
    expect(advance(ready, { trigger: 'delete' }).billing.close).toEqual({ kind: 'compute', seq: 3, reason: 'explicit_delete' });
    const suspended = resumeLifecycle({ state: 'suspended', computeSeq: 3, storageSeq: 3 });
    expect(advance(advance(suspended, { trigger: 'wake' }).lifecycle, { trigger: 'restored' }).billing).toEqual({
      close: { kind: 'snapshot_storage', seq: 3, reason: 'restored' },
      open: { kind: 'compute', seq: 4 },
    });
  });

  it.each([
    { state: 'pending', computeSeq: 0, storageSeq: 0 },
    { state: 'suspending', computeSeq: 1, storageSeq: 0 },
    { state: 'terminated', computeSeq: 1, storageSeq: 0 },
    { state: 'ready', computeSeq: 0, storageSeq: 0 },
    { state: 'suspended', computeSeq: 1, storageSeq: 0 },
    { state: 'ready', computeSeq: 1.5, storageSeq: 0 },
  ] as const)('refuses to resume %o', (carried) => {
    expect(() => resumeLifecycle(carried)).toThrow(/cannot resume/);
  });

  it('cannot be forged: a Lifecycle comes only from this module', () => {
    // @ts-expect-error a plain object is not a Lifecycle (branded): callers must go through transition()
    const forged: Lifecycle = { state: 'ready', computeSeq: 1, storageSeq: 0 };
    expect(forged.state).toBe('ready');
    // Legal triggers are known to the type system too.
    const fromSuspended: TriggerFrom<'suspended'>[] = ['wake', 'delete', 'reap', 'absolute_cap'];
    // @ts-expect-error a suspended sandbox has no deadline edge
    const notFromSuspended: TriggerFrom<'suspended'> = 'deadline';
    expect(fromSuspended.concat(notFromSuspended)).toHaveLength(5);
  });
});

describe('docs', () => {
  it('docs/sandbox-service.md shows the module\'s table', () => {
    const doc = readFileSync(path.join(__dirname, '..', 'docs', 'sandbox-service.md'), 'utf8');
    const begin = '<!-- lifecycle-table:begin (generated from core/sandbox-lifecycle.ts; test/sandbox-lifecycle.test.ts checks it) -->';
    const end = '<!-- lifecycle-table:end -->';
    const between = doc.slice(doc.indexOf(begin) + begin.length, doc.indexOf(end)).trim();
    expect(doc).toContain(begin);
    expect(between).toBe(renderLifecycleTable());
  });
});
