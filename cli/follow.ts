/** Prints an objective's live feed while it runs (used by `run --follow`). */
import type { WorkflowHandle } from '@temporalio/client';
import type { FeedEvent } from '../core/types';
import { objectiveEvents } from '../workers/objective-feed';

export function formatFeedEvent(e: FeedEvent): string {
  return `${e.at.slice(11, 19)} [${e.source}] ${e.text}`;
}

/** Prints each new feed line through `print` until the workflow closes. */
export async function followObjective(handle: WorkflowHandle, print: (line: string) => void, intervalMs = 500): Promise<void> {
  for await (const e of objectiveEvents(handle, { intervalMs })) print(formatFeedEvent(e));
}
