/**
 * A baseline's list is frozen once a run may have recorded it (workflows/patches.ts, ADR 0038): a
 * run that recorded the baseline replays by this list, so growing or shrinking it would change
 * the path of runs already in history. A new patch goes on its own, or into a new baseline.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { OBJECTIVE_BASELINE, STREAM_BASELINE } from '../workflows/patches';

describe('patch baselines', () => {
  it('are the lists they were when first recorded', () => {
    expect(OBJECTIVE_BASELINE).toEqual({
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
    });
    expect(STREAM_BASELINE).toEqual({
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
    });
  });

  it('cover only patch ids their workflow asks (a misspelt id would be asked on its own)', () => {
    const source = (files: string[]) => files.map((f) => readFileSync(path.join(__dirname, '..', f), 'utf8')).join('\n');
    const objective = source(['workflows/objective.ts']);
    const stream = source(['workflows/stream.ts', 'workflows/sandbox.ts', 'core/sandbox-probe.ts']);
    for (const id of OBJECTIVE_BASELINE.covers) expect(objective).toContain(`'${id}'`);
    for (const id of STREAM_BASELINE.covers) expect(stream).toContain(`'${id}'`);
  });
});
