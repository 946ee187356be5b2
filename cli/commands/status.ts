import type { WorkflowHandle } from '@temporalio/client';
import type { ObjectiveResult, ObjectiveStatus } from '../../core/types';
import { objectiveStatusQuery } from '../../workflows/objective';
import { EXIT } from '../exit-codes';
import { describeObjective, openRuntime } from '../runtime';
import { formatTotals } from '../../core/usage';
import { agentRunLines, plannerLines, renderResult, streamUsage } from './run';

export async function statusCommand(objectiveId: string, opts: { json?: boolean }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const { handle, description } = await describeObjective(runtime.client, objectiveId);
    const state = description.status.name;
    let status: ObjectiveStatus | ObjectiveResult | undefined;
    let error: string | undefined;
    if (state === 'COMPLETED') {
      const result = (await handle.result()) as ObjectiveResult;
      status = result;
      error = result.error;
    } else if (state === 'RUNNING') {
      // A query needs a worker; fall back to the workflow's description when none answers.
      status = await Promise.race([
        handle.query(objectiveStatusQuery),
        new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 5_000)),
      ]).catch(() => undefined);
    } else {
      error = `workflow ${state.toLowerCase()}${await closedFailure(handle)}`;
    }
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
  } finally {
    await runtime.close();
  }
}

/** `: <why>` for a workflow that closed without a result (failed, terminated, timed out, cancelled), from its history. */
export async function closedFailure(handle: WorkflowHandle): Promise<string> {
  try {
    await handle.result();
    return '';
  } catch (e) {
    // The innermost cause says what happened ("Workflow execution failed" wraps it).
    let cause = e as Error & { cause?: unknown };
    while (cause.cause instanceof Error) cause = cause.cause as Error & { cause?: unknown };
    return cause.message ? `: ${cause.message}` : '';
  }
}
