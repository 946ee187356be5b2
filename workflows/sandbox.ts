/**
 * Sandbox workflow: owns one sandbox's lifecycle.
 * pending -> ready -> terminating -> terminated, or failed when provisioning fails.
 * Streams started since ADR 0032 own their sandbox themselves (workflows/stream.ts); this workflow
 * serves the runs started before, to their end, and replays their histories.
 */
import {
  CancellationScope,
  TemporalFailure,
  allHandlersFinished,
  condition,
  continueAsNew,
  defineQuery,
  defineSignal,
  getExternalWorkflowHandle,
  isCancellation,
  patched,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
  log,
} from '@temporalio/workflow';
import { SlipwayKind, SlipwayObjective, SlipwaySandboxState } from '../core/search-attributes';
import type { SandboxState } from '../core/states';
import type { SandboxInfo, SandboxInput, SandboxResult } from '../core/types';
import { DEFAULT_SANDBOX_PROBE_SECONDS, SANDBOX_HISTORY_LIMIT, SANDBOX_PROBE_PATCH, afterProbe, type ProbeOutcome } from '../core/sandbox-probe';
import { gitActivities, ownerRoute, type RetrySpec } from './activity-options';
import { failureMessage } from './failure-info';
import { onOwner, ownerGoneOf } from './owner';

/** Activities on a sandbox run on the worker that owns it (docs/adr/0013-worker-ownership.md). */
export const OWNER_ROUTING = 'sandbox-owner-routing';

/** Sent by the sandbox to its owner once it is ready. */
export const sandboxReadySignal = defineSignal<[SandboxInfo]>('sandboxReady');
/** Sent by the owner when it no longer needs the sandbox. */
export const releaseSandboxSignal = defineSignal<[]>('releaseSandbox');
/**
 * Sent by the sandbox to its owner when it ended (`notifyOwnerOnEnd`): an owner that continues
 * as new no longer holds the child handle of the run that started it, so it learns of the end here.
 */
export const sandboxEndedSignal = defineSignal<[SandboxResult]>('sandboxEnded');
/**
 * A no-op the sandbox sends its owner now and then when the owner may have abandoned it (an
 * owner that continues as new): signalling a workflow that ended fails, so a terminated owner
 * is noticed and the sandbox releases itself.
 */
export const ownerProbeSignal = defineSignal<[]>('sandboxOwnerProbe');
/** How often a sandbox with `notifyOwnerOnEnd` checks that its owner still runs (`ownerProbeMs` overrides, for tests). */
export const OWNER_PROBE_MS = 60 * 60_000;
export const sandboxStateQuery = defineQuery<{ state: SandboxState; info?: SandboxInfo; error?: string }>('sandboxState');

export async function sandboxWorkflow(input: SandboxInput): Promise<SandboxResult> {
  const acts = gitActivities();
  let state: SandboxState = 'pending';
  let info: SandboxInfo | undefined;
  let error: string | undefined;
  let released = false;

  const enter = (next: SandboxState, details: string) => {
    state = next;
    upsertSearchAttributes([{ key: SlipwaySandboxState, value: next }]);
    setCurrentDetails(`**${next}** — ${details}`);
  };
  upsertSearchAttributes([
    { key: SlipwayKind, value: 'stream-sandbox' },
    { key: SlipwayObjective, value: input.objectiveId },
  ]);
  setHandler(sandboxStateQuery, () => ({ state, info, error }));
  setHandler(releaseSandboxSignal, () => {
    released = true;
  });
  if (!input.carried) enter('pending', `creating ${input.provider} sandbox on branch \`${input.branch}\``);

  /** Tells an owner that asked for it; best effort: the owner may be gone. */
  const ended = async (ending: SandboxResult): Promise<SandboxResult> => {
    const result = info?.owner !== undefined ? { ...ending, workflowId: workflowInfo().workflowId } : ending;
    if (input.notifyOwnerOnEnd) {
      await CancellationScope.nonCancellable(() => getExternalWorkflowHandle(input.ownerWorkflowId).signal(sandboxEndedSignal, result)).catch(() => undefined);
    }
    return result;
  };

  if (input.carried) info = input.carried.info;
  else {
    try {
      info = await acts.createSandbox(input);
    } catch (e) {
      // Activity failures and cancellation end the sandbox as failed; a bug fails the workflow task.
      if (!(e instanceof TemporalFailure)) throw e;
      error = failureMessage(e);
      enter('failed', `provisioning failed: ${error}`);
      log.warn('sandbox provisioning failed', { sandboxId: input.sandboxId, error });
      return ended({ sandboxId: input.sandboxId, state: 'failed', error });
    }
  }
  enter('ready', `\`${info.path}\` on branch \`${info.branch}\``);
  // The worker that holds the sandbox runs every activity on it (docs/adr/0013).
  const owned = () => info!.owner !== undefined && patched(OWNER_ROUTING);
  const onSandbox = (retry?: RetrySpec) => (owned() ? gitActivities(retry, ownerRoute(info!.owner, { graceSeconds: input.ownerGraceSeconds })) : retry ? gitActivities(retry) : acts);
  /** Set when a probe found the sandbox dead outside Slipway: the workflow ends as failed with it. */
  let died: string | undefined;

  try {
    // An owner that is gone (or cancelled) by now never releases the sandbox: it is cleaned up at once.
    if (!input.carried) await getExternalWorkflowHandle(input.ownerWorkflowId).signal(sandboxReadySignal, info);
    if (input.carried || patched(SANDBOX_PROBE_PATCH)) {
      died = await watch();
    } else if (input.notifyOwnerOnEnd) {
      // An hourly probe: a few events per hour, and a terminated owner's worktree does not linger.
      while (!(await condition(() => released, input.ownerProbeMs ?? OWNER_PROBE_MS))) {
        if (!(await ownerAlive())) break;
      }
    } else await condition(() => released);
  } catch (e) {
    if (!(e instanceof TemporalFailure)) throw e;
    if (!isCancellation(e)) log.warn('the owner of the sandbox is gone; releasing it now', { sandboxId: input.sandboxId, error: failureMessage(e) });
  }
  // Cleanup must run even when the owner was cancelled.
  await CancellationScope.nonCancellable(async () => {
    enter('terminating', 'removing the worktree');
    // The worker that holds the sandbox removes it (docs/adr/0013); one gone longer than the grace time cannot.
    // A sandbox that died outside Slipway is removed too: its records go, and the provider forgets it.
    await onOwner(owned() ? info!.owner : undefined, () => onSandbox().destroySandbox({ repository: input.repository, path: info!.path })).catch((e) => {
      if (ownerGoneOf(e) === undefined) throw e;
      log.warn('the owner of the sandbox is gone; its worktree stays on its host for the janitor', { sandboxId: input.sandboxId, owner: info!.owner });
    });
  });
  if (died !== undefined) {
    error = died;
    enter('failed', `died outside Slipway: ${died}`);
    return ended({ sandboxId: input.sandboxId, state: 'failed', error: died });
  }
  enter('terminated', 'worktree removed; the branch is kept');
  return ended({ sandboxId: input.sandboxId, state: 'terminated' });

  /** False when signalling the owner fails: it ended without releasing the sandbox. */
  async function ownerAlive(): Promise<boolean> {
    const alive = await getExternalWorkflowHandle(input.ownerWorkflowId)
      .signal(ownerProbeSignal)
      .then(
        () => true,
        () => false,
      );
    if (!alive) log.warn('the owner of the sandbox ended without releasing it; releasing it now', { sandboxId: input.sandboxId, owner: input.ownerWorkflowId });
    return alive;
  }

  /**
   * Until released: every `probe_seconds` one probe activity asks the provider whether the
   * sandbox is still there (core/sandbox-probe.ts decides), and, with `notifyOwnerOnEnd`, the
   * owner is probed as before. Returns why the sandbox died, or undefined once released (or the
   * owner is gone). Continues as new before the history grows long.
   */
  async function watch(): Promise<string | undefined> {
    const probeMs = (input.options?.probeSeconds ?? DEFAULT_SANDBOX_PROBE_SECONDS) * 1000;
    const ownerProbeMs = input.ownerProbeMs ?? OWNER_PROBE_MS;
    let ownerProbeDue = input.carried?.ownerProbeDueMs ?? Date.now() + ownerProbeMs;
    // Two attempts at most: a probe that cannot ask says nothing, and the next one comes soon.
    const prober = onSandbox({ maximumAttempts: 2 });
    let probeDue = Date.now() + probeMs;
    for (;;) {
      const due = input.notifyOwnerOnEnd ? Math.min(probeDue, ownerProbeDue) : probeDue;
      if (await condition(() => released, Math.max(1, due - Date.now()))) return undefined;
      if (input.notifyOwnerOnEnd && Date.now() >= ownerProbeDue) {
        if (!(await ownerAlive())) return undefined;
        ownerProbeDue = Date.now() + ownerProbeMs;
      }
      if (Date.now() >= probeDue) {
        probeDue = Date.now() + probeMs;
        const outcome: ProbeOutcome = await prober.probeSandbox({ path: info!.path }).catch((e: unknown) => {
          if (!(e instanceof TemporalFailure) || isCancellation(e)) throw e;
          return { failed: failureMessage(e) };
        });
        // Released while the probe ran: the owner is done with it; a death now changes nothing.
        if (released) return undefined;
        const next = afterProbe(outcome);
        if (next.action === 'end') {
          log.warn('the sandbox died outside Slipway', { sandboxId: input.sandboxId, error: next.error });
          return next.error;
        }
      }
      const history = workflowInfo();
      if (history.continueAsNewSuggested || history.historyLength > (input.historyLimit ?? SANDBOX_HISTORY_LIMIT)) {
        await condition(allHandlersFinished);
        if (released) return undefined;
        return continueAsNew<typeof sandboxWorkflow>({ ...input, carried: { info: info!, ownerProbeDueMs: ownerProbeDue } });
      }
    }
  }
}
