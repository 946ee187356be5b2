/** Built-in prompts for the builder and reviewer roles. */
import type { Feedback } from '../../core/types';
import type { AgentRole } from '../../core/states';

export interface PromptContext {
  role: AgentRole;
  objective: string;
  objectiveId: string;
  streamId: string;
  task: string;
  iteration: number;
  sourceBranch: string;
  targetBranch: string;
  feedback?: Feedback;
}

export function buildPrompt(ctx: PromptContext): string {
  const lines = [
    `Objective (${ctx.objectiveId}): ${ctx.objective}`,
    `Stream ${ctx.streamId}: ${ctx.task}`,
    `You work on branch ${ctx.sourceBranch}; it will be merged into ${ctx.targetBranch}.`,
  ];
  if (ctx.role === 'builder') {
    lines.push('', 'Make the change described by the stream task in this repository and commit it.');
    if (ctx.feedback) {
      lines.push('', `Iteration ${ctx.iteration}: the previous attempt failed (${ctx.feedback.kind}): ${ctx.feedback.summary}`, '', ctx.feedback.details);
      if (ctx.feedback.guidance) lines.push('', `Guidance from a human: ${ctx.feedback.guidance}`);
      if (ctx.feedback.history?.length) lines.push('', 'Recovery history so far:', ...ctx.feedback.history.map((h) => `- ${h}`));
    }
  } else if (ctx.role === 'planner') {
    lines.splice(1, 2);
    lines.push(
      '',
      'Split the objective into independent streams of work that can be built in parallel, each on its own branch.',
      'Answer with <plan>{"streams": [{"id": "short-id", "task": "what to build", "depends_on": []}]}</plan>.',
    );
    if (ctx.feedback) lines.push('', `The previous plan was rejected: ${ctx.feedback.summary}`, ctx.feedback.details);
  } else if (ctx.role === 'reviewer') {
    lines.push(
      '',
      'Review the change on this branch against the task.',
      'Answer with <review>{"verdict": "approve" | "reject", "summary": "...", "findings": ["..."]}</review>.',
    );
  }
  return lines.join('\n');
}

/** Context variables handed to agent processes (scripts read them; real agents get the prompt). */
export function contextEnv(ctx: PromptContext): Record<string, string> {
  return {
    SLIPWAY_ROLE: ctx.role,
    SLIPWAY_OBJECTIVE_ID: ctx.objectiveId,
    SLIPWAY_STREAM: ctx.streamId,
    SLIPWAY_TASK: ctx.task,
    SLIPWAY_ITERATION: String(ctx.iteration),
    SLIPWAY_SOURCE_BRANCH: ctx.sourceBranch,
    SLIPWAY_TARGET_BRANCH: ctx.targetBranch,
    SLIPWAY_FEEDBACK_KIND: ctx.feedback?.kind ?? '',
    SLIPWAY_FEEDBACK: ctx.feedback ? `${ctx.feedback.summary}\n${ctx.feedback.details}` : '',
    SLIPWAY_GUIDANCE: ctx.feedback?.guidance ?? '',
  };
}
