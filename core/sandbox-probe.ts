/**
 * The stream sandbox's liveness probe (issue 14): while a stream's sandbox lives, its workflow
 * asks the provider now and then whether the sandbox is still there (SandboxProvider.probe), and
 * the stream asks once after a failed step. A sandbox stopped, archived or deleted outside
 * Slipway ends as `failed` with the reason, and the stream recreates it from its branch's last
 * commit. Pure: the workflows call these with what they saw.
 */
import { MAX_SANDBOX_REPLACEMENTS } from './routing';

/** The patch that adds the probe's commands to the sandbox and stream workflows (released histories replay without them). */
export const SANDBOX_PROBE_PATCH = 'sandbox-probe';
/** Default seconds between two probes of a stream's sandbox (`sandbox.probe_seconds`). */
export const DEFAULT_SANDBOX_PROBE_SECONDS = 30;
/** A sandbox workflow continues as new past this many history events (a probe costs about 11). */
export const SANDBOX_HISTORY_LIMIT = 4_000;

/** The longest pause between two probes of a sandbox whose stream waits (a human's guidance may take days). */
export const IDLE_PROBE_MAX_MS = 60 * 60_000;

/**
 * How long a stream that owns its sandbox waits before its next probe while it is idle (merge
 * queue, guidance, rate limit; ADR 0032): probe_seconds first, then twice as long after each
 * probe that found it alive, at most IDLE_PROBE_MAX_MS, so a long wait adds a bounded history
 * (the stream cannot continue as new in the middle of a wait, as the sandbox workflow did).
 */
export function idleProbeDelayMs(probeMs: number, probesSoFar: number): number {
  // A probe_seconds above the cap is taken as given.
  return Math.min(Math.max(IDLE_PROBE_MAX_MS, probeMs), probeMs * 2 ** Math.min(probesSoFar, 20));
}

/** What a probe answered: the provider's liveness, or the probe itself failed (an outage, a rate limit). */
export type ProbeOutcome = { alive: true } | { alive: false; reason: string; detail: string } | { failed: string };

/**
 * The sandbox workflow's answer to a probe: a dead sandbox ends with the reason; a probe that
 * could not ask (the provider down, the owner unreachable) says nothing about the sandbox, so
 * the workflow keeps watching (the stream's own calls find a real outage).
 */
export function afterProbe(outcome: ProbeOutcome): { action: 'keep_watching' } | { action: 'end'; error: string } {
  if ('failed' in outcome || outcome.alive) return { action: 'keep_watching' };
  return { action: 'end', error: deathMessage(outcome) };
}

/** The error a dead sandbox's workflow ends with: the reason first, so it reads as one in the ledger. */
export function deathMessage(dead: { reason: string; detail: string }): string {
  return `${dead.reason}: ${dead.detail}`;
}

/**
 * What a stream does about its sandbox before or after a step: recreate it from the branch when
 * its owner is gone or the sandbox died outside Slipway (at most MAX_SANDBOX_REPLACEMENTS times),
 * else leave the outcome to the blueprint's recovery.
 */
export function sandboxAction(input: {
  /** The worker holding the sandbox was found gone (ADR 0013). */
  ownerGone?: string;
  /** The sandbox died outside Slipway: its workflow ended with this error, or the stream's probe saw it. */
  died?: string;
  replacementsSoFar: number;
}): { action: 'keep' } | { action: 'recreate'; why: 'owner_gone' | 'died'; summary: string } | { action: 'give_up'; summary: string } {
  const summary = input.died !== undefined ? `the sandbox died outside Slipway (${input.died})` : input.ownerGone !== undefined ? `the worker "${input.ownerGone}" holding the sandbox is gone` : undefined;
  if (summary === undefined) return { action: 'keep' };
  if (input.replacementsSoFar >= MAX_SANDBOX_REPLACEMENTS) return { action: 'give_up', summary };
  return { action: 'recreate', why: input.died !== undefined ? 'died' : 'owner_gone', summary };
}
