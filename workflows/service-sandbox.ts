/**
 * The service sandbox workflow: one account-scoped sandbox's whole life, the proposal's
 * lifecycle table made durable.
 *
 *   pending --provisioned--> ready --idle--> suspending --stored--> suspended --activity--> restoring --> ready
 *      |                       |                 \--failed--> ready        |                    \--failed--> failed
 *      \--timeout/error--> failed                                          |
 *                              \--DELETE / deadline / cap / abnormal exit--+--> terminating --> terminated
 *
 * Every state change goes through the lifecycle table (core/sandbox-lifecycle.ts), which refuses
 * illegal transitions and says what each one does to billing; this shell runs the activities and
 * timers, writes those billing actions to the billing database and sets search attributes.
 *
 * Timers own the idle check, the deadline (a budget that only runs while not suspended) and
 * the absolute cap. Every transition is written to the billing database by a local activity whose
 * session rows are keyed by (sandbox, kind, seq), so a retry never bills twice.
 *
 * Activity on the sandbox (exec, file calls) never passes through here: the API stamps
 * `last_activity_at` in the billing database, and the idle check claims the sandbox there atomically.
 * Only a call that finds the sandbox suspended comes here, through the `wakeSandbox` update.
 */
import {
  ActivityFailure,
  allHandlersFinished,
  CancellationScope,
  condition,
  continueAsNew,
  defineQuery,
  defineSignal,
  defineUpdate,
  log,
  patched,
  proxyActivities,
  proxyLocalActivities,
  setCurrentDetails,
  setHandler,
  TimeoutFailure,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { SlipwayAccount, SlipwayKind, SlipwaySandboxState } from '../core/search-attributes';
import {
  SERVICE_DEFAULTS,
  type EndReason,
  type ProvisioningKind,
  type SandboxExitReport,
  type SandboxHandleRef,
  type ServiceSandboxInput,
  type ServiceSandboxResult,
  type ServiceSandboxStatus,
  type TerminateReason,
} from '../core/sandbox-service';
import type { SandboxState } from '../core/states';
import { advance, isTerminal, resumeLifecycle, startLifecycle, terminateEvent, type Lifecycle, type LifecycleEvent, type Transition } from '../core/sandbox-lifecycle';
import type { SandboxServiceActivities } from '../activities/service';
import type { BillingTransition } from '../activities/billing/records';

export const terminateSandboxSignal = defineSignal<[{ reason: TerminateReason }]>('terminateSandbox');
/** From the provider watcher: the sandbox died outside Slipway. */
export const sandboxExitedSignal = defineSignal<[SandboxExitReport]>('sandboxExited');
/** From the API: a call needs the sandbox; resolves once it is ready again (or gone). */
export const wakeSandboxUpdate = defineUpdate<SandboxState, []>('wakeSandbox');
export const serviceSandboxStatusQuery = defineQuery<ServiceSandboxStatus>('serviceSandboxStatus');

const billing = proxyLocalActivities<SandboxServiceActivities>({
  startToCloseTimeout: '30 seconds',
  // The billing database must hear about every transition: keep trying while the database is away.
  retry: { initialInterval: '200 milliseconds', backoffCoefficient: 2, maximumInterval: '30 seconds' },
});

const lifecycle = proxyActivities<SandboxServiceActivities>({
  startToCloseTimeout: '10 minutes',
  heartbeatTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '1 minute', maximumAttempts: 3, nonRetryableErrorTypes: ['configuration_error'] },
});

/** Terminating retries until the provider lets go; persistent failures show in the activity's attempts. */
const teardown = proxyActivities<SandboxServiceActivities>({
  startToCloseTimeout: '10 minutes',
  heartbeatTimeout: '1 minute',
  retry: { initialInterval: '1 second', backoffCoefficient: 2, maximumInterval: '5 minutes' },
});

const errorMessage = (e: unknown): string => {
  let cur: unknown = e;
  while (cur instanceof ActivityFailure && cur.cause) cur = cur.cause;
  return cur instanceof Error ? cur.message : String(e);
};
const isTimeout = (e: unknown): boolean => e instanceof ActivityFailure && e.cause instanceof TimeoutFailure;

export async function serviceSandboxWorkflow(input: ServiceSandboxInput): Promise<ServiceSandboxResult> {
  const { sandboxId, accountId, policy } = input;
  const carried = input.carried;
  const capAtMs = input.createdAtMs + policy.absoluteCapMs;

  /** Changed only by `enter`, with a transition the lifecycle table allowed. */
  let life: Lifecycle = carried ? resumeLifecycle(carried) : startLifecycle();
  let handle: SandboxHandleRef | undefined = carried?.handle;
  /** The deadline budget left at `periodStartMs`; it is spent only while not suspended. */
  let deadlineRemainingMs = carried?.deadlineRemainingMs ?? input.deadlineMs;
  let periodStartMs = carried?.periodStartMs ?? input.createdAtMs;
  let terminateRequest: TerminateReason | undefined = carried?.pending?.terminate;
  let exit: SandboxExitReport | undefined = carried?.state === 'ready' ? carried.pending?.exit : undefined;
  let wakeRequested = carried?.pending?.wake ?? false;
  let endReason: EndReason | undefined;
  let error: string | undefined;

  const record = (t: Omit<BillingTransition, 'sandboxId'>) => billing.recordSandboxTransition({ sandboxId, ...t });
  /** The table's answer for `event` from the current state; throws (a workflow task failure) if illegal. */
  const next = (event: LifecycleEvent): Transition => advance(life, event);
  /** Announces the current state (search attribute, details). */
  const show = (details: string) => {
    upsertSearchAttributes([{ key: SlipwaySandboxState, value: life.state }]);
    setCurrentDetails(`**${life.state}** — ${details}`);
  };
  /** Takes a transition: from here on, queries, handlers and the billing database's next writes see its state. */
  const enter = (t: Transition, details: string) => {
    life = t.lifecycle;
    show(details);
  };
  /** A transition's billing actions as the billing database's session close and open, at `atMs` (a close may end earlier). */
  const sessions = (
    t: Transition,
    atMs: number,
    extra: { closeAtMs?: number; provisioningKind?: ProvisioningKind } = {},
  ): Pick<BillingTransition, 'close' | 'open'> => {
    const { close, open } = t.billing;
    return {
      ...(close ? { close: { kind: close.kind, seq: close.seq, endedAtMs: extra.closeAtMs ?? atMs, reason: close.reason } } : {}),
      ...(open ? { open: { kind: open.kind, seq: open.seq, startedAtMs: atMs, ...(extra.provisioningKind ? { provisioningKind: extra.provisioningKind } : {}) } } : {}),
    };
  };

  upsertSearchAttributes([
    { key: SlipwayKind, value: 'sandbox' },
    { key: SlipwayAccount, value: accountId },
  ]);
  setHandler(serviceSandboxStatusQuery, () => ({
    sandboxId,
    state: life.state,
    handle,
    deadlineRemainingMs,
    computeSeq: life.computeSeq,
    storageSeq: life.storageSeq,
    reason: endReason,
    error,
  }));
  setHandler(terminateSandboxSignal, ({ reason }) => {
    terminateRequest ??= reason;
  });
  setHandler(sandboxExitedSignal, (report) => {
    // Only a ready sandbox can die unseen: while suspending or suspended its directory is gone on purpose.
    if (life.state === 'ready') exit ??= report;
  });
  setHandler(wakeSandboxUpdate, async () => {
    const asleep: SandboxState[] = ['suspending', 'suspended', 'restoring'];
    const awakeOrEnded: SandboxState[] = ['ready', 'terminating', 'terminated', 'failed'];
    if (asleep.includes(life.state)) wakeRequested = true;
    await condition(() => awakeOrEnded.includes(life.state));
    return life.state;
  });

  const finish = (): ServiceSandboxResult => {
    const final = life.state;
    if (!isTerminal(final)) throw new Error(`sandbox workflow finishing in ${final}`);
    return { sandboxId, state: final, reason: endReason, error };
  };

  // --- pending -> ready | failed ------------------------------------------------------------
  if (!carried) {
    show(`provisioning from profile \`${policy.profileName}\``);
    const provisioning = proxyActivities<SandboxServiceActivities>({
      // The provisioning timeout bounds every attempt together; past it the sandbox fails.
      scheduleToCloseTimeout: policy.provisioningTimeoutMs,
      heartbeatTimeout: '30 seconds',
      retry: { initialInterval: '500 milliseconds', backoffCoefficient: 2, maximumInterval: '10 seconds', nonRetryableErrorTypes: ['configuration_error'] },
    });
    let provisioned: Awaited<ReturnType<SandboxServiceActivities['provisionSandbox']>> | undefined;
    const scope = new CancellationScope();
    const work = scope.run(() =>
      provisioning.provisionSandbox({
        sandboxId,
        accountId,
        policy,
        grants: input.grants,
        grantsNotAfterMs: input.createdAtMs + input.deadlineMs,
        grantTtlMs: SERVICE_DEFAULTS.grantTtlMinutes * 60_000,
      }),
    );
    const deleted = condition(() => terminateRequest !== undefined).then(() => scope.cancel());
    let failure: unknown;
    try {
      provisioned = await work;
    } catch (e) {
      failure = e;
    }
    void deleted;
    if (!provisioned || terminateRequest) {
      // A terminate request cancels provisioning (pending -> terminating -> terminated); a
      // provisioning error or timeout fails the sandbox (pending -> failed).
      const end = next(terminateRequest ? terminateEvent(terminateRequest) : { trigger: isTimeout(failure) ? 'provisioning_timeout' : 'provisioning_failed' });
      endReason = end.endReason;
      if (!terminateRequest) error = errorMessage(failure);
      const cancelled = end.to === 'terminating';
      let last = end;
      await CancellationScope.nonCancellable(async () => {
        if (cancelled) enter(end, `deleted while provisioning (${endReason})`);
        await teardown.destroyServiceSandbox({ sandboxId, accountId, policy, handle: provisioned?.handle }).catch((e) => {
          log.warn('cleanup after provisioning failed', { sandboxId, error: errorMessage(e) });
        });
        if (cancelled) last = next({ trigger: 'destroyed' });
        // No session ever opened: pending never bills.
        await record({ status: last.to, fields: { terminatedAtMs: Date.now(), endReason, ...(error ? { error } : {}) } });
      });
      enter(last, cancelled ? `deleted before it was ready` : `provisioning failed: ${error}`);
      return finish();
    }
    handle = provisioned.handle;
    const now = Date.now();
    deadlineRemainingMs = Math.max(0, input.deadlineMs - (now - input.createdAtMs));
    periodStartMs = now;
    const ready = next({ trigger: 'provisioned' });
    await record({
      status: ready.to,
      fields: {
        readyAtMs: now,
        provisioningKind: provisioned.provisioningKind,
        repository: handle.repository,
        root: handle.root,
        branch: handle.branch,
        deadlineAtMs: now + deadlineRemainingMs,
        touch: true,
      },
      ...sessions(ready, now, { provisioningKind: provisioned.provisioningKind }),
      audit: { event: 'ready', detail: { provisioningKind: provisioned.provisioningKind, provisioningMs: provisioned.durationMs } },
    });
    enter(ready, `\`${handle.root}\` (${provisioned.provisioningKind}, ${provisioned.durationMs} ms)`);
  } else {
    show('continued as new');
  }

  const carry = () =>
    continueAsNew<typeof serviceSandboxWorkflow>({
      ...input,
      carried: {
        state: life.state as 'ready' | 'suspended',
        handle: handle!,
        computeSeq: life.computeSeq,
        storageSeq: life.storageSeq,
        deadlineRemainingMs,
        periodStartMs,
        ...(terminateRequest !== undefined || exit !== undefined || wakeRequested
          ? { pending: { ...(terminateRequest !== undefined ? { terminate: terminateRequest } : {}), ...(exit ? { exit } : {}), ...(wakeRequested ? { wake: true } : {}) } }
          : {}),
      },
    });
  /**
   * Whether to hand over now. Handlers finish first (an update must not be cut off); a
   * terminate, exit or wake that arrived meanwhile is handled by this run before any switch
   * (patch `sandbox-carry-pending`: runs that switched with one pending dropped it).
   */
  const handOver = async (pending: () => boolean): Promise<boolean> => {
    await condition(allHandlersFinished);
    return !pending() || !patched('sandbox-carry-pending');
  };

  // --- the live loop: ready <-> suspended ------------------------------------------------------
  let nextIdleCheckMs = Date.now() + policy.idleTimeoutMs;
  // Ready/suspended periods begun in this run: history grows with each, so long-lived
  // sandboxes continue as new when Temporal suggests it (or after a fixed count, for tests).
  let periods = 0;
  const shouldCarry = () =>
    workflowInfo().continueAsNewSuggested || (input.continueAsNewAfterPeriods !== undefined && periods >= input.continueAsNewAfterPeriods);
  for (;;) {
    if (life.state === 'ready') {
      wakeRequested = false;
      const deadlineAtMs = periodStartMs + deadlineRemainingMs;
      const wakeAt = Math.min(deadlineAtMs, capAtMs, nextIdleCheckMs);
      await condition(() => terminateRequest !== undefined || exit !== undefined || shouldCarry(), Math.max(1, wakeAt - Date.now()));
      const now = Date.now();
      const ending: LifecycleEvent | undefined = exit
        ? { trigger: 'abnormal_exit', reason: exit.reason }
        : terminateRequest
          ? terminateEvent(terminateRequest)
          : now >= capAtMs
            ? { trigger: 'absolute_cap' }
            : now >= deadlineAtMs
              ? { trigger: 'deadline' }
              : undefined;
      if (ending) {
        const end = next(ending);
        const reason = end.endReason;
        endReason = reason;
        deadlineRemainingMs = Math.max(0, deadlineRemainingMs - (now - periodStartMs));
        enter(end, `${reason}${exit?.detail ? `: ${exit.detail}` : ''}`);
        await record({
          status: end.to,
          fields: { endReason: reason, deadlineAtMs: null },
          // An abnormal death closes compute when the watcher saw it.
          ...sessions(end, now, { closeAtMs: exit ? Math.min(now, exit.observedAtMs) : now }),
          audit: { event: exit ? 'abnormal_exit' : 'terminate', detail: { reason, ...(exit?.detail ? { detail: exit.detail } : {}) } },
        });
        break;
      }
      if (shouldCarry()) {
        if (await handOver(() => terminateRequest !== undefined || exit !== undefined)) return carry();
        continue;
      }
      if (now < nextIdleCheckMs) continue;

      // Idle check: the billing database decides, atomically against concurrent calls.
      const claim = await billing.claimIdleSandbox({ sandboxId, idleMs: policy.idleTimeoutMs });
      if (!claim.claimed) {
        nextIdleCheckMs = Date.now() + Math.max(50, policy.idleTimeoutMs - claim.idleForMs);
        continue;
      }
      enter(next({ trigger: 'idle' }), `idle for ${Math.round(policy.idleTimeoutMs / 1000)} s: storing a snapshot`);
      try {
        const stored = await lifecycle.suspendSandbox({ sandboxId, handle: handle!, policy });
        const at = Date.now();
        deadlineRemainingMs = Math.max(0, deadlineRemainingMs - (at - periodStartMs));
        periodStartMs = at;
        const suspended = next({ trigger: 'suspend_stored' });
        await record({
          status: suspended.to,
          fields: { suspendedAtMs: at, snapshotRef: stored.snapshotRef, deadlineAtMs: null, deadlineRemainingMs },
          ...sessions(suspended, at),
        });
        enter(suspended, `snapshot \`${stored.snapshotRef}\` (${stored.durationMs} ms); compute released`);
        periods += 1;
      } catch (e) {
        // A failed suspend returns to ready: the session continues, the idle clock restarts.
        log.warn('suspend failed; the sandbox stays ready', { sandboxId, error: errorMessage(e) });
        const stayed = next({ trigger: 'suspend_failed' });
        await record({ status: stayed.to, fields: { touch: true }, audit: { event: 'suspend_failed', detail: { error: errorMessage(e) } } });
        enter(stayed, `suspend failed (${errorMessage(e)}); staying ready`);
        nextIdleCheckMs = Date.now() + policy.idleTimeoutMs;
      }
      continue;
    }

    // life.state === 'suspended': the deadline clock is paused; only DELETE, the cap or a wake move it.
    await condition(() => terminateRequest !== undefined || wakeRequested || shouldCarry(), Math.max(1, capAtMs - Date.now()));
    const now = Date.now();
    if (terminateRequest || now >= capAtMs) {
      const end = next(terminateRequest ? terminateEvent(terminateRequest) : { trigger: 'absolute_cap' });
      const reason = end.endReason;
      endReason = reason;
      enter(end, `${reason} while suspended`);
      await record({
        status: end.to,
        fields: { endReason: reason },
        ...sessions(end, now),
        audit: { event: 'terminate', detail: { reason, whileSuspended: true } },
      });
      break;
    }
    if (!wakeRequested) {
      if (await handOver(() => terminateRequest !== undefined || wakeRequested)) return carry();
      continue;
    }
    const woke = next({ trigger: 'wake' });
    enter(woke, 'woken by activity: restoring the snapshot');
    await record({ status: woke.to });
    try {
      const restoring = proxyActivities<SandboxServiceActivities>({
        scheduleToCloseTimeout: policy.provisioningTimeoutMs,
        heartbeatTimeout: '30 seconds',
        retry: { initialInterval: '500 milliseconds', backoffCoefficient: 2, maximumInterval: '10 seconds', nonRetryableErrorTypes: ['configuration_error'] },
      });
      const restored = await restoring.restoreSandbox({ sandboxId, handle: handle!, policy });
      const at = Date.now();
      periodStartMs = at;
      const back = next({ trigger: 'restored' });
      await record({
        status: back.to,
        fields: { deadlineAtMs: at + deadlineRemainingMs, deadlineRemainingMs: null, suspendedAtMs: null, snapshotRef: null, touch: true },
        ...sessions(back, at),
      });
      if (input.grants.length > 0) await billing.capSandboxGrants({ sandboxId, notAfterMs: at + deadlineRemainingMs });
      nextIdleCheckMs = at + policy.idleTimeoutMs;
      enter(back, `restored in ${restored.durationMs} ms`);
      periods += 1;
    } catch (e) {
      const failed = next({ trigger: 'restore_failed' });
      endReason = failed.endReason;
      error = errorMessage(e);
      const at = Date.now();
      await CancellationScope.nonCancellable(async () => {
        await record({
          status: failed.to,
          fields: { endReason, error, terminatedAtMs: at },
          ...sessions(failed, at),
        });
        await teardown.destroyServiceSandbox({ sandboxId, accountId, policy, handle }).catch(() => undefined);
      });
      enter(failed, `restore failed: ${error}`);
      return finish();
    }
  }

  // --- terminating -> terminated ----------------------------------------------------------------
  const done = next({ trigger: 'destroyed' });
  await CancellationScope.nonCancellable(async () => {
    await teardown.destroyServiceSandbox({ sandboxId, accountId, policy, handle });
    await record({ status: done.to, fields: { terminatedAtMs: Date.now() } });
  });
  enter(done, `${endReason}: resources released`);
  return finish();
}

/** One reaper tick, started by the Temporal Schedule. */
export async function sandboxReaperWorkflow(input: { orphanGraceMs?: number } = {}) {
  const acts = proxyActivities<SandboxServiceActivities>({
    startToCloseTimeout: '5 minutes',
    retry: { maximumAttempts: 3 },
  });
  upsertSearchAttributes([{ key: SlipwayKind, value: 'reaper' }]);
  const result = await acts.reapSandboxes(input);
  setCurrentDetails(`signalled ${result.signalled.length}, closed ${result.closedOrphans.length} orphans, warmed ${result.warmed}`);
  return result;
}
