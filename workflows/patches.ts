/**
 * One patch marker per run instead of one per patch (docs/adr/0038). A `patched()` that returns
 * true records a marker and upserts the `TemporalChangeVersion` search attribute the first time a
 * run passes it: two history events and a visibility write each, fourteen per stream and as many
 * per objective with the patches of 0.1.0-0.2.x. A run that starts on code with a baseline records
 * only the baseline, in its first workflow task, and takes the new side of every patch the baseline
 * covers without asking; a run started before (its first workflow task has no baseline marker)
 * asks each patch as it always did, so its replay and its continuation stay what they were.
 *
 * A baseline's list is frozen once any run may have recorded it: a patch added later is asked on
 * its own (`patched`) until the next baseline, which lists everything before it under a new id.
 *
 * Bundled into workflow code: `@temporalio/workflow` only.
 */
import { patched } from '@temporalio/workflow';

/** Answers `patched(id)` for the run; call it first in the workflow function (before any command). */
export type Patches = (patchId: string) => boolean;

export function patchesOf(baseline: { id: string; covers: readonly string[] }): Patches {
  const current = patched(baseline.id);
  const covered = new Set(baseline.covers);
  return (patchId) => (current && covered.has(patchId)) || patched(patchId);
}

/** The objective workflow's patches through 2026-11-29 (frozen). */
export const OBJECTIVE_BASELINE = {
  id: 'objective-baseline-2026-11-29',
  covers: [
    'dispatch-from-merge-commit',
    'objective-children-abandoned',
    'parallel-stream-starts',
    'objective-cost-attribute',
    'merger-owner-routing',
    'lazy-merger',
    'remote-repository-on-owner',
    'one-activity-merge',
    'batch-merge',
    'merger-without-worktree',
    'prepare-objective-local',
    'finish-without-activity',
    'objective-budget-leases',
  ],
} as const;

/** The stream workflow's patches through 2026-11-29 (frozen). */
export const STREAM_BASELINE = {
  id: 'stream-baseline-2026-11-29',
  covers: [
    'stream-continue-as-new',
    'batched-stream-events',
    'merge-request-in-events',
    'feed-timer-cancelled',
    'stream-sandbox-workflow-id',
    'commit-in-step',
    'stream-owns-sandbox',
    'cleanup-with-final-event',
    'sandbox-owner-routing',
    'sandbox-probe',
  ],
} as const;
