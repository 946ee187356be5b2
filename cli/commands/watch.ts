/** `slipway watch`: the live feed of an objective, following it to the end, across worker restarts. */
import { WorkflowNotFoundError } from '@temporalio/client';
import { objectiveWorkflowId } from '../../core/ids';
import type { FeedEvent, ObjectiveResult } from '../../core/types';
import { objectiveFeedQuery } from '../../workflows/objective';
import { CliError, EXIT } from '../exit-codes';
import { openRuntime } from '../runtime';
import { streamForAgent } from './human';
import { formatFeedEvent } from '../follow';


export async function watchCommand(opts: { objective?: string; stream?: string; agent?: string; intervalMs?: number }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const { client } = runtime;
    let objectiveId = opts.objective;
    if (!objectiveId) {
      for await (const wf of client.workflow.list({ query: 'SlipwayKind = "objective" AND ExecutionStatus = "Running"' })) {
        objectiveId = wf.workflowId.replace(/^objective:/, '');
        break;
      }
      if (!objectiveId) throw new CliError('no running objective; pass --objective <id>');
    }
    const handle = client.workflow.getHandle(objectiveWorkflowId(objectiveId));
    try {
      await handle.describe();
    } catch (e) {
      if (e instanceof WorkflowNotFoundError) throw new CliError(`no objective "${objectiveId}"`);
      throw e;
    }
    const wanted = (e: FeedEvent, streamIds: string[]) => {
      if (opts.stream && e.source !== opts.stream) return false;
      if (opts.agent) {
        const stream = streamForAgent(opts.agent, streamIds);
        if (e.source !== (stream ?? opts.agent)) return false;
      }
      return true;
    };
    let after = 0;
    let waitingNoticeShown = false;
    const sources = new Set<string>();
    for (;;) {
      try {
        const { events, done } = await handle.query(objectiveFeedQuery, after);
        waitingNoticeShown = false;
        for (const e of events) {
          sources.add(e.source);
          if (wanted(e, [...sources])) process.stdout.write(`${formatFeedEvent(e)}\n`);
          after = e.seq;
        }
        if (done) break;
      } catch (e) {
        const description = await handle.describe().catch(() => undefined);
        if (description && description.status.name !== 'RUNNING' && description.status.name !== 'COMPLETED') {
          process.stdout.write(`objective ${objectiveId} ${description.status.name.toLowerCase()}\n`);
          return EXIT.runFailed;
        }
        if (!waitingNoticeShown) {
          process.stderr.write(`(no worker answers yet: ${(e as Error).message.split('\n')[0]}; still watching)\n`);
          waitingNoticeShown = true;
        }
      }
      await new Promise((r) => setTimeout(r, opts.intervalMs ?? 1_000));
    }
    const result = (await handle.result()) as ObjectiveResult;
    process.stdout.write(`objective ${objectiveId}: ${result.outcome}\n`);
    return result.outcome === 'completed' ? EXIT.ok : EXIT.runFailed;
  } finally {
    await runtime.close();
  }
}
