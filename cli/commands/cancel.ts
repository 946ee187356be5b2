/**
 * `slipway cancel <objective>`: asks the objective to stop. The workflow cancels its streams,
 * waits for their sandboxes to be cleaned up, removes its merger worktree and ends with outcome
 * `cancelled`; what was merged before stays on the integration branch.
 */
import { objectiveWorkflowId } from '../../core/ids';
import type { ObjectiveResult } from '../../core/types';
import { CliError, EXIT } from '../exit-codes';
import { describeObjective, openRuntime } from '../runtime';

export async function cancelCommand(objectiveId: string, opts: { wait?: boolean; json?: boolean }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const { handle, description } = await describeObjective(runtime.client, objectiveId);
    if (description.status.name !== 'RUNNING') throw new CliError(`objective "${objectiveId}" is not running (${description.status.name.toLowerCase()})`);
    await handle.cancel();
    if (opts.wait === false) {
      process.stdout.write(`asked objective ${objectiveId} to cancel; \`slipway status ${objectiveId}\` shows when it has ended\n`);
      return EXIT.ok;
    }
    if (!opts.json) process.stderr.write(`cancelling ${objectiveId}: stopping its streams and cleaning up their sandboxes\n`);
    // A continued-as-new objective ends in a later run: follow the chain.
    const result = (await runtime.client.workflow.getHandle(objectiveWorkflowId(objectiveId)).result()) as ObjectiveResult;
    if (opts.json) process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    else {
      const merged = result.mergeOrder.length;
      process.stdout.write(
        `${objectiveId}: ${result.outcome}; ${merged}/${result.streams.length} streams merged` +
          `${merged > 0 ? ` (kept on ${result.integrationBranch})` : ''}\n`,
      );
    }
    return result.outcome === 'cancelled' ? EXIT.ok : EXIT.runFailed;
  } finally {
    await runtime.close();
  }
}
