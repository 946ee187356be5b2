/**
 * Continue-as-new of the service sandbox workflow never drops a terminate request or a wake that
 * arrives while it switches runs (issue 10). The race is made deterministic, not timed: the
 * workflow task that ends with the switch is held open by the billing database write just before it (its
 * row locked by the test), the request is sent while it waits, then the lock is released.
 * Real Temporal, real Postgres, real sandboxes.
 */
import { temporal } from '@temporalio/proto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defaultProviderFor, type ProviderFor } from '../../activities/service/providers';
import { getProfileByName, insertSandboxWithinLimit, newSandboxId, policyFromProfile } from '../../activities/billing/records';
import { serviceSandboxWorkflowId } from '../../core/sandbox-service';
import { serviceSandboxWorkflow, terminateSandboxSignal, wakeSandboxUpdate } from '../../workflows/service-sandbox';
import { startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

/** A gate the test opens: resolves `opened` and lets `wait` through. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((r) => (open = r));
  return { open, wait: () => opened };
}

/** Suspends wait until the test says so, and announce that they started. */
let suspendStarted = gate();
let suspendMayEnd = gate();
function gatedSuspends(inner: ProviderFor): ProviderFor {
  return (policy) => {
    const provider = inner(policy);
    return new Proxy(provider, {
      get(target, prop, receiver) {
        if (prop === 'suspend' && target.suspend) {
          return async (...args: Parameters<NonNullable<typeof target.suspend>>) => {
            suspendStarted.open();
            await suspendMayEnd.wait();
            return target.suspend!(...args);
          };
        }
        const value = Reflect.get(target, prop, receiver);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
  };
}

let h: ServiceHarness;
beforeAll(async () => {
  h = await startServiceHarness({ providerFor: gatedSuspends(defaultProviderFor()) });
});
afterAll(async () => {
  await h?.stop();
});

/** A sandbox whose workflow continues as new after its first period (its first suspension). */
async function sandboxThatCarriesAfterSuspending(a: TestAccount): Promise<string> {
  await a.profile({ name: 'carry', idleTimeoutSeconds: 1 });
  const profile = (await getProfileByName(h.database.db, a.id, 'carry'))!;
  const policy = policyFromProfile(profile);
  const id = newSandboxId();
  const createdAtMs = Date.now();
  const deadlineMs = 10 * 60_000;
  await insertSandboxWithinLimit(h.database.db, { id, accountId: a.id, profileId: profile.id, platform: 'linux', provider: 'local', grants: [], createdAtMs, deadlineAtMs: createdAtMs + deadlineMs, capAtMs: createdAtMs + policy.absoluteCapMs });
  await h.host.client.workflow.start(serviceSandboxWorkflow, {
    workflowId: serviceSandboxWorkflowId(id),
    taskQueue: h.host.serviceTaskQueue,
    args: [{ sandboxId: id, accountId: a.id, policy, deadlineMs, createdAtMs, grants: [], continueAsNewAfterPeriods: 1 }],
  });
  await a.api.get(id, 30);
  return id;
}

/**
 * Runs `during` while the workflow task that ends with the switch is held open: the suspension
 * is let through with the sandbox's row locked, so the billing database write of `suspended` (a local
 * activity, right before the switch) waits on the lock; once it visibly waits, `during` sends
 * its request, then the lock goes.
 */
async function atTheSwitch(id: string, during: () => Promise<void>): Promise<void> {
  suspendStarted = gate();
  suspendMayEnd = gate();
  await suspendStarted.wait();
  const released = gate();
  const locked = gate();
  const holding = h.database.db.transaction(async (tx) => {
    await tx.query('SELECT 1 FROM sandboxes WHERE id = $1 FOR UPDATE', [id]);
    locked.open();
    await released.wait();
  });
  await locked.wait();
  suspendMayEnd.open();
  // The billing database write waits on the lock: the switch's workflow task is in flight.
  for (;;) {
    const { rows } = await h.database.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE sandboxes SET%'`);
    if (rows[0]!.n > 0) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  try {
    await during();
  } finally {
    released.open();
    await holding;
  }
}

describe('continue-as-new with a request in flight', () => {
  it('a terminate request sent at the switch ends the sandbox (explicit_delete), billing closed', async () => {
    const a = await h.account();
    const id = await sandboxThatCarriesAfterSuspending(a);
    const handle = h.host.client.workflow.getHandle(serviceSandboxWorkflowId(id));
    await atTheSwitch(id, () => handle.signal(terminateSandboxSignal, { reason: 'explicit_delete' }));
    const done = await h.waitFor(a.api, id, ['terminated'], 60_000);
    // The request really came at the switch: the server refused the workflow task that ended
    // with it (UNHANDLED_COMMAND: a signal came in meanwhile) and the run took the request instead.
    const events = (await handle.fetchHistory()).events ?? [];
    const refused = events.findIndex((e) => e.workflowTaskFailedEventAttributes?.cause === temporal.api.enums.v1.WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND);
    expect(refused).toBeGreaterThan(0);
    expect(events[refused + 1]?.workflowExecutionSignaledEventAttributes?.signalName).toBe('terminateSandbox');
    expect(events.some((e) => e.workflowExecutionContinuedAsNewEventAttributes)).toBe(false);
    expect(done.end_reason).toBe('explicit_delete');
    expect((await h.sessions(id)).map((s) => [s.kind, s.seq, s.end_reason])).toEqual([
      ['compute', 1, 'idle_offload'],
      ['snapshot_storage', 1, 'explicit_delete'],
    ]);
  });

  it('a wake sent at the switch restores the sandbox: the update answers ready', async () => {
    const a = await h.account();
    const id = await sandboxThatCarriesAfterSuspending(a);
    const handle = h.host.client.workflow.getHandle(serviceSandboxWorkflowId(id));
    const updateId = `wake-${id}`;
    let woke: Promise<string> | undefined;
    await atTheSwitch(id, async () => {
      woke = handle.executeUpdate(wakeSandboxUpdate, { updateId });
      // Wait until the server admitted it (it cannot be delivered while the workflow task is open);
      // until the request arrives the server does not know the id.
      for (;;) {
        const admitted = await h.host.client.workflowService
          .pollWorkflowExecutionUpdate({
            namespace: h.host.client.options.namespace,
            updateRef: { workflowExecution: { workflowId: serviceSandboxWorkflowId(id) }, updateId },
            waitPolicy: { lifecycleStage: temporal.api.enums.v1.UpdateWorkflowExecutionLifecycleStage.UPDATE_WORKFLOW_EXECUTION_LIFECYCLE_STAGE_ADMITTED },
          })
          .then(
            () => true,
            (e: { code?: number }) => {
              if (e.code !== 5) throw e; // NOT_FOUND: not arrived yet
              return false;
            },
          );
        if (admitted) break;
        await new Promise((r) => setTimeout(r, 20));
      }
    });
    expect(await woke).toBe('ready');
    expect((await a.api.get(id)).status).toBe('ready');
    await a.api.destroy(id);
    await h.waitFor(a.api, id, ['terminated']);
  });
});
