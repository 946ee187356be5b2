/** Renders an objective's progress while it runs, from its status query. */
import type { WorkflowHandle } from '@temporalio/client';
import type { ObjectiveStatus } from '../core/types';
import { objectiveStatusQuery } from '../workflows/objective';

const time = () => new Date().toISOString().slice(11, 19);

export function describeChanges(previous: ObjectiveStatus | undefined, current: ObjectiveStatus): string[] {
  const lines: string[] = [];
  if (previous?.phase !== current.phase) lines.push(`${time()} [objective] ${current.phase}`);
  for (const stream of current.streams) {
    const before = previous?.streams.find((s) => s.id === stream.id);
    if (before?.phase === stream.phase && before.iterations === stream.iterations) continue;
    const failure = stream.failure ? ` (${stream.failure.kind}: ${stream.failure.summary})` : '';
    lines.push(`${time()} [${stream.id}] ${stream.phase}${failure}`);
  }
  return lines;
}

/** Polls the status query until the workflow closes; prints each change through `print`. */
export async function followObjective(handle: WorkflowHandle, print: (line: string) => void, intervalMs = 1_000): Promise<void> {
  let previous: ObjectiveStatus | undefined;
  let closed = false;
  const result = handle.result().finally(() => {
    closed = true;
  });
  result.catch(() => undefined);
  while (!closed) {
    try {
      const current = await handle.query(objectiveStatusQuery);
      for (const line of describeChanges(previous, current)) print(line);
      previous = current;
    } catch {
      /* the workflow may not have run its first task yet, or just closed */
    }
    await Promise.race([result.catch(() => undefined), new Promise((r) => setTimeout(r, intervalMs))]);
  }
}
