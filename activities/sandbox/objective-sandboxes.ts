/**
 * The sandbox activities of objectives (stream sandboxes and the merger), with the objective's
 * `sandbox:` options: confinement recorded with the sandbox, ignored files, project setup with
 * heartbeats, the warm pool. Failures become typed `sandbox_failure`s; ones a retry cannot fix
 * (setup that keeps failing, bubblewrap missing) are not retried by Temporal.
 */
import { withHeartbeat } from '../heartbeat';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { MERGER_SANDBOX_NAME } from '../../core/ids';
import type { SandboxInfo, SandboxInput, SandboxOptions } from '../../core/types';
import { failure } from '../failures';
import { tail } from '../process';
import { redact, redactorFor } from '../redact';
import { BubblewrapMissingError } from './bubblewrap';
import { createFieldsOf } from './options';
import type { SandboxCreateRequest, SandboxHandle, SandboxProvider } from './provider';
import { registerObjective, type TemporalHome } from './registry';
import { SandboxCancelledError, SandboxSetupError } from './setup';

/** Heartbeats (with the latest progress line) while `work` runs; works outside activities too. */
const heartbeating = <T>(work: (signal: AbortSignal | undefined, progress: (line: string) => void) => Promise<T>): Promise<T> =>
  withHeartbeat((signal, beat) => work(signal, (line) => beat({ progress: line.slice(0, 200) })));

/** A create failure as a typed Temporal failure. */
export function sandboxFailure(e: unknown, what: string, redactor: (text: string) => string = redact): Error {
  if (e instanceof ApplicationFailure) return e;
  if (e instanceof SandboxCancelledError) return e;
  if (e instanceof SandboxSetupError) {
    return ApplicationFailure.create({
      type: 'sandbox_failure',
      message: redactor(`${what}: ${tail(e.message, 5_000)}`),
      nonRetryable: true, // it already ran setup `attempts` times
      details: [{ attempts: e.attempts }],
    });
  }
  if (e instanceof BubblewrapMissingError) {
    return ApplicationFailure.create({ type: 'sandbox_failure', message: `${what}: ${e.message}`, nonRetryable: true });
  }
  return failure('sandbox_failure', `${what}: ${(e as Error).message}`);
}

async function createWithOptions(sandboxes: SandboxProvider, request: SandboxCreateRequest, options: SandboxOptions | undefined, overrides: Partial<SandboxCreateRequest> = {}): Promise<SandboxHandle> {
  return heartbeating((signal, progress) => sandboxes.create({ ...request, ...createFieldsOf(options), ...overrides, signal, onProgress: progress }));
}

/** A merger where only git runs: no ignored files, no project setup, no warm pool of its kind. */
const BARE_MERGER: Partial<SandboxCreateRequest> = { copyIgnored: false, setup: undefined, warmPool: 0 };

export async function createStreamSandbox(sandboxes: SandboxProvider, input: SandboxInput): Promise<SandboxInfo> {
  let handle: SandboxHandle;
  try {
    handle = await createWithOptions(
      sandboxes,
      { sandboxId: input.sandboxId, repository: input.repository, group: input.objectiveId, name: input.name, branch: input.branch, base: input.base },
      input.options,
    );
  } catch (e) {
    throw sandboxFailure(e, `could not create sandbox ${input.sandboxId}`, await redactorFor(input.repository).catch(() => redact));
  }
  return {
    sandboxId: handle.sandboxId,
    provider: handle.provider === 'podman' || handle.provider === 'docker' || handle.provider === 'daytona' || handle.provider === 'kubernetes' ? handle.provider : 'local',
    path: handle.root,
    branch: handle.branch,
    baseCommit: handle.baseCommit,
    headCommit: handle.headCommit,
  };
}

/** Records the objective in the registry the janitor sweeps (with its merger, or where it would be). */
export async function registerMergerObjective(input: { objectiveId: string; repository: string; baseCommit: string; temporal?: TemporalHome }): Promise<void> {
  try {
    await registerObjective(input.repository, input.objectiveId, input.baseCommit, undefined, input.temporal);
  } catch (e) {
    // The janitor then misses this objective's leftovers; the run itself is fine.
    Context.current().log.warn('could not record the objective in the repository registry', { error: (e as Error).message });
  }
}

/**
 * The objective's merger worktree (post-merge gates and the planner run there, under the same
 * confinement). Also records the objective in the registry the janitor sweeps.
 */
export async function createMergerSandbox(
  sandboxes: SandboxProvider,
  input: { objectiveId: string; repository: string; baseCommit: string; branch: string; sandbox?: SandboxOptions; temporal?: TemporalHome; bare?: boolean },
): Promise<SandboxHandle> {
  await registerMergerObjective(input);
  let handle: SandboxHandle;
  try {
    handle = await createWithOptions(
      sandboxes,
      {
        sandboxId: `${input.objectiveId}.${MERGER_SANDBOX_NAME}`,
        repository: input.repository,
        group: input.objectiveId,
        name: MERGER_SANDBOX_NAME,
        branch: input.branch,
        base: input.baseCommit,
      },
      // The merger works in the user's repository (merges, the planner): always a local worktree,
      // never from a pool of worktrees when the objective's pool is of another provider's sandboxes.
      input.sandbox?.provider && input.sandbox.provider !== 'local' ? { ...input.sandbox, provider: 'local', warmPool: 0 } : input.sandbox,
      input.bare ? BARE_MERGER : {},
    );
  } catch (e) {
    throw sandboxFailure(e, `could not create the merger sandbox of ${input.objectiveId}`, await redactorFor(input.repository).catch(() => redact));
  }
  // With `warm_pool`, the create above also started filling the pool in the background.
  return handle;
}
