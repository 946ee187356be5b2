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
/** The stream sandbox workflow's id in 0.1.0 histories (the service's sandboxes use the same prefix). */
export const sandboxWorkflowId = (sandboxId: string) => `sandbox:${sandboxId}`;
/** A stream's sandbox workflow (workflows/sandbox.ts); distinct from the service's `sandbox:<id>`. */
export const streamSandboxWorkflowId = (sandboxId: string) => `stream-sandbox:${sandboxId}`;

/** A stream's sandbox id: unique per objective and stream. */
export const streamSandboxId = (objectiveId: string, streamId: string) => `${objectiveId}.${streamId}`;

export const BRANCH_PREFIX = 'slipway';
export const streamBranch = (objectiveId: string, streamId: string) => `${BRANCH_PREFIX}/${objectiveId}/${streamId}`;
export const integrationBranch = (objectiveId: string) => `${BRANCH_PREFIX}/${objectiveId}/integration`;

/** Agent activities run on their own queue so a few slow agents never starve git and gate work. */
export const agentTaskQueue = (mainTaskQueue: string) => `${mainTaskQueue}-agents`;

/**
 * The folder inside a repository where Slipway keeps its worktrees and state. Users keep files
 * there too (`config.yaml`, `blueprints/`, prompt files) that a team commits, so only
 * `SLIPWAY_STATE` is excluded via .git/info/exclude, never the whole folder.
 */
export const SLIPWAY_DIR = '.slipway';
export const WORKTREES_DIR = `${SLIPWAY_DIR}/worktrees`;

/**
 * Everything Slipway itself writes under `.slipway/` (a trailing `/` marks a folder): in the
 * repository, and `grants.json` inside a service sandbox's worktree (the exclude file is shared
 * by every worktree). A new entry must be added here (test/git-exclude.test.ts checks the code).
 */
export const SLIPWAY_STATE = [
  'worktrees/', // sandboxes' git worktrees
  'pool/', // the warm pool's prepared worktrees
  'sandboxes/', // sandbox records
  'git/', // confined sandboxes' private git folders
  'snapshots/', // suspended sandboxes
  'trash/', // worktrees being removed
  'disks/', // workspace disk images (disk_mb)
  'templates/', // prepared templates
  'template.json', // the template manifest
  '.env', // agent credentials: never committed
  'grants.json', // a service sandbox's grant tokens
  'agent-sessions/', // builders' agent sessions, carried between sandboxes and workers (activities/agents/session-carry.ts)
  'containers/', // container sandboxes' workspaces and records (activities/sandbox/container.ts)
  'container-templates/', // container templates' manifests and builds (activities/sandbox/container-template.ts)
  'daytona/', // Daytona sandboxes' local records (activities/sandbox/daytona.ts)
  'daytona-snapshot.json', // the prepared Daytona snapshot's manifest (activities/sandbox/daytona.ts)
  'kubernetes/', // Kubernetes sandboxes' local records (activities/sandbox/kubernetes.ts)
] as const;
export const MERGER_SANDBOX_NAME = '_merge';

/** Mailbox of the agent that acts on a blocked stream's guidance, e.g. `builder-api`. */
export const mailboxName = (role: string, streamId: string) => `${role}-${streamId}`;

/**
 * A worker's id names its own task queues (`<queue>@<worker id>`, Temporal's worker-specific
 * task queue pattern): letters, digits, ".", "_" and "-", at most 63 characters.
 */
export const WORKER_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** The owner of a sandbox any worker can reach (a remote provider's): routed to the shared queue. */
export const ANY_OWNER = 'any';
/** The task queue only the worker `workerId` polls, for the sandboxes it holds. */
export const ownerTaskQueue = (mainTaskQueue: string, workerId: string) => `${mainTaskQueue}@${workerId}`;

/** The objective workflow's status query, by name: `slipway status` asks it over HTTP without the SDK (ADR 0024). */
export const OBJECTIVE_STATUS_QUERY = 'objectiveStatus';

/** The janitor's schedule and workflow (activities/sandbox/janitor.ts); here so the CLI names them without loading it. */
export const JANITOR_SCHEDULE_ID = 'slipway-janitor';
export const JANITOR_WORKFLOW_ID = 'slipway-janitor';
export const JANITOR_INTERVAL_MS = 5 * 60_000;
