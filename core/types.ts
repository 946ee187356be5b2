/**
 * Workflow inputs, messages and results. Only data that is safe to keep in Temporal history:
 * no credentials, no environment values.
 */
import type { AgentSpec, GateSpec, StreamSpec } from './objective-schema';
import type { FailureKind } from './failures';
import type { AgentRole, LedgerResult, ObjectiveOutcome, ObjectivePhase, SandboxState, StreamPhase } from './states';
import type { Blueprint, ExhaustionMode } from '../blueprints/schema';

export type { AgentSpec, GateSpec, StreamSpec, Blueprint, ExhaustionMode };

export type AgentSpecs = Partial<Record<AgentRole, AgentSpec>>;

/** A blueprint with every blueprint it references, resolved before the run starts. */
export interface ResolvedBlueprints {
  root: Blueprint;
  refs: Record<string, Blueprint>;
}

/** The resolved objective: absolute paths, defaults applied. The objective workflow's input. */
export interface ObjectiveInput {
  id: string;
  objective: string;
  /** Absolute path of the user's repository. */
  repository: string;
  baseBranch: string;
  /** Folder of the objective file; script agents get it as SLIPWAY_OBJECTIVE_DIR. */
  objectiveDir: string;
  sourceFile?: string;
  maxParallelStreams: number;
  /** Overrides the blueprints' fix-loop bound for steps that set none. */
  maxFixIterations?: number;
  /** Overrides the blueprints' exhaustion mode for steps that set none. */
  onExhausted?: ExhaustionMode;
  /** Ask a human to approve even a plan given in the file. */
  requireApproval?: boolean;
  gates: GateSpec[];
  postMergeGates: GateSpec[];
  agents: AgentSpecs;
  /** May be empty when a planner agent produces the streams. */
  streams: StreamSpec[];
  /** The objective's blueprint (default `standard`) and the blueprints it references. */
  blueprint: ResolvedBlueprints;
}

export interface SandboxInfo {
  sandboxId: string;
  provider: 'local';
  path: string;
  branch: string;
  baseCommit: string;
  headCommit: string;
}

export interface SandboxInput {
  sandboxId: string;
  provider: 'local';
  repository: string;
  objectiveId: string;
  name: string;
  branch: string;
  /** Branch or commit the sandbox branch starts from. */
  base: string;
  /** Workflow that receives the ready signal. */
  ownerWorkflowId: string;
}

export interface SandboxResult {
  sandboxId: string;
  state: Extract<SandboxState, 'terminated' | 'failed'>;
  error?: string;
}

/** Context handed to the next attempt: what failed, and any human guidance. */
export interface Feedback {
  kind: FailureKind;
  summary: string;
  /** Gate output tail, reviewer findings, conflict details. */
  details: string;
  guidance?: string;
  /** Short lines from the recovery ledger so far. */
  history?: string[];
}

/** One line of the append-only recovery ledger. */
export interface LedgerEntry {
  at: string;
  stream?: string;
  step: string;
  kind: FailureKind;
  action: string;
  /** Attempt n of max for the mechanism that handled it (fix loop, retries, merges). */
  attempt: number;
  maxAttempts: number;
  summary: string;
  result: LedgerResult;
  guidance?: string;
}

/** One line of the live feed (`slipway watch`). */
export interface FeedEvent {
  seq: number;
  at: string;
  source: string;
  text: string;
}

export interface TokenTotals {
  inputTokens: number;
  outputTokens: number;
  cachedTokens: number;
  costUsd: number;
  runs: number;
}

/**
 * One agent run (one activity call), as recorded in stream and objective status: where it ran,
 * what it cost, how it ended. Tokens follow the providers' shared convention (input includes
 * cached); `costUsd` is absent when the agent reports no cost.
 */
export interface AgentRunRecord {
  at: string;
  /** Absent for the planner (it works for the whole objective). */
  stream?: string;
  step: string;
  role: AgentRole;
  provider: AgentSpec['provider'];
  model?: string;
  /** Builder runs of the stream so far (the fix-loop iteration). */
  iteration: number;
  /** This run within the step's iteration loop, and the loop's bound. */
  agentIteration: number;
  maxIterations: number;
  sessionId?: string;
  /** The run resumed this agent session. */
  resumed?: string;
  inputTokens: number;
  outputTokens: number;
  cachedTokens: number;
  costUsd?: number;
  toolCalls: number;
  durationMs: number;
  /** `signalled`: the output held a completion signal; `invalid_output`: its structured answer did not validate. */
  result: 'finished' | 'signalled' | 'invalid_output';
}

export interface StreamInput {
  objective: Pick<ObjectiveInput, 'id' | 'objective' | 'repository' | 'objectiveDir'>;
  stream: StreamSpec;
  /** Branch or commit to start from (the base commit, or the integration branch for dependents). */
  base: string;
  integrationBranch: string;
  gates: GateSpec[];
  agents: AgentSpecs;
  blueprint: Blueprint;
  maxFixIterations?: number;
  onExhausted?: ExhaustionMode;
  parentWorkflowId: string;
}

export interface MergeRequest {
  streamId: string;
  branch: string;
  headCommit: string;
}

export type MergeDecision =
  | { status: 'merged'; commit: string }
  | { status: 'rejected'; kind: FailureKind; summary: string; details: string };

export interface Guidance {
  /** Mailbox the message is addressed to, e.g. `builder-api`. */
  agent: string;
  subject: string;
  body: string;
}

export interface GuidanceAck {
  streamId: string;
  resumesAt: string;
}

export interface BlockedInfo {
  mailbox: string;
  since: string;
  step: string;
  kind: FailureKind;
  summary: string;
}

export interface StreamResult {
  streamId: string;
  status: 'merged' | 'failed' | 'escalated';
  branch: string;
  iterations: number;
  mergeCommit?: string;
  failure?: { kind: FailureKind; summary: string };
  ledger: LedgerEntry[];
  usage: TokenTotals;
}

export interface StreamStatus {
  streamId: string;
  phase: StreamPhase;
  step?: string;
  /** Builder runs so far. */
  iteration: number;
  branch: string;
  sandboxPath?: string;
  ledger: LedgerEntry[];
  blocked?: BlockedInfo;
  failure?: { kind: FailureKind; summary: string };
  usage: TokenTotals;
  /** Every agent run of the stream, oldest first (absent until the first one). */
  agentRuns?: AgentRunRecord[];
}

/** What a stream tells its objective as it goes (feed line, phase, blocked state, ledger entry). */
export interface StreamEvent {
  streamId: string;
  phase: StreamPhase;
  text: string;
  iteration: number;
  blocked?: BlockedInfo | null;
  ledger?: LedgerEntry;
  usage?: TokenTotals;
  /** An agent run that just ended. */
  agentRun?: AgentRunRecord;
}

export interface ObjectiveStreamView {
  id: string;
  task?: string;
  phase: StreamPhase;
  iterations: number;
  mergeCommit?: string;
  blocked?: BlockedInfo;
  failure?: { kind: FailureKind; summary: string };
  usage?: TokenTotals;
}

export interface ObjectiveStatus {
  objectiveId: string;
  phase: ObjectivePhase;
  blueprint: string;
  integrationBranch: string;
  baseCommit?: string;
  streams: ObjectiveStreamView[];
  /** Stream ids in the order they landed on the integration branch. */
  mergeOrder: string[];
  /** The plan awaiting approval, if any. */
  pendingApproval?: { streams: StreamSpec[]; prompt?: string };
  ledger: LedgerEntry[];
  /** Summed over every agent run of the objective (its streams and the planner). */
  usage: TokenTotals;
  /** Every agent run of the objective, oldest first (absent until the first one). */
  agentRuns?: AgentRunRecord[];
  /** `blocked` while any stream waits for guidance; the final outcome once done. */
  outcome?: ObjectiveOutcome;
  needsAttention: string[];
}

export interface ObjectiveResult extends ObjectiveStatus {
  outcome: ObjectiveOutcome;
  integrationHead?: string;
  /** Why the objective itself failed (a rejected plan, a configuration problem), if it did. */
  error?: string;
}

export const emptyTotals = (): TokenTotals => ({ inputTokens: 0, outputTokens: 0, cachedTokens: 0, costUsd: 0, runs: 0 });
