/**
 * Blueprint schema: a YAML state machine of steps that the objective and stream workflows
 * interpret. Pure (zod only), so workflows may import its types.
 */
import { z } from 'zod';
import { AGENT_ROLES } from './states';
import { RETRY_PROFILE_NAMES } from './retry-profiles';
import { ITERATION_CAPS } from './objective-schema';

export const EXHAUSTION_MODES = ['ask_human', 'escalate', 'fail'] as const;
export type ExhaustionMode = (typeof EXHAUSTION_MODES)[number];

/** Where a blueprint runs: the objective workflow or a stream workflow. */
export const BLUEPRINT_LEVELS = ['objective', 'stream'] as const;
export type BlueprintLevel = (typeof BLUEPRINT_LEVELS)[number];

/** Deterministic actions, the levels they may appear at, and what they do. */
export const ACTIONS = {
  run_quality_gates: { levels: ['stream', 'objective'], summary: 'run the configured gates in the sandbox (or on the integration branch)' },
  dispatch_streams: { levels: ['objective'], summary: "start one stream per work item with the objective's stream blueprint" },
  merge_queue: { levels: ['objective'], summary: 'merge ready streams one at a time into the integration branch; waits for all streams' },
  signal_merge_ready: { levels: ['stream'], summary: 'hand the stream to the merge queue and wait for the merge' },
  mark_complete: { levels: ['stream', 'objective'], summary: 'end successfully' },
} as const satisfies Record<string, { levels: readonly BlueprintLevel[]; summary: string }>;
export type ActionName = keyof typeof ACTIONS;
export const ACTION_NAMES = Object.keys(ACTIONS) as [ActionName, ...ActionName[]];

/** Which roles an agent step may take at each level. */
export const ROLE_LEVELS: Record<(typeof AGENT_ROLES)[number], readonly BlueprintLevel[]> = {
  planner: ['objective'],
  builder: ['stream'],
  reviewer: ['stream'],
  scout: ['stream', 'objective'],
};

const stepId = z.string().regex(/^[a-z][a-z0-9_-]{0,62}$/, 'must be lowercase letters, digits, "_" or "-", starting with a letter');

const RetrySchema = z.strictObject({
  max_attempts: z.number().int().min(1).max(20).optional(),
  on_exhausted: z.enum(EXHAUSTION_MODES).optional(),
});

const stepBase = {
  id: stepId,
  description: z.string().optional(),
  /** The step after success; none ends the blueprint. */
  next: stepId.optional(),
  /** The step to go back to on failure (a fix loop), bounded by max_fix_iterations. */
  on_fail: stepId.optional(),
  max_fix_iterations: z.number().int().min(0).max(ITERATION_CAPS.maxFixIterations).optional(),
  retry: RetrySchema.optional(),
  /** An optional step is skipped when it has nothing to do (a planner when streams are given). */
  optional: z.boolean().optional(),
};

export const AgentStepSchema = z.strictObject({
  ...stepBase,
  type: z.literal('agent'),
  role: z.enum(AGENT_ROLES),
});

export const DeterministicStepSchema = z.strictObject({
  ...stepBase,
  type: z.literal('deterministic'),
  action: z.enum(ACTION_NAMES),
});

export const HumanStepSchema = z.strictObject({
  ...stepBase,
  type: z.literal('human'),
  /** What the human is asked. */
  prompt: z.string().optional(),
});

export const BlueprintRefStepSchema = z.strictObject({
  ...stepBase,
  type: z.literal('blueprint_ref'),
  ref: stepId,
  foreach: z.literal('work_item').optional(),
});

export const StepSchema = z.discriminatedUnion('type', [AgentStepSchema, DeterministicStepSchema, HumanStepSchema, BlueprintRefStepSchema]);
export type Step = z.infer<typeof StepSchema>;
export type StepType = Step['type'];

export const BlueprintSchema = z.strictObject({
  id: stepId,
  description: z.string().optional(),
  level: z.enum(BLUEPRINT_LEVELS),
  retry: z
    .strictObject({
      profile: z.enum(RETRY_PROFILE_NAMES),
      /** First back-off between activity attempts (doubling each time, at most a minute). */
      initial_interval_seconds: z.number().positive().max(600).optional(),
    })
    .default({ profile: 'balanced' }),
  /** Default bound for fix loops of steps that set none. */
  max_fix_iterations: z.number().int().min(0).max(ITERATION_CAPS.maxFixIterations).default(3),
  /** What happens when recovery is exhausted, unless a step says otherwise. */
  on_exhausted: z.enum(EXHAUSTION_MODES).default('ask_human'),
  /** First step; defaults to the first in the list. */
  start: stepId.optional(),
  steps: z.array(StepSchema).min(1),
});
export type Blueprint = z.infer<typeof BlueprintSchema>;
export type BlueprintInput = z.input<typeof BlueprintSchema>;
