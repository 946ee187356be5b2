/**
 * What `slipway status` and `list` read of objectives, by one of two paths that give the same
 * answer: Temporal's HTTP API with `fetch` when its address is known (node:http, no Temporal SDK loaded,
 * ADR 0024), else the SDK client. The steps (which call for which workflow state, how a closed
 * workflow's failure is told) are written once, over the few primitives each path provides.
 */
import type { WorkflowHandle } from '@temporalio/client';
import { OBJECTIVE_STATUS_QUERY, objectiveWorkflowId } from '../core/ids';
import { OBJECTIVES_QUERY, SEARCH_ATTRIBUTE_NAMES } from '../core/search-attribute-names';
import type { ObjectiveResult, ObjectiveStatus } from '../core/types';
import { slipwaySettings } from '../lib/settings';
import { CliError, EXIT } from './exit-codes';
import { GRPC_NOT_FOUND, httpEndpoint, TemporalHttp, TemporalHttpError, TemporalUnreachableError, timestampToDate, type JsonPayload } from './temporal-http';

export interface ObjectiveRow {
  objectiveId: string;
  workflowId: string;
  status: string;
  phase?: string;
  outcome?: string;
  costUsd?: number;
  startTime: string;
}

export interface ObjectiveState {
  /** The workflow's status: RUNNING, COMPLETED, FAILED, ... */
  state: string;
  /** The result when completed, the status query's answer when running and a worker answered. */
  status?: ObjectiveStatus | ObjectiveResult;
  error?: string;
}

/** How long `status` waits for a worker to answer the status query before showing less. */
const QUERY_TIMEOUT_MS = 5_000;

/** What each path provides. */
interface Primitives {
  list(limit: number): Promise<ObjectiveRow[]>;
  /** The workflow status of the objective's latest run; CliError (exit 2) naming an unknown id. */
  state(objectiveId: string): Promise<string>;
  result(objectiveId: string): Promise<ObjectiveResult>;
  /** The status query's answer; rejects when none comes. */
  query(objectiveId: string, timeoutMs: number): Promise<ObjectiveStatus>;
  /** `: <why>` for a closed workflow without a result, from its close event ('' when it completed). */
  closedFailure(objectiveId: string): Promise<string>;
}

export interface ObjectiveReader {
  list(limit: number): Promise<ObjectiveRow[]>;
  read(objectiveId: string): Promise<ObjectiveState>;
}

function reader(p: Primitives): ObjectiveReader {
  return {
    list: async (limit) => (limit > 0 ? p.list(limit) : []),
    async read(objectiveId) {
      const state = await p.state(objectiveId);
      if (state === 'COMPLETED') {
        const result = await p.result(objectiveId);
        return { state, status: result, error: result.error };
      }
      if (state === 'RUNNING') {
        // A query needs a worker; without an answer, status shows what the workflow's state says.
        return { state, status: await p.query(objectiveId, QUERY_TIMEOUT_MS).catch(() => undefined) };
      }
      return { state, error: `workflow ${state.toLowerCase()}${await p.closedFailure(objectiveId)}` };
    },
  };
}


/**
 * Runs `use` with a reader: over HTTP when its address is known, else (or when that address does
 * not answer at all, as after a server was killed without removing its record) through the SDK.
 */
export async function withObjectiveReader<T>(use: (reader: ObjectiveReader) => Promise<T>): Promise<T> {
  const settings = slipwaySettings();
  const endpoint = httpEndpoint(settings);
  if (endpoint) {
    // Read (and checked: PayloadKeyError, exit 2) before anything, as on the SDK path.
    const { payloadKeyringFromEnv, EncryptionCodec } = require('../workers/payload-codec') as typeof import('../workers/payload-codec');
    const keyring = payloadKeyringFromEnv();
    const http = new TemporalHttp(endpoint, keyring ? new EncryptionCodec(keyring) : undefined);
    try {
      return await use(reader(httpPrimitives(http)));
    } catch (e) {
      if (!(e instanceof TemporalUnreachableError)) throw e;
    }
  }
  const { openRuntime } = require('./runtime') as typeof import('./runtime');
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    return await use(reader(sdkPrimitives(runtime.client)));
  } finally {
    await runtime.close();
  }
}

// ---------------------------------------------------------------------------------------------
// Over HTTP

type Failure = { message?: string; cause?: Failure };
interface CloseEvent {
  workflowExecutionCompletedEventAttributes?: { result?: { payloads?: JsonPayload[] }; newExecutionRunId?: string };
  workflowExecutionFailedEventAttributes?: { failure?: Failure; newExecutionRunId?: string };
  workflowExecutionCanceledEventAttributes?: unknown;
  workflowExecutionTerminatedEventAttributes?: { reason?: string };
  workflowExecutionTimedOutEventAttributes?: { newExecutionRunId?: string };
  workflowExecutionContinuedAsNewEventAttributes?: { newExecutionRunId?: string };
}
const STATUS_PREFIX = 'WORKFLOW_EXECUTION_STATUS_';

function httpPrimitives(http: TemporalHttp): Primitives {
  const workflowPath = (objectiveId: string) => `/workflows/${encodeURIComponent(objectiveWorkflowId(objectiveId))}`;
  const notFound = (objectiveId: string) => (e: unknown) => {
    if (e instanceof TemporalHttpError && e.code === GRPC_NOT_FOUND) throw new CliError(`no objective "${objectiveId}"`, EXIT.badInput);
    throw e;
  };
  /** The close event of the objective's latest run, following runs it continued into, as the SDK's result() does. */
  const closeEvent = async (objectiveId: string): Promise<CloseEvent> => {
    let runId: string | undefined;
    let nextPageToken: string | undefined;
    for (;;) {
      const res = await http
        .call<{ history?: { events?: CloseEvent[] }; nextPageToken?: string }>(`${workflowPath(objectiveId)}/history`, {
          query: { 'execution.runId': runId, historyEventFilterType: 'HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT', waitNewEvent: 'true', nextPageToken },
        })
        .catch(notFound(objectiveId));
      const ev = res.history?.events?.[0];
      if (!ev) {
        nextPageToken = res.nextPageToken;
        continue;
      }
      const next =
        ev.workflowExecutionCompletedEventAttributes?.newExecutionRunId ||
        ev.workflowExecutionFailedEventAttributes?.newExecutionRunId ||
        ev.workflowExecutionTimedOutEventAttributes?.newExecutionRunId ||
        ev.workflowExecutionContinuedAsNewEventAttributes?.newExecutionRunId;
      if (!next) return ev;
      runId = next;
      nextPageToken = undefined;
    }
  };
  return {
    async list(limit) {
      const rows: ObjectiveRow[] = [];
      let nextPageToken: string | undefined;
      do {
        const page = await http.call<{
          executions?: Array<{ execution: { workflowId: string }; status: string; startTime: string; searchAttributes?: { indexedFields?: Record<string, JsonPayload> } }>;
          nextPageToken?: string;
        }>('/workflows', { query: { query: OBJECTIVES_QUERY, nextPageToken } });
        for (const wf of page.executions ?? []) {
          const attrs = wf.searchAttributes?.indexedFields ?? {};
          const attr = async (name: string) => (attrs[name] ? await http.decode(attrs[name]) : undefined);
          rows.push({
            objectiveId: wf.execution.workflowId.replace(/^objective:/, ''),
            workflowId: wf.execution.workflowId,
            status: wf.status.replace(STATUS_PREFIX, '').toLowerCase(),
            phase: (await attr(SEARCH_ATTRIBUTE_NAMES.phase)) as string | undefined,
            outcome: (await attr(SEARCH_ATTRIBUTE_NAMES.outcome)) as string | undefined,
            costUsd: (await attr(SEARCH_ATTRIBUTE_NAMES.costUsd)) as number | undefined,
            startTime: timestampToDate(wf.startTime).toISOString(),
          });
          if (rows.length >= limit) return rows;
        }
        nextPageToken = page.nextPageToken || undefined;
      } while (nextPageToken);
      return rows;
    },
    async state(objectiveId) {
      const d = await http.call<{ workflowExecutionInfo: { status: string } }>(workflowPath(objectiveId)).catch(notFound(objectiveId));
      return d.workflowExecutionInfo.status.replace(STATUS_PREFIX, '');
    },
    async result(objectiveId) {
      const ev = await closeEvent(objectiveId);
      const payloads = ev.workflowExecutionCompletedEventAttributes?.result?.payloads;
      if (!ev.workflowExecutionCompletedEventAttributes) throw new Error(`objective "${objectiveId}" did not complete: ${await this.closedFailure(objectiveId)}`);
      return (await http.decode(payloads?.[0])) as ObjectiveResult;
    },
    async query(objectiveId, timeoutMs) {
      const res = await http.call<{ queryResult?: { payloads?: JsonPayload[] } }>(`${workflowPath(objectiveId)}/query/${OBJECTIVE_STATUS_QUERY}`, {
        body: { query: { queryType: OBJECTIVE_STATUS_QUERY } },
        timeoutMs,
      });
      return (await http.decode(res.queryResult?.payloads?.[0])) as ObjectiveStatus;
    },
    async closedFailure(objectiveId) {
      const ev = await closeEvent(objectiveId);
      // The innermost cause's message, as the SDK's WorkflowFailedError chain gives it.
      let message: string | undefined;
      if (ev.workflowExecutionCompletedEventAttributes) return '';
      if (ev.workflowExecutionFailedEventAttributes) {
        let f = ev.workflowExecutionFailedEventAttributes.failure;
        if (!f) message = 'Workflow execution failed';
        else {
          while (f.cause) f = f.cause;
          message = f.message;
        }
      } else if (ev.workflowExecutionCanceledEventAttributes) message = 'Workflow canceled';
      else if (ev.workflowExecutionTerminatedEventAttributes) message = ev.workflowExecutionTerminatedEventAttributes.reason || 'Workflow execution terminated';
      else if (ev.workflowExecutionTimedOutEventAttributes) message = 'Workflow execution timed out';
      return message ? `: ${message}` : '';
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Through the SDK

function sdkPrimitives(client: import('@temporalio/client').Client): Primitives {
  const handle = (objectiveId: string) => client.workflow.getHandle(objectiveWorkflowId(objectiveId));
  return {
    async list(limit) {
      const { SlipwayCostUsd, SlipwayOutcome, SlipwayPhase } = require('../core/search-attributes') as typeof import('../core/search-attributes');
      const rows: ObjectiveRow[] = [];
      for await (const wf of client.workflow.list({ query: OBJECTIVES_QUERY })) {
        rows.push({
          objectiveId: wf.workflowId.replace(/^objective:/, ''),
          workflowId: wf.workflowId,
          status: wf.status.name.toLowerCase(),
          phase: wf.typedSearchAttributes.get(SlipwayPhase),
          outcome: wf.typedSearchAttributes.get(SlipwayOutcome),
          // Absent until the first run with a cost (and on objectives started before the attribute existed).
          costUsd: wf.typedSearchAttributes.get(SlipwayCostUsd),
          startTime: wf.startTime.toISOString(),
        });
        if (rows.length >= limit) break;
      }
      return rows;
    },
    async state(objectiveId) {
      const { describeObjective } = require('./runtime') as typeof import('./runtime');
      return (await describeObjective(client, objectiveId)).description.status.name;
    },
    result: async (objectiveId) => (await handle(objectiveId).result()) as ObjectiveResult,
    query: (objectiveId, timeoutMs) =>
      Promise.race([
        handle(objectiveId).query<ObjectiveStatus>(OBJECTIVE_STATUS_QUERY),
        new Promise<never>((_, reject) => setTimeout(() => reject(new Error('no worker answered the status query')), timeoutMs).unref()),
      ]),
    closedFailure: (objectiveId) => closedFailure(handle(objectiveId)),
  };
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
