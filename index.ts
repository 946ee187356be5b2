/**
 * Slipway as a library: `import { connect } from 'slipway'`.
 *
 *   const slipway = await connect();                       // TEMPORAL_ADDRESS, or the running `slipway dev`
 *   const objective = await slipway.startObjective({ objective: '...', repository: '.', agents: {...}, streams: [...] });
 *   for await (const e of objective.events()) console.log(e.source, e.text);
 *   const result = await objective.result();
 *   await slipway.close();
 *
 * The objective is the objective file's schema as an object, checked by the same loader with the
 * same messages (`ObjectiveFileError`, field named). Workers run elsewhere (`slipway worker` or
 * `slipway dev`); this client starts, follows and steers objectives, and talks to the sandbox
 * service through its HTTP API (`sandboxes()`).
 */
import { type Client, type WorkflowHandle } from '@temporalio/client';
import { loadObjective, ObjectiveFileError, type ObjectiveFileOverrides, type ObjectiveFileProblem } from './config/objective-file';
import { objectiveWorkflowId, streamWorkflowId } from './core/ids';
import type { BudgetLimit, BudgetRaise } from './core/budget';
import type { z } from 'zod';
import type { ObjectiveFileSchema } from './core/objective-schema';
import type { FeedEvent, GuidanceAck, ObjectiveInput, ObjectiveResult, ObjectiveStatus } from './core/types';
import { slipwaySettings } from './lib/settings';
import { budgetRaiseUpdate, objectiveStatusQuery, objectiveWorkflow, planDecisionUpdate } from './workflows/objective';
import { guidanceUpdate } from './workflows/stream';
import { connectClient, resolveTemporal } from './workers/temporal';
import { objectiveEvents, type FeedOptions } from './workers/objective-feed';
import { ObjectiveStartError, startObjectiveWorkflow } from './workers/start-objective';
import { ApiClientError, DEFAULT_API_URL, SandboxApiClient, type CreateSandboxInput, type ExecInput, type ExecOutput, type SandboxOps } from './api/client';
import type { SandboxView } from './api/schemas';

export type { AgentRunRecord, FeedEvent, GuidanceAck, LedgerEntry, ObjectiveInput, ObjectiveResult, ObjectiveStatus, ObjectiveStreamView, TokenTotals } from './core/types';
export type { BudgetLimit, BudgetRaise } from './core/budget';
export type { ModelPrice } from './core/prices';
export type { ObjectiveOutcome, ObjectivePhase, StreamPhase } from './core/states';
export type { FailureKind } from './core/failures';
export type { FeedOptions } from './workers/objective-feed';
export type { CreateSandboxInput, ExecInput, ExecOutput, SandboxOps, SandboxView, ObjectiveFileProblem };
export { ApiClientError, ObjectiveFileError, ObjectiveStartError, SandboxApiClient };
export { loadObjectiveFile } from './config/objective-file';

/**
 * An objective as the objective file writes it (`z.input` of its schema: defaults may be left
 * out). Checked at run time all the same: the caller's object is untrusted input.
 */
export type ObjectiveSpec = z.input<typeof ObjectiveFileSchema>;

export interface ConnectOptions {
  /** Temporal's address; default TEMPORAL_ADDRESS, else the embedded server `slipway dev` runs (never started here). */
  address?: string;
  /** Default TEMPORAL_NAMESPACE or `default`. */
  namespace?: string;
  /** The workers' task queue; default SLIPWAY_TASK_QUEUE or `slipway`. */
  taskQueue?: string;
}

export interface StartOptions extends Pick<ObjectiveFileOverrides, 'id' | 'baseBranch'> {
  /** Folder relative paths in the objective (`repository`, `prompt_file`) are resolved against; default: the current folder. */
  dir?: string;
}

/** One objective: follow it, read it, steer it. */
export class Objective {
  readonly workflowId: string;

  constructor(
    readonly id: string,
    private readonly client: Client,
  ) {
    this.workflowId = objectiveWorkflowId(id);
  }

  private get handle(): WorkflowHandle<typeof objectiveWorkflow> {
    return this.client.workflow.getHandle(this.workflowId);
  }

  /** Live feed lines until the objective ends (`slipway watch`'s lines, as data). */
  events(opts: FeedOptions = {}): AsyncGenerator<FeedEvent, void, undefined> {
    return objectiveEvents(this.handle, opts);
  }

  /** Phase, streams, ledger, usage and agent runs now (needs a worker to answer). */
  status(): Promise<ObjectiveStatus> {
    return this.handle.query(objectiveStatusQuery);
  }

  /** Waits for the end: the outcome, merge order, integration head, usage. */
  result(): Promise<ObjectiveResult> {
    return this.handle.result();
  }

  /** Approves the plan the objective waits on. Refused (WorkflowUpdateFailedError) when it waits on none. */
  async approve(): Promise<void> {
    await this.handle.executeUpdate(planDecisionUpdate, { args: [{ approve: true }] });
  }

  /** Rejects the plan; the planner tries again with the reason. */
  async reject(reason: string): Promise<void> {
    await this.handle.executeUpdate(planDecisionUpdate, { args: [{ approve: false, reason }] });
  }

  /** Guidance for a blocked stream (`slipway mail send`): `agent` is its mailbox (`builder-api`) or the stream id. */
  guide(stream: string, message: { agent?: string; subject: string; body: string }): Promise<GuidanceAck> {
    return this.client.workflow
      .getHandle(streamWorkflowId(this.id, stream))
      .executeUpdate(guidanceUpdate, { args: [{ agent: message.agent ?? stream, subject: message.subject, body: message.body }] });
  }

  /** A new budget limit for the objective, or one stream (`slipway budget raise`). */
  raiseBudget(raise: BudgetRaise): Promise<{ objectiveId: string; stream?: string; limit: BudgetLimit }> {
    return this.handle.executeUpdate(budgetRaiseUpdate, { args: [raise] });
  }

  /** Requests cancellation (`slipway cancel --no-wait`); `result()` then ends `cancelled`. */
  async cancel(): Promise<void> {
    await this.handle.cancel();
  }
}

export class Slipway {
  constructor(
    /** The Temporal client, for anything this API does not cover. */
    readonly client: Client,
    readonly taskQueue: string,
    private readonly closeConnection: () => Promise<void>,
  ) {}

  /**
   * Validates `spec` like an objective file (throws ObjectiveFileError naming each field; nothing
   * starts) and starts it. ObjectiveStartError: the id is taken.
   */
  async startObjective(spec: ObjectiveSpec, opts: StartOptions = {}): Promise<Objective> {
    const input: ObjectiveInput = await loadObjective(spec, opts);
    await startObjectiveWorkflow(this.client, this.taskQueue, input);
    return new Objective(input.id, this.client);
  }

  /** An objective started earlier (by id). */
  objective(id: string): Objective {
    return new Objective(id, this.client);
  }

  async close(): Promise<void> {
    await this.closeConnection();
  }
}

/** Connects to Temporal with Slipway's data converter (SLIPWAY_PAYLOAD_KEY as the workers have it). */
export async function connect(opts: ConnectOptions = {}): Promise<Slipway> {
  const env = { ...process.env, ...(opts.address ? { TEMPORAL_ADDRESS: opts.address } : {}), ...(opts.namespace ? { TEMPORAL_NAMESPACE: opts.namespace } : {}) };
  const settings = slipwaySettings(env);
  const target = await resolveTemporal(settings, { startIfMissing: false });
  const { client, close } = await connectClient(target);
  return new Slipway(client, opts.taskQueue ?? settings.taskQueue, close);
}

/**
 * A typed client of the sandbox service (`slipway api`): create, exec in, read and write files of,
 * and destroy service sandboxes. Default SLIPWAY_API_URL and SLIPWAY_API_TOKEN.
 */
export function sandboxes(opts: { url?: string; token?: string } = {}): SandboxApiClient {
  const token = opts.token ?? process.env.SLIPWAY_API_TOKEN;
  if (!token) throw new Error('sandboxes() needs a token: pass { token } or set SLIPWAY_API_TOKEN');
  return new SandboxApiClient(opts.url ?? process.env.SLIPWAY_API_URL ?? DEFAULT_API_URL, token);
}
