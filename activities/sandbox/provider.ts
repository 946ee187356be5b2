/**
 * The sandbox provider contract. Local worktrees implement it now; Daytona and Kubernetes
 * providers implement the same interface and pass the same contract suite (test/sandbox/contract.ts).
 */
import type { Readable, Writable } from 'node:stream';
import type { RunResult } from '../process';
import type { Duplex } from 'node:stream';
import type { BubblewrapConfinement } from './bubblewrap';
import type { ContainerSettings } from './container';
import type { KubernetesSettings } from '../../core/kubernetes';
import type { FileEntry, FileIoOptions, OpenedFile } from './file-io';

/** Commands that prepare a new sandbox (`npm ci`), and checks that it is ready. */
export interface ProjectSetup {
  commands: string[];
  verify: string[];
  /** Limit for each command (default 5 minutes). */
  timeoutMs?: number;
  /** Setup runs at most this many times; a failing command or check retries it (default 2). */
  attempts?: number;
}

export interface SandboxCreateRequest {
  sandboxId: string;
  repository: string;
  /** Group the sandbox belongs to (an objective id, or an account's project). */
  group: string;
  /** Directory name inside the group. */
  name: string;
  branch: string;
  /** Branch or commit to start from. */
  base: string;
  /**
   * Copy the checkout's git-ignored files (node_modules, .env, ...) into the new sandbox;
   * `.worktreeinclude` at the repository root limits which. Default: the provider's setting.
   */
  copyIgnored?: boolean;
  /**
   * Confinement for this sandbox, recorded with it: every later exec in it (agents, gates,
   * setup) runs under it. A provider configured with its own confinement keeps it (the stricter
   * network setting wins).
   */
  confinement?: BubblewrapConfinement;
  /** Which provider makes it (a router's choice; default local). The merger worktree is always local. */
  provider?: 'local' | 'podman' | 'docker' | 'daytona' | 'kubernetes';
  /** For container providers: network, limits, read-only host paths (ADR 0012). */
  container?: ContainerSettings;
  /** For `kubernetes`: namespace, image, nodeSelector, tolerations, resources, service account, workspace volume (ADR 0020). */
  kubernetes?: KubernetesSettings;
  /** Run after creation (under the sandbox's confinement); a failure fails the create with the output. */
  setup?: ProjectSetup;
  /** Keep this many ready sandboxes for the repository and base commit; create claims one (0: off). */
  warmPool?: number;
  /** Cancels a long create (setup commands are killed with their process group). */
  signal?: AbortSignal;
  /** Progress lines (setup output), for heartbeats. */
  onProgress?: (line: string) => void;
}

export interface SandboxHandle {
  sandboxId: string;
  provider: string;
  /** Root of the sandbox filesystem as seen by exec (absolute). */
  root: string;
  branch: string;
  baseCommit: string;
  headCommit: string;
  /** True when create found an existing sandbox and reused it (idempotent retry). */
  reused: boolean;
  /** What copying ignored files did on this create (absent when reused or not asked). */
  ignoredCopy?: {
    /** Number of top-level paths copied. */
    paths: number;
    warnings: string[];
    method: string;
    limitedByIncludeFile: boolean;
    durationMs: number;
  };
  /** Where the sandbox came from: the warm pool, a cold create, or a cold create filled from the prepared template. */
  origin?: 'pool' | 'cold' | 'template';
  /** What project setup did (absent when there was none or the sandbox was reused). */
  setup?: { attempts: number; commandsRun: number; durationMs: number };
  /** Milliseconds the create took. */
  durationMs?: number;
}

/** The minimal environment of a command that does not inherit the worker's (`inheritEnv: false`). */
export const SANDBOX_BASE_ENV: Record<string, string> = {
  PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
  LANG: 'C.UTF-8',
};

export interface ExecRequest {
  command: string;
  args?: string[];
  shell?: boolean;
  /** Working directory relative to the sandbox root. */
  cwd?: string;
  env?: Record<string, string>;
  /**
   * False: the command sees only `env` (plus PWD), never the worker's environment; values travel
   * in the process environment, never in argv. Default true (agents need PATH, HOME, credentials).
   */
  inheritEnv?: boolean;
  /**
   * An agent's run: under confinement, HOME is the sandbox's private agent home (sandbox-git.ts
   * `sandboxAgentHome`, made by Slipway, kept between runs, seen by no other sandbox) instead of
   * an empty tmpfs per command; any HOME in `env` or the worker's is replaced. Unconfined: no effect.
   */
  agentHome?: boolean;
  /**
   * With `agentHome`, under confinement: the provider's config files (agents/provider.ts
   * `configFiles`), each bound read-only from `source` (a host file of the worker's) at `path`
   * relative to the agent home. A missing source is left out. Elsewhere: no effect.
   */
  agentConfig?: Array<{ source: string; path: string }>;
  stdin?: string;
  timeoutMs?: number;
  signal?: AbortSignal;
  /** On timeout or cancellation, SIGTERM first and SIGKILL after this many ms (default: SIGKILL at once). */
  killGraceMs?: number;
  onLine?: (stream: 'stdout' | 'stderr', line: string) => void;
  maxCaptureBytes?: number;
}

/** An interactive process in a sandbox (session.ts): a shell, a terminal, a streaming exec. */
export interface SessionRequest {
  command: string;
  args?: string[];
  shell?: boolean;
  /** Working directory relative to the sandbox root. */
  cwd?: string;
  env?: Record<string, string>;
  /** As ExecRequest.inheritEnv. */
  inheritEnv?: boolean;
  /** Run under a terminal of this size, allocated inside the sandbox (stdout and stderr merged; TERM defaults to xterm-256color). */
  pty?: { cols: number; rows: number };
}

export interface SessionExit {
  exitCode: number | null;
  signal: NodeJS.Signals | null;
}

export interface SandboxSession {
  readonly pid: number | undefined;
  readonly pty: boolean;
  /** The command's input (bytes); end it to send EOF. */
  stdin: Writable;
  /**
   * The command's output. Back-pressure reaches the command: a paused stream stops reading
   * the pipe, and the command blocks once the pipe is full. Under a pty, the terminal's output.
   */
  stdout: Readable;
  /** Under a pty only the wrapper's own errors (the command's stderr is the terminal). */
  stderr: Readable;
  /** Settles when the command ended (its leftovers killed). Read stdout/stderr to their end for all output. */
  exit: Promise<SessionExit>;
  /** Changes the terminal's size (the command gets SIGWINCH); only with a pty. */
  resize(cols: number, rows: number): void;
  /** Under a pty, SIGINT/SIGQUIT/SIGTSTP are typed as ^C ^\\ ^Z (the terminal's foreground group gets them); otherwise every process of the command gets `sig`. */
  signal(sig: NodeJS.Signals): void;
  /** Kills every process of the session at once. */
  kill(): void;
}

export interface SandboxProvider {
  readonly kind: string;
  /**
   * The sandbox lives on the host of the worker that created it (a directory, a local container):
   * only that worker reaches it, so it owns it. False for a remote provider any worker reaches.
   */
  readonly hostBound: boolean;
  /**
   * False for a provider without interactive sessions: openSession refuses with a
   * SessionRequestError and the service API answers 501 before admitting anything. Default true.
   */
  readonly sessions?: boolean;
  create(request: SandboxCreateRequest): Promise<SandboxHandle>;
  exec(handle: Pick<SandboxHandle, 'root'>, request: ExecRequest): Promise<RunResult>;
  /** Starts an interactive process under the same confinement, limits and environment rules as exec. */
  openSession(handle: Pick<SandboxHandle, 'root'>, request: SessionRequest): Promise<SandboxSession>;
  /** The host path an agent run's HOME is (ExecRequest.agentHome), from Slipway's records, never from the sandbox; undefined when agent runs keep the worker's HOME (unconfined). */
  agentHome?(handle: Pick<SandboxHandle, 'root'>): Promise<string | undefined>;
  /**
   * Files, confined to the sandbox (PathEscapeError): `opts.reservedNames` are refused after
   * links are followed where the files live; `opts.maxBytes` caps a read (FileTooLargeError).
   */
  readFile(handle: Pick<SandboxHandle, 'root'>, path: string, opts?: FileIoOptions): Promise<Buffer>;
  /** A streamed read: the size is known (and checked against `opts.maxBytes`) before any content moves; exactly that many bytes follow. */
  openFile(handle: Pick<SandboxHandle, 'root'>, path: string, opts?: FileIoOptions): Promise<OpenedFile>;
  writeFile(handle: Pick<SandboxHandle, 'root'>, path: string, content: Buffer | string, opts?: FileIoOptions): Promise<void>;
  deleteFile(handle: Pick<SandboxHandle, 'root'>, path: string, opts?: FileIoOptions): Promise<void>;
  /** A folder's entries (reserved names left out), by name. */
  listFiles(handle: Pick<SandboxHandle, 'root'>, path: string, opts?: FileIoOptions): Promise<FileEntry[]>;
  destroy(request: { repository: string; root: string }): Promise<void>;
  /**
   * Brings the sandbox's work into the repository: its HEAD commit (with the objects it needs,
   * checked as if fetched from an untrusted remote) becomes the tip of the sandbox's branch.
   * `known`: commits the repository has that the sandbox's work may build on (not sent again).
   */
  collect(handle: Pick<SandboxHandle, 'root'>, options?: { known?: string[]; signal?: AbortSignal }): Promise<{ head: string; imported: boolean }>;
  list(repository: string): Promise<Array<{ root: string; branch?: string; head: string; sandboxId?: string }>>;
  /**
   * Idle offload (optional): store the sandbox's state as a snapshot and free its resources.
   * `templateIgnored`: ignored files the template supplies are re-copied on restore, not stored.
   */
  suspend?(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }): Promise<{ snapshotRef: string; bytes: number }>;
  /** Brings a suspended sandbox back where it was; drops the snapshot. */
  restore?(handle: Pick<SandboxHandle, 'root'>, options: { templateIgnored: boolean }): Promise<{ root: string; branch?: string; head: string }>;
  /** Drops the snapshot of a sandbox terminated while suspended. */
  deleteSnapshot?(handle: Pick<SandboxHandle, 'root'>): Promise<void>;
  /**
   * Makes commits of the repository reachable inside the sandbox (optional: a sandbox that shares
   * the repository's objects has them already). Container sandboxes fetch a fresh bundle of the
   * repository's branches and tags (ADR 0012).
   */
  bringCommits?(handle: Pick<SandboxHandle, 'root'>, commits: string[]): Promise<void>;
  /**
   * Orphan sweep (optional; providers whose sandboxes live outside the repository, found by
   * label): removes the repository's objects that no record of Slipway's names, once older than
   * `graceMs` (a create in flight), and those whose sandbox `isLive` says has ended. Returns what
   * it removed.
   */
  sweepOrphans?(repository: string, options: { graceMs: number; isLive?: (sandbox: { root: string; sandboxId: string; group: string; createdAt: string }) => Promise<boolean> }): Promise<string[]>;
  /** Watcher probe (optional): is the sandbox still alive, or did it die outside Slipway? */
  probe?(handle: Pick<SandboxHandle, 'root'>): Promise<SandboxLiveness>;
  /**
   * Preview ports (optional, ADR 0015): a byte stream to 127.0.0.1:`port` as the sandbox sees
   * it, made from inside the sandbox's network, never from the host's. Rejects when nothing of
   * the sandbox listens there (PortUnreachableError) or the sandbox has no network of its own.
   */
  connectPort?(handle: Pick<SandboxHandle, 'root'>, port: number): Promise<Duplex>;
}

/** What went wrong when a remote provider refused or failed a call (its API's answer, classified). */
/** `bad_request`: the provider refused the call as given (a 400, its message says why); `conflict`: the sandbox is not in a state for it (a 409). */
export type ProviderFailureKind = 'quota' | 'rate_limit' | 'not_found' | 'transient' | 'unauthorized' | 'bad_request' | 'conflict' | 'other';

/**
 * A remote provider (Daytona) refused or failed a call; `kind` says how, so callers answer by
 * kind (the service API: api/service.ts providerFailure) without knowing the provider.
 */
export class SandboxProviderError extends Error {
  constructor(
    message: string,
    readonly kind: ProviderFailureKind,
    readonly status?: number,
    readonly resetAt?: number,
    /** The provider's own message, for answers that pass it on (a refused request says why). */
    readonly providerMessage?: string,
  ) {
    super(message);
    this.name = 'SandboxProviderError';
  }
}

/** Dead: why, and when it ended when the provider knows (a pod's finish time: the compute session closes there). */
export type SandboxLiveness = { alive: true } | { alive: false; reason: string; detail: string; endedAtMs?: number };
