/**
 * The service sandbox workflow: one account-scoped sandbox's whole life, the proposal's
 * lifecycle table made durable.
 *
 *   pending --provisioned--> ready --idle--> suspending --stored--> suspended --activity--> restoring --> ready
 *      |                       |                 \--failed--> ready        |                    \--failed--> failed
 *      \--timeout/error--> failed                                          |
 *                              \--DELETE / deadline / cap / abnormal exit--+--> terminating --> terminated
 *
 * Timers own the idle check, the deadline (a budget that only runs while not suspended) and
 * the absolute cap. Every transition is written to the ledger by a local activity whose
 * session rows are keyed by (sandbox, kind, seq), so a retry never bills twice.
 *
 * Activity on the sandbox (exec, file calls) never passes through here: the API stamps
 * `last_activity_at` in the ledger, and the idle check claims the sandbox there atomically.
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
  type SandboxExitReport,
  type SandboxHandleRef,
  type ServiceSandboxInput,
  type ServiceSandboxResult,
  type ServiceSandboxStatus,
  type TerminateReason,
} from '../core/sandbox-service';
import type { SandboxState } from '../core/states';
import type { SandboxServiceActivities } from '../activities/service';
import type { LedgerTransition } from '../activities/ledger/ledger';

export const terminateSandboxSignal = defineSignal<[{ reason: TerminateReason }]>('terminateSandbox');
/** From the provider watcher: the sandbox died outside Slipway. */
export const sandboxExitedSignal = defineSignal<[SandboxExitReport]>('sandboxExited');
/** From the API: a call needs the sandbox; resolves once it is ready again (or gone). */
export const wakeSandboxUpdate = defineUpdate<SandboxState, []>('wakeSandbox');
export const serviceSandboxStatusQuery = defineQuery<ServiceSandboxStatus>('serviceSandboxStatus');

const ledger = proxyLocalActivities<SandboxServiceActivities>({
  startToCloseTimeout: '30 seconds',
  // The ledger must hear about every transition: keep trying while the database is away.
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

  let state: SandboxState = carried?.state ?? 'pending';
  let handle: SandboxHandleRef | undefined = carried?.handle;
  let computeSeq = carried?.computeSeq ?? 0;
  let storageSeq = carried?.storageSeq ?? 0;
  /** The deadline budget left at `periodStartMs`; it is spent only while not suspended. */
  let deadlineRemainingMs = carried?.deadlineRemainingMs ?? input.deadlineMs;
  let periodStartMs = carried?.periodStartMs ?? input.createdAtMs;
  let terminateRequest: TerminateReason | undefined;
  let exit: SandboxExitReport | undefined;
  let wakeRequested = false;
  let endReason: EndReason | undefined;
  let error: string | undefined;

  const record = (t: Omit<LedgerTransition, 'sandboxId'>) => ledger.recordSandboxTransition({ sandboxId, ...t });
  const enter = (next: SandboxState, details: string) => {
    state = next;
    upsertSearchAttributes([{ key: SlipwaySandboxState, value: next }]);
    setCurrentDetails(`**${next}** — ${details}`);
  };

  upsertSearchAttributes([
    { key: SlipwayKind, value: 'sandbox' },
    { key: SlipwayAccount, value: accountId },
  ]);
  setHandler(serviceSandboxStatusQuery, () => ({ sandboxId, state, handle, deadlineRemainingMs, computeSeq, storageSeq, reason: endReason, error }));
  setHandler(terminateSandboxSignal, ({ reason }) => {
    terminateRequest ??= reason;
  });
  setHandler(sandboxExitedSignal, (report) => {
    // Only a ready sandbox can die unseen: while suspending or suspended its directory is gone on purpose.
    if (state === 'ready') exit ??= report;
  });
  setHandler(wakeSandboxUpdate, async () => {
    if (state === 'suspending' || state === 'suspended' || state === 'restoring') wakeRequested = true;
    await condition(() => state === 'ready' || state === 'terminating' || state === 'terminated' || state === 'failed');
    return state;
  });

  const finish = (final: 'terminated' | 'failed'): ServiceSandboxResult => ({ sandboxId, state: final, reason: endReason, error });

  // --- pending -> ready | failed ------------------------------------------------------------
  if (!carried) {
    enter('pending', `provisioning from profile \`${policy.profileName}\``);
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
    try {
      provisioned = await work;
    } catch (e) {
      if (terminateRequest) {
        endReason = terminateRequest;
      } else {
        endReason = isTimeout(e) ? 'provisioning_timeout' : 'provisioning_failed';
        error = errorMessage(e);
      }
    }
    void deleted;
    if (!provisioned || terminateRequest) {
      const cancelled = terminateRequest !== undefined && !error;
      const final = cancelled ? 'terminated' : 'failed';
      await CancellationScope.nonCancellable(async () => {
        if (cancelled) enter('terminating', `deleted while provisioning (${endReason})`);
        await teardown.destroyServiceSandbox({ sandboxId, accountId, policy, handle: provisioned?.handle }).catch((e) => {
          log.warn('cleanup after provisioning failed', { sandboxId, error: errorMessage(e) });
        });
        // No session ever opened: pending never bills.
        await record({ status: final, fields: { terminatedAtMs: Date.now(), endReason: endReason ?? terminateRequest, ...(error ? { error } : {}) } });
      });
      enter(final, cancelled ? `deleted before it was ready` : `provisioning failed: ${error}`);
      return finish(final);
    }
    handle = provisioned.handle;
    const now = Date.now();
    deadlineRemainingMs = Math.max(0, input.deadlineMs - (now - input.createdAtMs));
    periodStartMs = now;
    computeSeq = 1;
    await record({
      status: 'ready',
      fields: {
        readyAtMs: now,
        provisioningKind: provisioned.provisioningKind,
        repository: handle.repository,
        root: handle.root,
        branch: handle.branch,
        deadlineAtMs: now + deadlineRemainingMs,
        touch: true,
      },
      open: { kind: 'compute', seq: computeSeq, startedAtMs: now, provisioningKind: provisioned.provisioningKind },
      audit: { event: 'ready', detail: { provisioningKind: provisioned.provisioningKind, provisioningMs: provisioned.durationMs } },
    });
    enter('ready', `\`${handle.root}\` (${provisioned.provisioningKind}, ${provisioned.durationMs} ms)`);
  } else {
    enter(state, 'continued as new');
  }

  const carry = () =>
    continueAsNew<typeof serviceSandboxWorkflow>({
      ...input,
      carried: {
        state: state as 'ready' | 'suspended',
        handle: handle!,
        computeSeq,
        storageSeq,
        deadlineRemainingMs,
        periodStartMs,
      },
    });

  // --- the live loop: ready <-> suspended ------------------------------------------------------
  let nextIdleCheckMs = Date.now() + policy.idleTimeoutMs;
  // Ready/suspended periods begun in this run: history grows with each, so long-lived
  // sandboxes continue as new when Temporal suggests it (or after a fixed count, for tests).
  let periods = 0;
  const shouldCarry = () =>
    workflowInfo().continueAsNewSuggested || (input.continueAsNewAfterPeriods !== undefined && periods >= input.continueAsNewAfterPeriods);
  for (;;) {
    if (state === 'ready') {
      wakeRequested = false;
      const deadlineAtMs = periodStartMs + deadlineRemainingMs;
      const wakeAt = Math.min(deadlineAtMs, capAtMs, nextIdleCheckMs);
      await condition(() => terminateRequest !== undefined || exit !== undefined || shouldCarry(), Math.max(1, wakeAt - Date.now()));
      const now = Date.now();
      let reason: EndReason | undefined;
      let endedAtMs = now;
      if (exit) {
        reason = exit.reason;
        endedAtMs = Math.min(now, exit.observedAtMs);
      } else if (terminateRequest) {
        reason = terminateRequest;
      } else if (now >= capAtMs) {
        reason = 'absolute_cap';
      } else if (now >= deadlineAtMs) {
        reason = 'deadline';
      }
      if (reason) {
        endReason = reason;
        deadlineRemainingMs = Math.max(0, deadlineRemainingMs - (now - periodStartMs));
        enter('terminating', `${reason}${exit?.detail ? `: ${exit.detail}` : ''}`);
        await record({
          status: 'terminating',
          fields: { endReason: reason, deadlineAtMs: null },
          close: { kind: 'compute', seq: computeSeq, endedAtMs, reason },
          audit: { event: exit ? 'abnormal_exit' : 'terminate', detail: { reason, ...(exit?.detail ? { detail: exit.detail } : {}) } },
        });
        break;
      }
      if (shouldCarry()) {
        await condition(allHandlersFinished);
        return carry();
      }
      if (now < nextIdleCheckMs) continue;

      // Idle check: the ledger decides, atomically against concurrent calls.
      const claim = await ledger.claimIdleSandbox({ sandboxId, idleMs: policy.idleTimeoutMs });
      if (!claim.claimed) {
        nextIdleCheckMs = Date.now() + Math.max(50, policy.idleTimeoutMs - claim.idleForMs);
        continue;
      }
      enter('suspending', `idle for ${Math.round(policy.idleTimeoutMs / 1000)} s: storing a snapshot`);
      try {
        const stored = await lifecycle.suspendSandbox({ sandboxId, handle: handle!, policy });
        const at = Date.now();
        deadlineRemainingMs = Math.max(0, deadlineRemainingMs - (at - periodStartMs));
        periodStartMs = at;
        storageSeq += 1;
        await record({
          status: 'suspended',
          fields: { suspendedAtMs: at, snapshotRef: stored.snapshotRef, deadlineAtMs: null, deadlineRemainingMs },
          close: { kind: 'compute', seq: computeSeq, endedAtMs: at, reason: 'idle_offload' },
          open: { kind: 'snapshot_storage', seq: storageSeq, startedAtMs: at },
        });
        enter('suspended', `snapshot \`${stored.snapshotRef}\` (${stored.durationMs} ms); compute released`);
        periods += 1;
      } catch (e) {
        // A failed suspend returns to ready: the session continues, the idle clock restarts.
        log.warn('suspend failed; the sandbox stays ready', { sandboxId, error: errorMessage(e) });
        await record({ status: 'ready', fields: { touch: true }, audit: { event: 'suspend_failed', detail: { error: errorMessage(e) } } });
        enter('ready', `suspend failed (${errorMessage(e)}); staying ready`);
        nextIdleCheckMs = Date.now() + policy.idleTimeoutMs;
      }
      continue;
    }

    // state === 'suspended': the deadline clock is paused; only DELETE, the cap or a wake move it.
    await condition(() => terminateRequest !== undefined || wakeRequested || shouldCarry(), Math.max(1, capAtMs - Date.now()));
    const now = Date.now();
    if (terminateRequest || now >= capAtMs) {
      const reason: EndReason = terminateRequest ?? 'absolute_cap';
      endReason = reason;
      enter('terminating', `${reason} while suspended`);
      await record({
        status: 'terminating',
        fields: { endReason: reason },
        close: { kind: 'snapshot_storage', seq: storageSeq, endedAtMs: now, reason },
        audit: { event: 'terminate', detail: { reason, whileSuspended: true } },
      });
      break;
    }
    if (!wakeRequested) {
      await condition(allHandlersFinished);
      return carry();
    }
    enter('restoring', 'woken by activity: restoring the snapshot');
    await record({ status: 'restoring' });
    try {
      const restoring = proxyActivities<SandboxServiceActivities>({
        scheduleToCloseTimeout: policy.provisioningTimeoutMs,
        heartbeatTimeout: '30 seconds',
        retry: { initialInterval: '500 milliseconds', backoffCoefficient: 2, maximumInterval: '10 seconds', nonRetryableErrorTypes: ['configuration_error'] },
      });
      const restored = await restoring.restoreSandbox({ sandboxId, handle: handle!, policy });
      const at = Date.now();
      periodStartMs = at;
      computeSeq += 1;
      await record({
        status: 'ready',
        fields: { deadlineAtMs: at + deadlineRemainingMs, deadlineRemainingMs: null, suspendedAtMs: null, snapshotRef: null, touch: true },
        close: { kind: 'snapshot_storage', seq: storageSeq, endedAtMs: at, reason: 'restored' },
        open: { kind: 'compute', seq: computeSeq, startedAtMs: at },
      });
      if (input.grants.length > 0) await ledger.capSandboxGrants({ sandboxId, notAfterMs: at + deadlineRemainingMs });
      nextIdleCheckMs = at + policy.idleTimeoutMs;
      enter('ready', `restored in ${restored.durationMs} ms`);
      periods += 1;
    } catch (e) {
      endReason = 'restore_failed';
      error = errorMessage(e);
      const at = Date.now();
      await CancellationScope.nonCancellable(async () => {
        await record({
          status: 'failed',
          fields: { endReason, error, terminatedAtMs: at },
          close: { kind: 'snapshot_storage', seq: storageSeq, endedAtMs: at, reason: 'restore_failed' },
        });
        await teardown.destroyServiceSandbox({ sandboxId, accountId, policy, handle }).catch(() => undefined);
      });
      enter('failed', `restore failed: ${error}`);
      return finish('failed');
    }
  }

  // --- terminating -> terminated ----------------------------------------------------------------
  await CancellationScope.nonCancellable(async () => {
    await teardown.destroyServiceSandbox({ sandboxId, accountId, policy, handle });
    await record({ status: 'terminated', fields: { terminatedAtMs: Date.now() } });
  });
  enter('terminated', `${endReason}: resources released`);
  return finish('terminated');
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
