/** Lifecycle states and outcomes, each defined once. */
export const SANDBOX_STATES = ['pending', 'ready', 'suspending', 'suspended', 'restoring', 'terminating', 'terminated', 'failed'] as const;
export type SandboxState = (typeof SANDBOX_STATES)[number];

/** `cancelled`: stopped by `slipway cancel` (or a Temporal cancel request); what was merged stays. */
export const OBJECTIVE_OUTCOMES = ['completed', 'partial', 'failed', 'blocked', 'cancelled'] as const;
export type ObjectiveOutcome = (typeof OBJECTIVE_OUTCOMES)[number];

export const OBJECTIVE_PHASES = ['preparing', 'planning', 'awaiting_approval', 'running', 'merging', 'finishing', 'done'] as const;
export type ObjectivePhase = (typeof OBJECTIVE_PHASES)[number];

export const STREAM_PHASES = [
  'waiting', 'provisioning', 'building', 'gates', 'reviewing', 'scouting', 'merge_ready', 'merging', 'rate_limited',
  'blocked', 'merged', 'no_changes', 'escalated', 'failed',
] as const;
export type StreamPhase = (typeof STREAM_PHASES)[number];

export const AGENT_ROLES = ['builder', 'reviewer', 'planner', 'scout'] as const;
export type AgentRole = (typeof AGENT_ROLES)[number];

export const WORKFLOW_KINDS = ['objective', 'stream', 'sandbox', 'janitor', 'reaper'] as const;
export type WorkflowKind = (typeof WORKFLOW_KINDS)[number];

/** Stream phases after which the stream does no more work. */
export const FINAL_STREAM_PHASES: StreamPhase[] = ['merged', 'no_changes', 'escalated', 'failed'];

/** Results recorded in the recovery ledger. */
export const LEDGER_RESULTS = ['retrying', 'waiting', 'recovered', 'exhausted', 'blocked', 'guidance_applied', 'escalated', 'failed'] as const;
export type LedgerResult = (typeof LEDGER_RESULTS)[number];
