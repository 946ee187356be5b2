/**
 * Workflow inputs, messages and results. Only data that is safe to keep in Temporal history:
 * no credentials, no environment values.
 */
import type { KubernetesSettings } from './kubernetes';
import type { SandboxLimits } from './sandbox-service';
import type { AgentSpec, GateSpec, StreamSpec } from './objective-schema';
import type { FailureKind } from './failures';
import type { AgentRole, LedgerResult, ObjectiveOutcome, ObjectivePhase, SandboxState, StreamPhase } from './states';
import type { Blueprint, ExhaustionMode } from './blueprint-schema';
import type { BudgetSpec, ObjectiveBudget, StreamBudget } from './budget';
import type { RepositoryUrlProtocol } from './repository-spec';

export type { AgentSpec, GateSpec, StreamSpec, Blueprint, ExhaustionMode };

export type AgentSpecs = Partial<Record<AgentRole, AgentSpec>>;

/** A blueprint with every blueprint it references, resolved before the run starts. */
export interface ResolvedBlueprints {
  root: Blueprint;
  refs: Record<string, Blueprint>;
}

/** A remote repository as the objective's input names it: never credentials (ADR 0012). */
export interface RemoteRepository {
  url: string;
  protocol: RepositoryUrlProtocol;
  /** `base_branch` as given; unset means the remote's default branch. */
  baseBranch?: string;
  commit?: string;
}

/** The resolved objective: absolute paths, defaults applied. The objective workflow's input. */
export interface ObjectiveInput {
  id: string;
  objective: string;
  /**
   * Absolute path of the user's repository. For a remote repository (`remote`), the URL as
   * written until the worker that prepares the objective made its clone; the workflow then
   * carries that clone's path (docs/adr/0028).
   */
  repository: string;
  /** Empty for a remote repository whose base branch is its default branch, until resolved on the owner. */
  baseBranch: string;
  /**
   * A remote repository (URL or bare repository path): the worker that takes `prepareObjective`
   * clones or fetches it under its own SLIPWAY_HOME, with its own git credentials (never in here).
   * `commit` is the base commit once resolved there.
   */
  remote?: RemoteRepository;
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
  /** How sandboxes are made and confined (the file's `sandbox:` section); absent: defaults. */
  sandbox?: SandboxOptions;
  /** Spending limits (`budget:`); absent: none. */
  budget?: BudgetSpec;
  /** Objective history events after which the run continues as new (default 8,000; tests set it low). */
  continueAsNewAfterEvents?: number;
  /** Set by the objective itself when it continues as new: where the previous run stopped. */
  resume?: ObjectiveCarry;
  /** How long a sandbox's owner may be unreachable before it is given up (SLIPWAY_OWNER_GRACE_SECONDS; default core/routing.ts). */
  ownerGraceSeconds?: number;
}

/**
 * What an objective run hands to the next when it continues as new (in the merge queue, with
 * no merge in flight). Its streams keep running (started with `ParentClosePolicy.ABANDON`) and
 * are known by id; they report their end through their final event.
 */
export interface ObjectiveCarry {
  /** Runs before this one. */
  runs: number;
  prepared: { integrationBranch: string; baseCommit: string; mergerPath: string; integrationTip: string; owner?: string };
  integrationTip?: string;
  status: ObjectiveStatus;
  /** The last feed lines and the feed's sequence number (watchers keep their cursor). */
  feed: { events: FeedEvent[]; seq: number };
  streams: StreamSpec[];
  /** Key of the stream blueprint in `blueprint.refs`. */
  streamBlueprint: string;
  /** The interpreter's step holding the merge queue; absent: the queue after the blueprint ended. */
  step?: string;
  fixCounts: Record<string, number>;
  /** Merge requests not yet taken. */
  mergeQueue: MergeRequest[];
  /** Streams started and not ended. */
  running: string[];
  /** The planner's usage (the streams' is in their views). */
  plannerUsage: TokenTotals;
}

/**
 * The objective file's `sandbox:` section, resolved (absolute paths). Applies to every sandbox
 * of the objective: streams and the merger. No secrets: commands and paths only.
 */
export interface SandboxOptions {
  /** Where the objective's stream sandboxes run (absent: local; the merger is always local). */
  provider?: 'local' | 'podman' | 'docker' | 'daytona' | 'kubernetes';
  /** With provider kubernetes: the pods' settings (`sandbox.kubernetes`, ADR 0020). */
  kubernetes?: KubernetesSettings;
  /** `bubblewrap`: every command in the sandbox (agents, gates, setup) runs confined. */
  confinement: 'none' | 'bubblewrap';
  /** Under bubblewrap: false gives the sandbox a network namespace with loopback only. */
  network: boolean;
  /** Copy the checkout's git-ignored files (dependencies, .env) into new sandboxes. */
  copyIgnored: boolean;
  /** Run once after creation; `verify` checks after, a failing check retries setup. */
  projectSetup?: ProjectSetupSpec;
  /** Ready worktrees kept per repository and base commit (0: no pool). */
  warmPool: number;
  /** Under bubblewrap: extra absolute paths commands may write (agent state such as ~/.claude). */
  writable?: string[];
  /** Under bubblewrap: absolute paths hidden behind an empty tmpfs (~/.ssh, ~/.aws). */
  hidden?: string[];
  /** Under bubblewrap: absolute paths kept readable although they live under the private /tmp (the objective folder). */
  readable?: string[];
  /** Under bubblewrap: enforced limits of every command. */
  limits?: SandboxLimits;
  /** Seconds between two probes of a stream's sandbox (`sandbox.probe_seconds`; default DEFAULT_SANDBOX_PROBE_SECONDS). */
  probeSeconds?: number;
}

export interface ProjectSetupSpec {
  commands: string[];
  verify: string[];
  /** Limit for each command. */
  timeoutSeconds: number;
  /** Setup runs at most this many times before the sandbox fails (a failing verify retries it). */
  attempts: number;
}

export interface SandboxInfo {
  sandboxId: string;
  provider: 'local' | 'podman' | 'docker' | 'daytona' | 'kubernetes';
  path: string;
  branch: string;
  baseCommit: string;
  headCommit: string;
  /**
   * The worker that holds the sandbox (its id), or `any` when every worker reaches it; every
   * later activity on it runs there (core/routing.ts). Absent in sandboxes made before owners existed.
   */
  owner?: string;
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
  /** Signal the owner when the sandbox ended (an owner that continues as new needs it); probe that it still runs. */
  notifyOwnerOnEnd?: boolean;
  /** How often to probe the owner (default hourly; tests set it short). */
  ownerProbeMs?: number;
  /** The objective's sandbox settings; recorded with the sandbox, so every command in it honours them. */
  options?: SandboxOptions;
  /** The objective's owner grace time (ObjectiveInput.ownerGraceSeconds). */
  ownerGraceSeconds?: number;
  /** Events after which the workflow continues as new (default SANDBOX_HISTORY_LIMIT; tests set it low). */
  historyLimit?: number;
  /** Set by the sandbox workflow when it continues as new: the sandbox it already made and told its owner of. */
  carried?: { info: SandboxInfo; ownerProbeDueMs?: number };
}

export interface SandboxResult {
  sandboxId: string;
  state: Extract<SandboxState, 'terminated' | 'failed'>;
  error?: string;
  /** The sandbox workflow that ended (owned sandboxes): a stream that replaced it ignores the old one's end. */
  workflowId?: string;
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
  /** Some of `costUsd` is estimated from model prices (runs whose agent reported no cost). */
  estimated?: boolean;
  /** Runs whose agent reports no token counts (Copilot) are in `runs` but not in the figures. */
  usageUnknownRuns?: number;
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
  /** The session to resume was gone: the run started a fresh one with the full context (why). */
  resumeFailed?: string;
  inputTokens: number;
  outputTokens: number;
  cachedTokens: number;
  costUsd?: number;
  /** `costUsd` is estimated from the model's price (core/prices.ts): the agent reported none. */
  estimated?: true;
  /** The agent reports no token counts (Copilot): the token figures are zeros meaning unknown. */
  usageUnknown?: true;
  toolCalls: number;
  durationMs: number;
  /** `signalled`: the output held a completion signal; `invalid_output`: its structured answer did not validate. */
  /** `budget_stopped`: stopped at its stream's allowance (`budget.hard_limit`); its usage so far counts. */
  result: 'finished' | 'signalled' | 'invalid_output' | 'budget_stopped';
  /** `grace_killed`: its process group was killed once the grace period after its completion signal or final result ran out. */
  ended: 'exited' | 'grace_killed';
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
  /** The objective's sandbox settings, handed to the stream's sandbox. */
  sandbox?: SandboxOptions;
  /** The stream's budget (its limit, and whether the objective's is spent); absent: none. */
  budget?: StreamBudget;
  /** Tests: how often the stream's sandbox checks that the stream still runs (default hourly). */
  sandboxOwnerProbeMs?: number;
  /** Events after which the stream's sandbox workflow continues as new (default SANDBOX_HISTORY_LIMIT; tests set it low). */
  sandboxHistoryLimit?: number;
  /** The objective's owner grace time (ObjectiveInput.ownerGraceSeconds). */
  ownerGraceSeconds?: number;
}

export interface MergeRequest {
  streamId: string;
  branch: string;
  headCommit: string;
}

export type MergeDecision =
  | { status: 'merged'; commit: string }
  /** The stream's work brings nothing over the integration branch: nothing was merged. */
  | { status: 'no_changes'; summary: string }
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
  status: 'merged' | 'no_changes' | 'failed' | 'escalated';
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
  /** When it happened in the stream (events travel in batches); absent from streams of 0.1.0. */
  at?: string;
  phase: StreamPhase;
  text: string;
  iteration: number;
  blocked?: BlockedInfo | null;
  ledger?: LedgerEntry;
  usage?: TokenTotals;
  /** An agent run that just ended. */
  agentRun?: AgentRunRecord;
  /** The stream's work is ready to merge: its request rides in the batch (patch `merge-request-in-events`). */
  mergeRequest?: MergeRequest;
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
  /** The spending limits with the raises so far; absent: no budget. */
  budget?: ObjectiveBudget;
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
