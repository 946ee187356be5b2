/**
 * The objective's feed (what `slipway watch` and `run --follow` print) and what streams tell
 * their objective, pure.
 *
 * Streams do not signal every line: each signal is an event and a workflow task in the
 * objective's history. A stream buffers its events and sends them as one batch (the
 * `streamEvents` signal) when something the objective acts on happens (`flushNow`), or once a
 * line has waited `FEED_FLUSH_DELAY_MS`, so `watch` stays live within that delay while a
 * stream with fast steps costs its objective a few signals instead of one per line.
 *
 * Bundled into workflow code: types and pure helpers only.
 */
import { FINAL_STREAM_PHASES } from '../core/states';
import type { FeedEvent, ObjectiveStatus, ObjectiveStreamView, StreamEvent } from '../core/types';
import { formatTotals, formatUsage } from '../core/usage';

/** Feed lines kept in workflow state; older ones stay in history (the ledger is kept whole). */
export const FEED_LIMIT = 2_000;

/** Longest a stream holds a feed line back before sending its batch. */
export const FEED_FLUSH_DELAY_MS = 2_000;

/** Most events in one batch signal (a stream's burst of agent runs stays far below payload limits). */
export const FEED_BATCH_LIMIT = 100;

export interface Feed {
  events: FeedEvent[];
  seq: number;
}

export function emptyFeed(): Feed {
  return { events: [], seq: 0 };
}

/** The feed with one more line; the oldest lines drop out past `FEED_LIMIT`. */
export function appendFeed(feed: Feed, line: Omit<FeedEvent, 'seq'>): Feed {
  const seq = feed.seq + 1;
  const events = [...feed.events, { seq, ...line }];
  return { seq, events: events.length > FEED_LIMIT ? events.slice(events.length - FEED_LIMIT) : events };
}

/** Lines after `afterSeq` (the watcher's cursor). */
export function feedAfter(feed: Feed, afterSeq: number): FeedEvent[] {
  return feed.events.filter((e) => e.seq > afterSeq);
}

/**
 * A stream's view in its objective after one of its events. A stream that has reached a final
 * phase keeps it (a late line cannot bring it back to life).
 */
export function applyStreamEvent(view: ObjectiveStreamView, event: StreamEvent): ObjectiveStreamView {
  const next: ObjectiveStreamView = { ...view, iterations: event.iteration };
  if (!FINAL_STREAM_PHASES.includes(view.phase)) next.phase = event.phase;
  if (event.blocked !== undefined) next.blocked = event.blocked ?? undefined;
  if (event.usage) next.usage = event.usage;
  return next;
}

/**
 * Whether a stream sends its buffered events at once after this one: the objective acts on
 * blocks (its outcome becomes `blocked`), on merge readiness and on a stream's end.
 * `requestInEvents`: the merge request travels in a batch of its own event, so entering
 * `merge_ready` waits for it instead of costing the objective a signal of its own.
 */
export function flushNow(event: StreamEvent, opts: { requestInEvents?: boolean } = {}): boolean {
  return (
    event.blocked !== undefined ||
    event.mergeRequest !== undefined ||
    (event.phase === 'merge_ready' && !opts.requestInEvents) ||
    event.phase === 'merging' ||
    FINAL_STREAM_PHASES.includes(event.phase)
  );
}

/** The objective's current details in the Temporal UI: phase, each stream, agent usage. */
export function objectiveDetails(status: Pick<ObjectiveStatus, 'phase' | 'outcome' | 'streams' | 'usage'>): string {
  const streams = status.streams
    .map((s) => `- ${s.id}: ${s.phase}${s.blocked ? ` (mailbox ${s.blocked.mailbox})` : ''}${s.failure ? ` (${s.failure.summary})` : ''}${s.usage?.runs ? ` — ${formatUsage(s.usage)}` : ''}`)
    .join('\n');
  return `**${status.phase}**${status.outcome ? ` (${status.outcome})` : ''}\n\n${streams}\n\nAgent usage: ${formatTotals(status.usage)}`;
}
