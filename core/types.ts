/**
 * Workflow inputs and results. Only data that is safe to keep in Temporal history:
 * no credentials, no environment values.
 */
import type { AgentSpec, GateSpec, StreamSpec } from './objective-schema';
import type { FailureKind } from './failures';
import type { ObjectiveOutcome, ObjectivePhase, SandboxState, StreamPhase } from './states';

export type { AgentSpec, GateSpec, StreamSpec };

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
  maxFixIterations: number;
  gates: GateSpec[];
  postMergeGates: GateSpec[];
  agents: { builder: AgentSpec; reviewer?: AgentSpec };
  streams: StreamSpec[];
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

/** Feedback handed to the next builder iteration. */
export interface Feedback {
  kind: FailureKind;
  summary: string;
  /** Gate output tail or reviewer findings. */
  details: string;
}

export interface AttemptRecord {
  iteration: number;
  step: 'build' | 'gates' | 'review' | 'merge' | 'post_merge_gates' | 'sandbox';
  kind: FailureKind;
  summary: string;
  action: string;
  at: string;
}

export interface StreamInput {
  objective: Pick<ObjectiveInput, 'id' | 'objective' | 'repository' | 'objectiveDir'>;
  stream: StreamSpec;
  /** Branch or commit to start from (the base commit, or the integration branch for dependents). */
  base: string;
  gates: GateSpec[];
  agents: ObjectiveInput['agents'];
  maxFixIterations: number;
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

export interface StreamResult {
  streamId: string;
  status: 'merged' | 'failed';
  branch: string;
  iterations: number;
  mergeCommit?: string;
  failure?: { kind: FailureKind; summary: string };
  attempts: AttemptRecord[];
}

export interface StreamStatus {
  streamId: string;
  phase: StreamPhase;
  iteration: number;
  branch: string;
  sandboxPath?: string;
  attempts: AttemptRecord[];
  failure?: { kind: FailureKind; summary: string };
}

export interface ObjectiveStreamView {
  id: string;
  phase: StreamPhase;
  iterations: number;
  mergeCommit?: string;
  failure?: { kind: FailureKind; summary: string };
}

export interface ObjectiveStatus {
  objectiveId: string;
  phase: ObjectivePhase;
  integrationBranch: string;
  baseCommit?: string;
  streams: ObjectiveStreamView[];
  /** Stream ids in the order they landed on the integration branch. */
  mergeOrder: string[];
  outcome?: ObjectiveOutcome;
}

export interface ObjectiveResult extends ObjectiveStatus {
  outcome: ObjectiveOutcome;
  integrationHead?: string;
}
