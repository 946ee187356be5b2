import type { ObjectiveResult } from '../../core/types';
import { formatTotals } from '../../core/usage';
import { EXIT } from '../exit-codes';
import { withObjectiveReader } from '../objective-reader';
import { agentRunLines, plannerLines, renderResult, streamUsage } from './run';

export async function statusCommand(objectiveId: string, opts: { json?: boolean }): Promise<number> {
  const { state, status, error } = await withObjectiveReader((reader) => reader.read(objectiveId));
  if (opts.json) {
    process.stdout.write(`${JSON.stringify({ objectiveId, workflowStatus: state, ...status, ...(error ? { error } : {}) })}\n`);
  } else if (status && 'outcome' in status && status.outcome) {
    process.stdout.write(renderResult(status as ObjectiveResult));
  } else if (status) {
    process.stdout.write(
      [
        `objective ${objectiveId}: ${status.phase} (running)`,
        ...plannerLines(status.agentRuns),
        ...status.streams.flatMap((s) => [`  ${s.id.padEnd(16)} ${s.phase}${streamUsage(s)}${s.failure ? `  ${s.failure.summary}` : ''}`, ...agentRunLines(status.agentRuns, s.id)]),
        `agent usage: ${formatTotals(status.usage)}`,
      ].join('\n') + '\n',
    );
  } else {
    process.stdout.write(`objective ${objectiveId}: ${error ?? `${state.toLowerCase()} (no worker answered the status query)`}\n`);
  }
  return EXIT.ok;
}
