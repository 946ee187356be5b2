/**
 * An objective's live feed as an async iterator: each new line once, in order, until the
 * objective ends. For `run --follow` (cli/follow.ts) and the library's `events()` (index.ts).
 * A query that fails (the run not started yet, a worker restarting) is tried again.
 */
import type { WorkflowHandle } from '@temporalio/client';
import type { FeedEvent } from '../core/types';
import { objectiveFeedQuery } from '../workflows/objective';

export interface FeedOptions {
  /** Lines after this sequence number (0: from the start of what the objective keeps). */
  afterSeq?: number;
  /** How often to ask while nothing new came (ms). */
  intervalMs?: number;
  /** Stops the iteration (the iterator then returns). */
  signal?: AbortSignal;
}

export async function* objectiveEvents(handle: WorkflowHandle, opts: FeedOptions = {}): AsyncGenerator<FeedEvent, void, undefined> {
  let after = opts.afterSeq ?? 0;
  let closed = false;
  const result = handle.result().then(
    () => (closed = true),
    () => (closed = true),
  );
  const pause = () =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, opts.intervalMs ?? 500);
      const stop = () => {
        clearTimeout(timer);
        resolve();
      };
      void result.then(stop);
      opts.signal?.addEventListener('abort', stop, { once: true });
    });
  while (!opts.signal?.aborted) {
    const wasClosed = closed;
    const answer = await handle.query(objectiveFeedQuery, after).catch(() => undefined);
    for (const e of answer?.events ?? []) {
      if (opts.signal?.aborted) return;
      after = e.seq;
      yield e;
    }
    // Closed before this query asked: the lines it returned were the last.
    if (answer?.done || wasClosed) return;
    await pause();
  }
}
