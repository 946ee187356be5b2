/**
 * The service sandbox's lifecycle as the reference design's transition table
 * (shared/reference/sandbox-api-proposal.txt, "Lifecycle and state machines"): every legal
 * edge with its trigger, the component that causes it, and what it does to billing.
 *
 *   pending -> ready -> (suspending -> suspended -> restoring -> ready)* -> terminating -> terminated | failed
 *
 * `transition(lifecycle, event)` is the only way to a new state: a `Lifecycle` value cannot be
 * written by hand (it is branded), only obtained from `startLifecycle`, `resumeLifecycle` (after
 * continue-as-new) or a legal transition. An event the table has no row for is refused with an
 * `IllegalTransition`, and the terminal states have no rows: they absorb everything.
 *
 * The machine also numbers the billing sessions (`computeSeq`, `storageSeq`), so the session a
 * transition closes is always the one the previous transition opened. The workflow
 * (workflows/service-sandbox.ts) keeps the I/O: it runs the activities and timers, writes the
 * billing actions to the billing database with its own timestamps, and sets search attributes.
 *
 * Pure and bundle-safe: no clock, no I/O, no Temporal; imports only core vocabulary.
 */
import type { SandboxState } from './states';
import { TERMINAL_STATES, type AbnormalEndReason, type EndReason, type SessionKind, type TerminateReason } from './sandbox-service';

/** What moves a sandbox from one state to the next. */
export const LIFECYCLE_TRIGGERS = {
  provisioned: 'the provider created the sandbox (warm-pool claim or cold boot)',
  provisioning_timeout: 'provisioning did not finish within the profile\'s provisioning timeout',
  provisioning_failed: 'the provider could not create the sandbox',
  delete: 'DELETE /api/v1/sandboxes/:id (terminateSandbox signal, reason explicit_delete)',
  reap: 'the reaper\'s terminateSandbox signal (deadline or cap past, account disabled)',
  deadline: 'the deadline budget ran out (workflow timer)',
  absolute_cap: 'the absolute lifetime cap passed (workflow timer)',
  abnormal_exit: 'the sandbox died outside Slipway (sandboxExited signal)',
  idle: 'idle check: no call for the idle timeout, claimed in the billing database',
  suspend_stored: 'the snapshot is stored and the directory freed',
  suspend_failed: 'the suspend was refused or failed',
  wake: 'a call needs the sandbox (wakeSandbox update)',
  restored: 'the snapshot is restored',
  restore_failed: 'the snapshot could not be restored (gone, or past the provisioning timeout)',
  destroyed: 'the provider let go of the sandbox\'s resources',
} as const;
export type LifecycleTrigger = keyof typeof LIFECYCLE_TRIGGERS;

/** The component that causes a transition. */
export const LIFECYCLE_OWNERS = {
  provisioner: 'provisionSandbox / restoreSandbox activities',
  api: 'the REST / MCP API',
  reaper: 'the reaper (Temporal Schedule)',
  timer: "the workflow's timers",
  idle_detector: 'the idle check (claimIdleSandbox local activity)',
  suspender: 'suspendSandbox activity',
  watcher: 'the provider watcher (workers/sandbox-watcher.ts): Kubernetes pod deaths pushed by the worker\'s pod informers the moment they are seen; a probe pass every `watchIntervalMs` (default 2 s; 0: none) for the rest (ADR 0029)',
  terminator: 'destroyServiceSandbox activity',
} as const;
export type LifecycleOwner = keyof typeof LIFECYCLE_OWNERS;

/** Stands for "the reason the event carries" in a table row (a reaper's or watcher's reason). */
export const EVENT_REASON = 'event' as const;
type RowReason = EndReason | typeof EVENT_REASON;

/** What a row does to billing: at most one session closes and at most one opens (the billing database's contract). */
export interface BillingRule {
  close?: { kind: SessionKind; reason: RowReason };
  open?: { kind: SessionKind };
}

export type LiveState = Exclude<SandboxState, (typeof TERMINAL_STATES)[number]>;

export interface LifecycleRow {
  from: LiveState;
  trigger: LifecycleTrigger;
  to: SandboxState;
  owner: LifecycleOwner;
  billing: BillingRule;
  /** The sandbox's end reason, set on the edges that decide how it ends. */
  ends?: RowReason;
  note: string;
}

const none: BillingRule = {};

/** The lifecycle, edge by edge. Order is the docs' order. */
export const LIFECYCLE_TABLE = [
  { from: 'pending', trigger: 'provisioned', to: 'ready', owner: 'provisioner', billing: { open: { kind: 'compute' } }, note: 'compute opens at ready_at with the provisioning kind (warm_hit / cold_boot); the deadline clock starts' },
  { from: 'pending', trigger: 'provisioning_timeout', to: 'failed', owner: 'provisioner', billing: none, ends: 'provisioning_timeout', note: 'no session ever opened: pending never bills' },
  { from: 'pending', trigger: 'provisioning_failed', to: 'failed', owner: 'provisioner', billing: none, ends: 'provisioning_failed', note: 'no session ever opened' },
  { from: 'pending', trigger: 'delete', to: 'terminating', owner: 'api', billing: none, ends: 'explicit_delete', note: 'provisioning is cancelled; no session was open' },
  { from: 'pending', trigger: 'reap', to: 'terminating', owner: 'reaper', billing: none, ends: EVENT_REASON, note: 'provisioning is cancelled; no session was open' },
  { from: 'ready', trigger: 'delete', to: 'terminating', owner: 'api', billing: { close: { kind: 'compute', reason: 'explicit_delete' } }, ends: 'explicit_delete', note: 'compute closes now' },
  { from: 'ready', trigger: 'reap', to: 'terminating', owner: 'reaper', billing: { close: { kind: 'compute', reason: EVENT_REASON } }, ends: EVENT_REASON, note: 'a lost timer, a clock jump or a disabled account' },
  { from: 'ready', trigger: 'deadline', to: 'terminating', owner: 'timer', billing: { close: { kind: 'compute', reason: 'deadline' } }, ends: 'deadline', note: 'compute closes now' },
  { from: 'ready', trigger: 'absolute_cap', to: 'terminating', owner: 'timer', billing: { close: { kind: 'compute', reason: 'absolute_cap' } }, ends: 'absolute_cap', note: 'compute closes now' },
  { from: 'ready', trigger: 'abnormal_exit', to: 'terminating', owner: 'watcher', billing: { close: { kind: 'compute', reason: EVENT_REASON } }, ends: EVENT_REASON, note: "compute closes when the watcher saw the death, or at the provider's own end time (a pod's finish time) when it has one (directory_removed / worktree_unregistered / sandbox_lost / oom_killed / evicted / deleted / node_lost; a reason the service does not know is sandbox_lost)" },
  { from: 'ready', trigger: 'idle', to: 'suspending', owner: 'idle_detector', billing: none, note: 'compute continues' },
  { from: 'suspending', trigger: 'suspend_stored', to: 'suspended', owner: 'suspender', billing: { close: { kind: 'compute', reason: 'idle_offload' }, open: { kind: 'snapshot_storage' } }, note: 'the deadline clock pauses' },
  { from: 'suspending', trigger: 'suspend_failed', to: 'ready', owner: 'suspender', billing: none, note: 'compute continues; the idle clock restarts; audit event suspend_failed' },
  { from: 'suspended', trigger: 'wake', to: 'restoring', owner: 'api', billing: none, note: 'storage continues' },
  { from: 'suspended', trigger: 'delete', to: 'terminating', owner: 'api', billing: { close: { kind: 'snapshot_storage', reason: 'explicit_delete' } }, ends: 'explicit_delete', note: 'the snapshot is deleted' },
  { from: 'suspended', trigger: 'reap', to: 'terminating', owner: 'reaper', billing: { close: { kind: 'snapshot_storage', reason: EVENT_REASON } }, ends: EVENT_REASON, note: 'the snapshot is deleted' },
  { from: 'suspended', trigger: 'absolute_cap', to: 'terminating', owner: 'timer', billing: { close: { kind: 'snapshot_storage', reason: 'absolute_cap' } }, ends: 'absolute_cap', note: 'suspended time does not count against the deadline, only the cap' },
  { from: 'restoring', trigger: 'restored', to: 'ready', owner: 'provisioner', billing: { close: { kind: 'snapshot_storage', reason: 'restored' }, open: { kind: 'compute' } }, note: 'a new compute session (next seq); the deadline clock resumes' },
  { from: 'restoring', trigger: 'restore_failed', to: 'failed', owner: 'provisioner', billing: { close: { kind: 'snapshot_storage', reason: 'restore_failed' } }, ends: 'restore_failed', note: 'storage closes' },
  { from: 'terminating', trigger: 'destroyed', to: 'terminated', owner: 'terminator', billing: none, note: 'sessions were closed on the way in; grant tokens revoked' },
] as const satisfies readonly LifecycleRow[];

/** Reasons a reaper's terminate request carries (a DELETE is the `delete` trigger). */
export type ReapReason = Exclude<TerminateReason, 'explicit_delete'>;

/** An event fed to the machine: a trigger, with the reason where the trigger carries one. */
export type LifecycleEvent =
  | { trigger: Exclude<LifecycleTrigger, 'reap' | 'abnormal_exit'> }
  | { trigger: 'reap'; reason: ReapReason }
  | { trigger: 'abnormal_exit'; reason: AbnormalEndReason };

/** The event for a terminateSandbox signal: a DELETE or the reaper. */
export const terminateEvent = (reason: TerminateReason): LifecycleEvent =>
  reason === 'explicit_delete' ? { trigger: 'delete' } : { trigger: 'reap', reason };

/** Triggers that are legal from `S`, as the table says. */
export type TriggerFrom<S extends SandboxState> = Extract<(typeof LIFECYCLE_TABLE)[number], { from: S }>['trigger'];

declare const lifecycleBrand: unique symbol;
/**
 * Where a sandbox is in its life, and the sequence numbers of its billing sessions (the last
 * opened of each kind; 0 before the first). Only this module makes these.
 */
export interface Lifecycle {
  readonly state: SandboxState;
  readonly computeSeq: number;
  readonly storageSeq: number;
  readonly [lifecycleBrand]: true;
}

const make = (state: SandboxState, computeSeq: number, storageSeq: number): Lifecycle =>
  Object.freeze({ state, computeSeq, storageSeq }) as unknown as Lifecycle;

/** A new sandbox: pending, no session yet. */
export const startLifecycle = (): Lifecycle => make('pending', 0, 0);

/**
 * The lifecycle a previous run handed over on continue-as-new. A run only carries on from ready
 * (a compute session open) or suspended (a storage session open); anything else is refused.
 */
export function resumeLifecycle(carried: { state: SandboxState; computeSeq: number; storageSeq: number }): Lifecycle {
  const { state, computeSeq, storageSeq } = carried;
  const seqsOk = Number.isInteger(computeSeq) && Number.isInteger(storageSeq) && computeSeq >= 1 && storageSeq >= 0;
  if (!seqsOk || (state !== 'ready' && state !== 'suspended') || (state === 'suspended' && storageSeq < 1)) {
    throw new Error(`cannot resume a sandbox lifecycle from ${JSON.stringify(carried)}: only ready or suspended, with their sessions, carry over`);
  }
  return make(state, computeSeq, storageSeq);
}

export const isTerminal = (state: SandboxState): state is (typeof TERMINAL_STATES)[number] =>
  (TERMINAL_STATES as readonly SandboxState[]).includes(state);

/** A billing action of one transition, with the session's sequence number; the workflow adds the time. */
export interface SessionCloseAction {
  kind: SessionKind;
  seq: number;
  reason: EndReason;
}
export interface SessionOpenAction {
  kind: SessionKind;
  seq: number;
}
export interface BillingActions {
  close?: SessionCloseAction;
  open?: SessionOpenAction;
}

export interface Transition {
  from: SandboxState;
  to: SandboxState;
  trigger: LifecycleTrigger;
  owner: LifecycleOwner;
  /** The lifecycle after the transition: hand it back on the next event. */
  lifecycle: Lifecycle;
  billing: BillingActions;
  /** How the sandbox ends, on the edges that decide it. */
  endReason?: EndReason;
}

/** The typed refusal of an event the table has no row for. */
export interface IllegalTransition {
  code: 'illegal_transition';
  from: SandboxState;
  trigger: LifecycleTrigger;
  message: string;
}

export type TransitionResult = ({ ok: true } & Transition) | { ok: false; error: IllegalTransition };

export class IllegalTransitionError extends Error {
  override readonly name = 'IllegalTransitionError';
  constructor(readonly illegal: IllegalTransition) {
    super(illegal.message);
  }
}

/** The table's row for (from, trigger), if there is one. */
export function lifecycleRow(from: SandboxState, trigger: LifecycleTrigger): LifecycleRow | undefined {
  return (LIFECYCLE_TABLE as readonly LifecycleRow[]).find((r) => r.from === from && r.trigger === trigger);
}

/** The triggers legal from a state, in table order (none from a terminal state). */
export const triggersFrom = (state: SandboxState): LifecycleTrigger[] =>
  (LIFECYCLE_TABLE as readonly LifecycleRow[]).filter((r) => r.from === state).map((r) => r.trigger);

/** The next state and the billing actions for `event`, or the refusal when the table has no such edge. */
export function transition(lifecycle: Lifecycle, event: LifecycleEvent): TransitionResult {
  const row = lifecycleRow(lifecycle.state, event.trigger);
  if (!row) {
    const legal = triggersFrom(lifecycle.state);
    return {
      ok: false,
      error: {
        code: 'illegal_transition',
        from: lifecycle.state,
        trigger: event.trigger,
        message: `illegal sandbox transition: ${event.trigger} from ${lifecycle.state} (${legal.length ? `legal: ${legal.join(', ')}` : `${lifecycle.state} is terminal`})`,
      },
    };
  }
  const reasonOf = (r: RowReason): EndReason => {
    if (r !== EVENT_REASON) return r;
    if (event.trigger !== 'reap' && event.trigger !== 'abnormal_exit') throw new Error(`row ${row.from} --${row.trigger}--> ${row.to} takes its reason from an event that has none`);
    return event.reason;
  };
  let { computeSeq, storageSeq } = lifecycle;
  const billing: BillingActions = {};
  if (row.billing.close) {
    const kind = row.billing.close.kind;
    billing.close = { kind, seq: kind === 'compute' ? computeSeq : storageSeq, reason: reasonOf(row.billing.close.reason) };
  }
  if (row.billing.open) {
    const kind = row.billing.open.kind;
    billing.open = { kind, seq: kind === 'compute' ? ++computeSeq : ++storageSeq };
  }
  return {
    ok: true,
    from: row.from,
    to: row.to,
    trigger: row.trigger,
    owner: row.owner,
    lifecycle: make(row.to, computeSeq, storageSeq),
    billing,
    ...(row.ends ? { endReason: reasonOf(row.ends) } : {}),
  };
}

/** `transition`, for callers to whom an illegal transition is a bug: throws `IllegalTransitionError`. */
export function advance(lifecycle: Lifecycle, event: LifecycleEvent): Transition {
  const result = transition(lifecycle, event);
  if (!result.ok) throw new IllegalTransitionError(result.error);
  const { ok: _ok, ...t } = result;
  return t;
}

/** The table as Markdown, for docs/sandbox-service.md (a test keeps the docs equal to it). */
export function renderLifecycleTable(): string {
  const reason = (r: RowReason) => (r === EVENT_REASON ? "the event's reason" : `\`${r}\``);
  const billing = (b: BillingRule) => {
    const parts: string[] = [];
    if (b.close) parts.push(`close ${b.close.kind.replace('_', ' ')} (${reason(b.close.reason)})`);
    if (b.open) parts.push(`open ${b.open.kind.replace('_', ' ')}`);
    return parts.length ? parts.join(', ') : 'none';
  };
  const lines = [
    '| from | to | trigger | owner | billing | sandbox ends with | notes |',
    '|---|---|---|---|---|---|---|',
    ...(LIFECYCLE_TABLE as readonly LifecycleRow[]).map(
      (r) => `| ${r.from} | ${r.to} | \`${r.trigger}\` | ${r.owner} | ${billing(r.billing)} | ${r.ends ? reason(r.ends) : ''} | ${r.note} |`,
    ),
    '',
    'Triggers:',
    '',
    ...Object.entries(LIFECYCLE_TRIGGERS).map(([name, text]) => `- \`${name}\`: ${text}`),
    '',
    'Owners:',
    '',
    ...Object.entries(LIFECYCLE_OWNERS).map(([name, text]) => `- ${name}: ${text}`),
  ];
  return lines.join('\n');
}
