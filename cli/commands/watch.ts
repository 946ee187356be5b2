/** `slipway watch`: the live feed of an objective, following it to the end, across worker restarts. */
import type { Client, WorkflowHandle } from '@temporalio/client';
import { defaultPayloadConverter, tsToDate } from '@temporalio/common';
import { decodeFromPayloadsAtIndex } from '@temporalio/common/lib/internal-non-workflow';
import { SlipwayPhase } from '../../core/search-attributes';
import type { FeedEvent, ObjectiveResult, StreamEvent } from '../../core/types';
import { objectiveFeedQuery } from '../../workflows/objective';
import { streamEventSignal, streamEventsSignal } from '../../workflows/stream';
import { closedFailure } from '../objective-reader';
import { CliError, EXIT } from '../exit-codes';
import { describeObjective, openRuntime } from '../runtime';
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
    const { handle, description } = await describeObjective(client, objectiveId);
    const wanted = (e: FeedEvent, streamIds: string[]) => {
      if (opts.stream && e.source !== opts.stream) return false;
      if (opts.agent) {
        const stream = streamForAgent(opts.agent, streamIds);
        if (e.source !== (stream ?? opts.agent)) return false;
      }
      return true;
    };
    const sources = new Set<string>();
    const print = (e: Omit<FeedEvent, 'seq'>) => {
      sources.add(e.source);
      if (wanted(e as FeedEvent, [...sources])) process.stdout.write(`${formatFeedEvent(e as FeedEvent)}\n`);
    };
    // A closed run's feed comes from its history: a query would wait for a worker that may never come.
    if (description.status.name !== 'RUNNING') return await printEnded(client, handle, objectiveId, description.status.name, print);
    let after = 0;
    let waitingNoticeShown = false;
    for (;;) {
      try {
        const { events, done } = await handle.query(objectiveFeedQuery, after);
        waitingNoticeShown = false;
        for (const e of events) {
          print(e);
          after = e.seq;
        }
        if (done) break;
      } catch (e) {
        const now = await handle.describe().catch(() => undefined);
        if (now && now.status.name !== 'RUNNING') {
          // Ended while no worker answered: the rest of the feed is in the history.
          return await printEnded(client, handle, objectiveId, now.status.name, print, after > 0);
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
    if (result.error) process.stdout.write(`error: ${result.error}\n`);
    return result.outcome === 'completed' ? EXIT.ok : EXIT.runFailed;
  } finally {
    await runtime.close();
  }
}

/**
 * The feed of an objective that has ended, without a worker: the result's `feed` when the
 * workflow returns one, else its streams' events and phase changes from the history (the
 * objective's own narration lives only in workflow memory), then the outcome and why.
 * `skipStreamEvents`: the live part was printed already; only the ending is new.
 */
async function printEnded(
  client: Client,
  handle: WorkflowHandle,
  objectiveId: string,
  state: string,
  print: (e: Omit<FeedEvent, 'seq'>) => void,
  skipHistory = false,
): Promise<number> {
  let result: (ObjectiveResult & { feed?: FeedEvent[] }) | undefined;
  if (state === 'COMPLETED') result = (await handle.result()) as ObjectiveResult & { feed?: FeedEvent[] };
  if (!skipHistory) {
    if (result?.feed) for (const e of result.feed) print(e);
    else for (const e of await feedFromHistory(client, handle)) print(e);
  }
  if (result) {
    process.stdout.write(`objective ${objectiveId}: ${result.outcome}\n`);
    if (result.error) process.stdout.write(`error: ${result.error}\n`);
    return result.outcome === 'completed' ? EXIT.ok : EXIT.runFailed;
  }
  process.stdout.write(`objective ${objectiveId}: workflow ${state.toLowerCase()}${await closedFailure(handle)}\n`);
  return EXIT.runFailed;
}

/**
 * Stream events (signals to the objective) and the objective's phase changes, in history order,
 * over every run of the objective (it continues as new when its history grows long).
 */
async function feedFromHistory(client: Client, handle: WorkflowHandle): Promise<Omit<FeedEvent, 'seq'>[]> {
  const runs = [await handle.fetchHistory()];
  for (;;) {
    const previous = runs[0].events?.[0]?.workflowExecutionStartedEventAttributes?.continuedExecutionRunId;
    if (!previous) break;
    runs.unshift(await client.workflow.getHandle(handle.workflowId, previous).fetchHistory());
  }
  const converter = client.options.loadedDataConverter;
  const out: Omit<FeedEvent, 'seq'>[] = [];
  let phase: string | undefined;
  for (const event of runs.flatMap((history) => history.events ?? [])) {
    const at = event.eventTime ? tsToDate(event.eventTime).toISOString() : new Date(0).toISOString();
    const signal = event.workflowExecutionSignaledEventAttributes;
    if (signal?.signalName === streamEventSignal.name || signal?.signalName === streamEventsSignal.name) {
      // One event per signal (streams of 0.1.0, timed by the signal) or a batch (timed by the stream).
      const decoded = await decodeFromPayloadsAtIndex<StreamEvent | StreamEvent[]>(converter, 0, signal.input?.payloads).catch(() => undefined);
      for (const e of Array.isArray(decoded) ? decoded : [decoded]) {
        if (e?.streamId && typeof e.text === 'string') out.push({ at: typeof e.at === 'string' ? e.at : at, source: e.streamId, text: e.text });
      }
      continue;
    }
    const fields = event.upsertWorkflowSearchAttributesEventAttributes?.searchAttributes?.indexedFields;
    const phasePayload = fields?.[SlipwayPhase.name];
    if (phasePayload) {
      const value = defaultPayloadConverter.fromPayload<unknown>(phasePayload);
      const next = Array.isArray(value) ? value[0] : value;
      if (typeof next === 'string' && next !== phase) out.push({ at, source: 'objective', text: (phase = next) });
    }
  }
  return out;
}
