/**
 * The sandbox service's shared vocabulary: ids, reasons, session kinds, the policy a sandbox
 * runs under, and the workflow's input. Defined once; the API, the billing database, the workflow and
 * the CLI import from here. Everything in this file is safe to keep in workflow history:
 * no token, no grant secret, only ids and hashes.
 */
import type { KubernetesSettings } from './kubernetes';
import type { SandboxState } from './states';

export const SANDBOX_ID_PREFIX = 'sbx_';
/** `sbx_` + 20 characters of lowercase base32: path-safe, branch-safe, workflow-id-safe. */
export const SANDBOX_ID_PATTERN = /^sbx_[a-z2-7]{20}$/;

/** The service's task queue: only service workers (which hold the billing database) poll it. */
export const sandboxServiceTaskQueue = (mainTaskQueue: string) => `${mainTaskQueue}-sandboxes`;
export const serviceSandboxWorkflowId = (sandboxId: string) => `sandbox:${sandboxId}`;
/** The id one release used for every deployment's reaper schedule: replaced, on start, by the queue's own. */
export const LEGACY_REAPER_SCHEDULE_ID = 'slipway-sandbox-reaper';
/**
 * The reaper's schedule, one per service task queue: deployments sharing a Temporal namespace
 * (different SLIPWAY_TASK_QUEUE) each keep their own instead of overwriting one another's target
 * queue and, with different payload keys, failing to read each other's schedule at start.
 */
export const reaperScheduleId = (serviceTaskQueue: string) => `slipway-sandbox-reaper:${serviceTaskQueue}`;
export const reaperWorkflowId = 'sandbox-reaper';

/** Group (folder) under `.slipway/worktrees/` that holds an account's local sandboxes. */
export const serviceSandboxGroup = (accountId: string) => `acct-${accountId}`;
export const serviceSandboxBranch = (sandboxId: string) => `slipway/sandboxes/${sandboxId}`;
export const WARM_GROUP = 'warm';

/** States in which a sandbox holds one of its account's concurrency slots. */
export const SLOT_HOLDING_STATES = ['pending', 'ready', 'suspending', 'suspended', 'restoring'] as const satisfies readonly SandboxState[];
export const TERMINAL_STATES = ['terminated', 'failed'] as const satisfies readonly SandboxState[];

/**
 * Why a billing session (or the sandbox) ended. The first group is the proposal's
 * ready -> terminating edges; abnormal ends come from the provider watcher.
 */
export const END_REASONS = {
  explicit_delete: 'DELETE /api/v1/sandboxes/:id',
  deadline: 'the deadline passed (timer or reaper)',
  absolute_cap: 'the absolute lifetime cap passed',
  idle_offload: 'idle: the sandbox was suspended to a snapshot',
  restored: 'the snapshot was restored (storage line closes)',
  restore_failed: 'the snapshot could not be restored',
  provisioning_timeout: 'provisioning did not finish in time',
  provisioning_failed: 'the provider could not create the sandbox',
  directory_removed: 'the sandbox directory disappeared outside Slipway',
  worktree_unregistered: 'the git worktree was removed outside Slipway',
  sandbox_lost: 'the provider no longer knows the sandbox',
  oom_killed: "the kernel's OOM killer ended the sandbox's container",
  evicted: 'the node evicted the sandbox pod (node pressure)',
  deleted: 'the sandbox pod was deleted outside Slipway',
  node_lost: "the sandbox pod's node stopped reporting",
  orphaned: 'the sandbox workflow is gone; the reaper closed the books',
  account_disabled: "the account's sandboxes were turned off (`slipway account set --disable`)",
} as const;
export type EndReason = keyof typeof END_REASONS;
export const ABNORMAL_END_REASONS = ['directory_removed', 'worktree_unregistered', 'sandbox_lost', 'oom_killed', 'evicted', 'deleted', 'node_lost'] as const satisfies readonly EndReason[];
export type AbnormalEndReason = (typeof ABNORMAL_END_REASONS)[number];
/** Reasons a caller or a timer can ask a sandbox to terminate for. */
export const TERMINATE_REASONS = ['explicit_delete', 'deadline', 'absolute_cap', ...ABNORMAL_END_REASONS, 'orphaned', 'account_disabled'] as const satisfies readonly EndReason[];
export type TerminateReason = (typeof TERMINATE_REASONS)[number];

/** Billing lines: compute while ready, snapshot storage while suspended. */
export const SESSION_KINDS = ['compute', 'snapshot_storage'] as const;
export type SessionKind = (typeof SESSION_KINDS)[number];

/** How a sandbox became ready (logged with the session per the proposal). */
export const PROVISIONING_KINDS = ['warm_hit', 'cold_boot'] as const;
export type ProvisioningKind = (typeof PROVISIONING_KINDS)[number];

export const PLATFORMS = ['linux', 'macos'] as const;
export type Platform = (typeof PLATFORMS)[number];

/** `podman`, `docker`: container sandboxes (ADR 0012); the container is their confinement. */
export const SERVICE_PROVIDERS = ['local', 'podman', 'docker', 'daytona', 'kubernetes'] as const;
export type ServiceProviderKind = (typeof SERVICE_PROVIDERS)[number];

/** Defaults from the proposal; each profile may override them. */
export const SERVICE_DEFAULTS = {
  idleTimeoutSeconds: 5 * 60,
  provisioningTimeoutSeconds: 120,
  defaultDeadlineMinutes: 60,
  maxDeadlineMinutes: 24 * 60,
  absoluteCapMinutes: 7 * 24 * 60,
  concurrentLimit: 1,
  /** Grant tokens live at most this long, and never past the sandbox's deadline. */
  grantTtlMinutes: 60,
  /** Tenants run untrusted code: confined, and offline unless the profile says otherwise. */
  confinement: 'bubblewrap',
  network: false,
} as const;

/**
 * Set (to 1 or true) to let the service run profiles with `confinement: none`: the tenant's
 * commands then run on the host as the server's user. For single-tenant setups only.
 */
export const ALLOW_UNCONFINED_ENV = 'SLIPWAY_ALLOW_UNCONFINED';
export const allowUnconfinedFromEnv = (env: NodeJS.ProcessEnv = process.env) => /^(1|true|yes)$/i.test(env[ALLOW_UNCONFINED_ENV] ?? '');

/** Where grant tokens are written inside a sandbox (ignored by git: `.slipway/` is excluded). */
export const GRANTS_FILE = '.slipway/grants.json';

/** A profile, as the workflow needs it. Copied into the workflow input at create time. */
export interface SandboxPolicy {
  profileId: string;
  profileName: string;
  provider: ServiceProviderKind;
  platform: Platform;
  /** The repository each sandbox starts from (local: a worktree of it; containers: a bundle of it), and the ref. */
  repository: string;
  baseRef: string;
  copyIgnored: boolean;
  confinement: 'none' | 'bubblewrap';
  network: boolean;
  /** From the profile's `resources`: enforced for every command under bubblewrap. */
  limits?: SandboxLimits;
  idleTimeoutMs: number;
  provisioningTimeoutMs: number;
  absoluteCapMs: number;
  warmReplicas: number;
  /** provider: kubernetes: the profile's pod settings (over the worker's SLIPWAY_KUBE_* defaults) and its warm pods (ADR 0029). */
  kubernetes?: { settings: KubernetesSettings; warmPool: number };
}

/**
 * Enforced limits of a sandbox's commands: the one shape for objectives, profiles and the
 * provider (activities/sandbox/limits.ts enforces them; core/limits.ts reads them from config).
 */
export interface SandboxLimits {
  /** Most processes (and threads) alive at once in the command's tree. */
  pids?: number;
  /** Memory (resident, swap included where the kernel can count it); prlimit fallback: address space. */
  memoryBytes?: number;
  /** CPU quota in CPUs, fractional (0.5 = half of one CPU). */
  cpus?: number;
  /** Largest file any process of the command may write (RLIMIT_FSIZE; beyond it: EFBIG / SIGXFSZ). */
  fileSizeBytes?: number;
  /** Total CPU seconds per process (RLIMIT_CPU; SIGXCPU, then SIGKILL). */
  cpuSeconds?: number;
  /** The workspace's total size: its own ext4 image (activities/sandbox/disk.ts); ENOSPC beyond it. */
  diskBytes?: number;
}

export interface GrantRequest {
  projectId: string;
  scopes: string[];
}

export interface ServiceSandboxInput {
  sandboxId: string;
  accountId: string;
  policy: SandboxPolicy;
  /** Deadline budget: time the sandbox may spend not suspended. */
  deadlineMs: number;
  /** Epoch ms of the POST; the absolute cap counts from here. */
  createdAtMs: number;
  grants: GrantRequest[];
  /** Present after continue-as-new: where the previous run left off. */
  carried?: CarriedSandboxState;
  /** Continue as new after this many ready/suspended periods (tests); default: when Temporal suggests. */
  continueAsNewAfterPeriods?: number;
}

/** What a sandbox workflow hands to its next run on continue-as-new. */
export interface CarriedSandboxState {
  state: Extract<SandboxState, 'ready' | 'suspended'>;
  handle: SandboxHandleRef;
  snapshotRef?: string;
  computeSeq: number;
  storageSeq: number;
  deadlineRemainingMs: number;
  /** Epoch ms when the current ready or suspended period began. */
  periodStartMs: number;
  /** A terminate request, exit report or wake that arrived during the switch: the next run takes it first. */
  pending?: { terminate?: TerminateReason; exit?: SandboxExitReport; wake?: boolean };
}

/** How the workflow refers to a provider's sandbox: paths and names, no secrets. */
export interface SandboxHandleRef {
  provider: ServiceProviderKind;
  repository: string;
  root: string;
  branch: string;
}

export interface ServiceSandboxResult {
  sandboxId: string;
  state: Extract<SandboxState, 'terminated' | 'failed'>;
  reason?: EndReason;
  error?: string;
}

export interface ServiceSandboxStatus {
  sandboxId: string;
  state: SandboxState;
  handle?: SandboxHandleRef;
  deadlineRemainingMs: number;
  computeSeq: number;
  storageSeq: number;
  reason?: EndReason;
  error?: string;
}

export interface SandboxExitReport {
  reason: AbnormalEndReason;
  /** When the provider saw it die (epoch ms): the compute session ends here. */
  observedAtMs: number;
  detail?: string;
}

/**
 * A streamed exec through a remote owner (ADR 0026): the owner's activity sends the command's
 * output to its call workflow in batches by this signal; the API takes them with the update
 * `takeExecOutput` (a long poll: it returns once there is output after `after`, or the end).
 */
export const EXEC_OUTPUT_SIGNAL = 'execOutput';
export const TAKE_EXEC_OUTPUT_UPDATE = 'takeExecOutput';

/** One piece of a streamed exec's output, numbered from 1 in the order the owner read it. */
export interface StreamedOutputChunk {
  seq: number;
  stream: 'stdout' | 'stderr';
  base64: string;
}

/** How a streamed exec through the owner ended. */
export interface StreamedExecEnd {
  exitCode: number | null;
  signal: string | null;
  timedOut: boolean;
  durationMs: number;
}

/** An account id: lower-case letters, digits and '-', at most 40 (here, not in the billing records, so the CLI's help need not load them). */
export const ACCOUNT_ID_PATTERN = /^[a-z0-9][a-z0-9-]{0,39}$/;
