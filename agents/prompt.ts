/**
 * What an agent is told: the built-in prompts (used when a role configures no `prompt` or
 * `prompt_file`), the values of the built-in template keys, and the pieces Slipway adds to any
 * prompt (failure feedback, the structured answer format, a correction request).
 */
import type { Feedback } from '../core/types';
import type { AgentRole } from '../core/states';
import type { BuiltinTemplateKey } from './template';

export interface PromptContext {
  role: AgentRole;
  objective: string;
  objectiveId: string;
  streamId: string;
  task: string;
  /** Builder runs of the stream so far, this one included (the fix-loop iteration). */
  iteration: number;
  /** This run within the step's iteration loop (1-based), and the loop's bound. */
  agentIteration: number;
  maxIterations: number;
  completionSignals: string[];
  sourceBranch: string;
  targetBranch: string;
  feedback?: Feedback;
  /** Reviewer runs after a merge-conflict rebuild: the conflict and the stream's earlier change. */
  rebuilt?: string;
}

/** What a reviewer of a rebuilt stream is told: both intents, and that overwriting one is a rejection. */
export function rebuildSection(ctx: PromptContext): string[] {
  if (!ctx.rebuilt) return [];
  return [
    `This change was rebuilt on top of ${ctx.targetBranch} after it conflicted with work already merged there.`,
    `Both intents must survive: the merged work (see \`git log -p ${ctx.targetBranch}\` for the conflicting files) and this stream's task.`,
    'Reject the change if it drops, reverts or overwrites the merged work instead of combining both.',
    '',
    ctx.rebuilt,
  ];
}

/** The tag and shape of a role's structured answer (reviewer, planner). */
export const ANSWER_FORMATS: Partial<Record<AgentRole, { tag: string; instruction: string }>> = {
  reviewer: {
    tag: 'review',
    instruction: 'Answer with <review>{"verdict": "approve" | "reject", "summary": "...", "findings": ["..."]}</review>.',
  },
  planner: {
    tag: 'plan',
    instruction: 'Answer with <plan>{"streams": [{"id": "short-id", "task": "what to build", "depends_on": []}]}</plan>.',
  },
};

/** The failure sent back to a builder, as the built-in prompt words it. */
export function feedbackSection(ctx: PromptContext): string[] {
  const f = ctx.feedback;
  if (!f) return [];
  const lines = [`Iteration ${ctx.iteration}: the previous attempt failed (${f.kind}): ${f.summary}`, '', f.details];
  if (f.guidance) lines.push('', `Guidance from a human: ${f.guidance}`);
  if (f.history?.length) lines.push('', 'Recovery history so far:', ...f.history.map((h) => `- ${h}`));
  return lines;
}

function completionInstruction(ctx: PromptContext): string[] {
  if (ctx.maxIterations <= 1) return [];
  return [
    '',
    `This is run ${ctx.agentIteration} of at most ${ctx.maxIterations}. When the task is completely done, print ${ctx.completionSignals[0]} on its own line; until then you will be run again.`,
  ];
}

export function buildPrompt(ctx: PromptContext): string {
  const lines = [
    `Objective (${ctx.objectiveId}): ${ctx.objective}`,
    `Stream ${ctx.streamId}: ${ctx.task}`,
    `You work on branch ${ctx.sourceBranch}; it will be merged into ${ctx.targetBranch}.`,
  ];
  if (ctx.role === 'builder') {
    lines.push('', 'Make the change described by the stream task in this repository and commit it.');
    if (ctx.feedback) lines.push('', ...feedbackSection(ctx));
    lines.push(...completionInstruction(ctx));
  } else if (ctx.role === 'planner') {
    lines.splice(1, 2);
    lines.push(
      '',
      'Split the objective into independent streams of work that can be built in parallel, each on its own branch.',
      ANSWER_FORMATS.planner!.instruction,
    );
    if (ctx.feedback) lines.push('', `The previous plan was rejected: ${ctx.feedback.summary}`, ctx.feedback.details);
  } else if (ctx.role === 'reviewer') {
    lines.push('', 'Review the change on this branch against the task.', ANSWER_FORMATS.reviewer!.instruction);
    if (ctx.rebuilt) lines.push('', ...rebuildSection(ctx));
  } else {
    lines.push(...completionInstruction(ctx));
  }
  return lines.join('\n');
}

/** Values of the built-in template keys for one agent run. */
export function builtinValues(ctx: PromptContext): Record<BuiltinTemplateKey, string> {
  const f = ctx.feedback;
  const gate = f && (f.kind === 'quality_gate_failure' || f.kind === 'post_merge_gate_failure');
  return {
    SOURCE_BRANCH: ctx.sourceBranch,
    TARGET_BRANCH: ctx.targetBranch,
    OBJECTIVE: ctx.objective,
    OBJECTIVE_ID: ctx.objectiveId,
    STREAM: ctx.streamId,
    TASK: ctx.task,
    ITERATION: String(ctx.agentIteration),
    MAX_ITERATIONS: String(ctx.maxIterations),
    FIX_ITERATION: String(ctx.iteration),
    GATE_OUTPUT: gate ? f.details : '',
    REVIEW_FEEDBACK: f?.kind === 'review_rejection' ? [f.summary, f.details].filter(Boolean).join('\n') : '',
    LEDGER: f?.history?.join('\n') ?? '',
    GUIDANCE: f?.guidance ?? '',
    FEEDBACK: f ? [`${f.kind}: ${f.summary}`, f.details].filter(Boolean).join('\n\n') : '',
    REBUILD: rebuildSection(ctx).join('\n'),
  };
}

/** Asks again after a structured answer that could not be used, saying why. */
export function correctionRequest(role: AgentRole, error: string): string {
  const format = ANSWER_FORMATS[role];
  return [
    `Your previous answer could not be used: ${error}`,
    format ? `${format.instruction} Put exactly one <${format.tag}> block in your answer, holding valid JSON.` : '',
  ]
    .filter(Boolean)
    .join('\n');
}

/** Context variables handed to agent processes (scripts read them; real agents get the prompt). */
export function contextEnv(ctx: PromptContext): Record<string, string> {
  return {
    SLIPWAY_ROLE: ctx.role,
    SLIPWAY_OBJECTIVE_ID: ctx.objectiveId,
    SLIPWAY_STREAM: ctx.streamId,
    SLIPWAY_TASK: ctx.task,
    SLIPWAY_ITERATION: String(ctx.iteration),
    SLIPWAY_AGENT_ITERATION: String(ctx.agentIteration),
    SLIPWAY_MAX_ITERATIONS: String(ctx.maxIterations),
    SLIPWAY_SOURCE_BRANCH: ctx.sourceBranch,
    SLIPWAY_TARGET_BRANCH: ctx.targetBranch,
    SLIPWAY_FEEDBACK_KIND: ctx.feedback?.kind ?? '',
    SLIPWAY_FEEDBACK: ctx.feedback ? `${ctx.feedback.summary}\n${ctx.feedback.details}` : '',
    SLIPWAY_GUIDANCE: ctx.feedback?.guidance ?? '',
    SLIPWAY_REBUILD: rebuildSection(ctx).join('\n'),
  };
}
