/** Prints an objective's live feed while it runs (used by `run --follow`). */
import type { WorkflowHandle } from '@temporalio/client';
import { objectiveFeedQuery } from '../workflows/objective';
import type { FeedEvent } from '../core/types';

export function formatFeedEvent(e: FeedEvent): string {
  return `${e.at.slice(11, 19)} [${e.source}] ${e.text}`;
}

/** Polls the feed query until the workflow closes; prints each new line through `print`. */
export async function followObjective(handle: WorkflowHandle, print: (line: string) => void, intervalMs = 500): Promise<void> {
  let after = 0;
  let closed = false;
  const result = handle.result().finally(() => {
    closed = true;
  });
  result.catch(() => undefined);
  const drain = async () => {
    const { events } = await handle.query(objectiveFeedQuery, after);
    for (const e of events) {
      print(formatFeedEvent(e));
      after = e.seq;
    }
  };
  while (!closed) {
    await drain().catch(() => undefined); // not started yet, or a worker restarting
    await Promise.race([result.catch(() => undefined), new Promise((r) => setTimeout(r, intervalMs))]);
  }
  await drain().catch(() => undefined);
}
