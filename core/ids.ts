/**
 * Human-readable identifiers: workflow IDs, branch names and task queues.
 * Pure functions, shared by workflows, activities and the CLI.
 */

/** Objective and stream ids become git ref components and workflow ids. */
export const ID_PATTERN = /^[a-z0-9](?:[a-z0-9_-]{0,62})$/;
export const ID_RULE = 'lowercase letters, digits, "-" and "_", starting with a letter or digit, at most 63 characters';

/** Names a stream may not take because Slipway uses them itself. */
export const RESERVED_STREAM_IDS = ['integration', '_merge'] as const;

export const DEFAULT_TASK_QUEUE = 'slipway';

export const objectiveWorkflowId = (objectiveId: string) => `objective:${objectiveId}`;
export const streamWorkflowId = (objectiveId: string, streamId: string) => `stream:${objectiveId}:${streamId}`;
export const sandboxWorkflowId = (sandboxId: string) => `sandbox:${sandboxId}`;

/** A stream's sandbox id: unique per objective and stream. */
export const streamSandboxId = (objectiveId: string, streamId: string) => `${objectiveId}.${streamId}`;

export const BRANCH_PREFIX = 'slipway';
export const streamBranch = (objectiveId: string, streamId: string) => `${BRANCH_PREFIX}/${objectiveId}/${streamId}`;
export const integrationBranch = (objectiveId: string) => `${BRANCH_PREFIX}/${objectiveId}/integration`;

/** Agent activities run on their own queue so a few slow agents never starve git and gate work. */
export const agentTaskQueue = (mainTaskQueue: string) => `${mainTaskQueue}-agents`;

/** The folder inside a repository where Slipway keeps its worktrees; excluded via .git/info/exclude. */
export const SLIPWAY_DIR = '.slipway';
export const WORKTREES_DIR = `${SLIPWAY_DIR}/worktrees`;
export const MERGER_SANDBOX_NAME = '_merge';

/** Mailbox of the agent that acts on a blocked stream's guidance, e.g. `builder-api`. */
export const mailboxName = (role: string, streamId: string) => `${role}-${streamId}`;
