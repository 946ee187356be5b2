/**
 * When an objective run continues as new, and what it hands over, pure.
 *
 * An objective's history grows with its streams' merges (each one a handful of events and
 * workflow tasks), and at the caps (64 streams, 50 fix iterations each going through the merge
 * queue) it could pass 80,000 events, over Temporal's 51,200 limit
 * (docs/adr/0009-bounded-objective-history.md). So the merge queue continues as new once a run
 * holds `DEFAULT_CONTINUE_AS_NEW_AFTER` events, at a point where nothing is in flight: no
 * merge, and every running stream started with `ParentClosePolicy.ABANDON` (a stream started
 * by an older deploy would be terminated with the run).
 *
 * Bundled into workflow code: types and pure helpers only.
 */
import { FINAL_STREAM_PHASES, type StreamPhase } from '../core/states';
import type { ObjectiveCarry } from '../core/types';

/** Events after which a run continues as new: far below the 51,200 limit and the 10,240 warning. */
export const DEFAULT_CONTINUE_AS_NEW_AFTER = 8_000;

/** Feed lines and ledger-like lists carried over: the watch cursor continues, old lines stay in the runs' histories. */
export const CARRIED_FEED_LINES = 200;
/** Agent-run records carried over (usage totals are per stream and kept whole). */
export const CARRIED_AGENT_RUNS = 500;
/** Ledger entries carried over; older ones stay in the earlier runs' histories and the streams' own. */
export const CARRIED_LEDGER_ENTRIES = 1_000;

export function shouldContinueAsNew(s: {
  historyLength: number;
  /** The server's own hint (history size or length near its limits). */
  suggested: boolean;
  limit: number | undefined;
  /** Running streams that would not survive the run's end. */
  runningNotAbandoned: number;
}): boolean {
  if (s.runningNotAbandoned > 0) return false;
  return s.suggested || s.historyLength >= (s.limit ?? DEFAULT_CONTINUE_AS_NEW_AFTER);
}

/** The carry, trimmed so the next run's input stays small whatever the objective did so far. */
export function trimCarry(carry: ObjectiveCarry): ObjectiveCarry {
  const { status, feed } = carry;
  return {
    ...carry,
    status: {
      ...status,
      ledger: status.ledger.slice(-CARRIED_LEDGER_ENTRIES),
      agentRuns: status.agentRuns?.slice(-CARRIED_AGENT_RUNS),
    },
    feed: { seq: feed.seq, events: feed.events.slice(-CARRIED_FEED_LINES) },
  };
}

/**
 * The streams a resumed run waits for before its result: those in a final phase, whose end it
 * heard through their final event while their cleanup may still run (docs/adr/0037, decision 3).
 * One still running (the objective failed) is not waited for: it runs on.
 */
export function streamsToAwaitAtEnd(streams: ReadonlyArray<{ id: string; phase: StreamPhase }>): string[] {
  return streams.filter((s) => FINAL_STREAM_PHASES.includes(s.phase)).map((s) => s.id);
}
