/**
 * Daytona sandboxes (`provider: daytona`, ADR 0019): one Daytona sandbox per Slipway sandbox,
 * made from a snapshot through the official SDK (@daytonaio/sdk). Credentials come from the
 * worker's environment only (DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET).
 *
 *   <repo>/.slipway/daytona/<group>/<name>        the sandbox's root as Slipway names it (no folder)
 *   <repo>/.slipway/daytona/<group>/<name>.json   Slipway's record (Daytona id, branch, start commit, state)
 *
 * The workspace is `~/workspace` inside the remote sandbox, a repository of its own started
 * from a base bundle uploaded through the SDK's file API; work comes back as a bundle made
 * inside, downloaded, and checked by importBundle in quarantine (git-transport.ts). Slipway
 * never runs git on anything that came from the sandbox except through that check.
 *
 * Files go through the SDK's file API, confined to the workspace: `..` and absolute paths are
 * refused here; symbolic links are resolved inside the sandbox (`realpath -m`) and a path that
 * lands outside the workspace is refused. That check is confinement within a remote machine,
 * not a host boundary: nothing of the worker's lives there (the VM is the boundary).
 */
import { randomBytes, createHash } from 'node:crypto';
import { promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PassThrough, Readable, Writable } from 'node:stream';
import type { Daytona, DaytonaError, Sandbox } from '@daytonaio/sdk';
import { quote } from 'shell-quote';
import { SLIPWAY_DIR } from '../../core/ids';
import { readJson, writeJsonAtomic } from '../../lib/atomic-write';
import { branchExists, commitIdentity, ensureSlipwayExcluded, git, gitMaybe, resolveCommit } from '../../lib/git';
import type { RunResult } from '../process';
import { BUNDLE_HEAD_SCRIPT, BundleRefusedError, collectKnownHead, importBundle, makeBaseBundle, START_FROM_BUNDLE_SCRIPT } from './git-transport';
import { bufferCapped, checkRequestedPath, checkReservedPath, FileTooLargeError, listedEntries, NotRegularFileError, type FileEntry, type FileIoOptions, type OpenedFile } from './file-io';
import { NotAFolderError, parseProviderRoot, PathEscapeError, providerSandboxRoot } from './paths';
import { SANDBOX_BASE_ENV, SandboxProviderError, type ProviderFailureKind, type ProjectSetup, type ExecRequest, type SandboxCreateRequest, type SandboxHandle, type SandboxLiveness, type SandboxProvider, type SandboxSession, type SessionRequest } from './provider';
import { checkSize, SessionRequestError, TERMINAL_SIGNAL_KEYS, terminalInput } from './session';
import { MAX_COLLECT_PACK_BYTES, OBJECT_ID } from './sandbox-git';
import { runProjectSetup } from './setup';
import { describeChanges, fingerprint, type FingerprintParts } from './fingerprint';

export const DAYTONA_DIR = `${SLIPWAY_DIR}/daytona`;
/** The repository's prepared Daytona snapshot, as `slipway template create --provider daytona` last built it. */
export const DAYTONA_SNAPSHOT_MANIFEST = `${SLIPWAY_DIR}/daytona-snapshot.json`;

/**
 * A prepared Daytona snapshot (ADR 0019): a sandbox with the project's setup done, snapshotted.
 * It keeps only what setup made in the workspace (node_modules, build outputs): tracked files
 * and .git are removed before the snapshot, so each sandbox made from it starts from its own
 * base bundle as any other, and finds setup's files already there.
 */
export interface DaytonaSnapshotManifest {
  version: 1;
  /** Daytona's snapshot name: `slipway-<repository label>-<fingerprint>`. */
  name: string;
  baseRef: string;
  baseCommit: string;
  setup?: ProjectSetup;
  /** The snapshot it was built from (DAYTONA_SNAPSHOT), if any. */
  from?: string;
  fingerprint: { hash: string; parts: FingerprintParts };
  createdAt: string;
  durationMs: number;
}

export interface DaytonaSnapshotCheck {
  state: 'missing' | 'fresh' | 'stale';
  reasons: string[];
  manifest?: DaytonaSnapshotManifest;
  baseCommit?: string;
}

/** The prepared snapshot's name: from the repository and what makes it stale (lockfiles at the base, setup commands), as the local template's fingerprint. */
export const daytonaSnapshotName = (repo: string, fingerprintHash: string) => `slipway-${repositoryLabel(repo).slice(0, 12)}-${fingerprintHash.slice(0, 16)}`;
const snapshotFingerprint = (repo: string, baseCommit: string, setup: ProjectSetup | undefined) => fingerprint(repo, baseCommit, { setup, copyIgnored: false, source: repo });

export interface DaytonaProviderOptions {
  /** Default: DAYTONA_API_KEY, DAYTONA_API_URL, DAYTONA_TARGET from the worker's environment. */
  apiKey?: string;
  apiUrl?: string;
  target?: string;
  /** Daytona snapshot sandboxes are made from (default: Daytona's default). */
  snapshot?: string;
  /** Minutes idle before Daytona stops a sandbox (default 30): nothing bills forever if Slipway disappears. */
  autoStopMinutes?: number;
  /** Minutes stopped before Daytona deletes it (default 7 days). */
  autoDeleteMinutes?: number;
  /** False: every sandbox it makes has no network (Daytona's networkBlockAll), whatever the request says; a service profile's `network: false`. */
  network?: boolean;
  /** Extra labels (account, project) on every sandbox. */
  labels?: Record<string, string>;
  /** How often exec polls a running command (ms, default 100). */
  pollMs?: number;
  maxBundleBytes?: number;
  /** Retries of a 5xx or a rate limit before giving up (default 4); longest rate-limit wait honoured (default 60 s). */
  retries?: number;
  maxRateLimitWaitMs?: number;
}

interface DaytonaRecord {
  version: 1;
  sandboxId: string;
  daytonaId: string;
  group: string;
  name: string;
  branch: string;
  baseCommit: string;
  startCommit: string;
  /** The workspace's absolute path inside the Daytona sandbox. */
  workspace: string;
  state: 'creating' | 'ready' | 'suspended';
  suspendedHead?: string;
  createdAt: string;
}

/** Daytona refused or failed; `kind` says which (quota, rate_limit, not_found, transient, unauthorized, other). */
export class DaytonaProviderError extends SandboxProviderError {
  constructor(message: string, kind: ProviderFailureKind, status?: number, resetAt?: number, providerMessage?: string) {
    super(message, kind, status, resetAt, providerMessage);
    this.name = 'DaytonaProviderError';
  }
}

export function daytonaSandboxRoot(repository: string, group: string, name: string): string {
  return providerSandboxRoot(DAYTONA_DIR, repository, group, name);
}

/** `<repo>/.slipway/daytona/<group>/<name>` -> its parts, or undefined for other paths. */
export function parseDaytonaRoot(root: string): { repository: string; group: string; name: string } | undefined {
  return parseProviderRoot(DAYTONA_DIR, root);
}

/** The label that finds a repository's sandboxes (a hash: label values are short and path-free). */
export const repositoryLabel = (repo: string) => createHash('sha256').update(repo).digest('hex').slice(0, 24);

const q = (s: string) => quote([s]);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Maps an SDK error to a DaytonaProviderError: quota (403 with a quota message, or 402), rate
 * limit (429 with its reset from Retry-After or X-RateLimit-Reset), not found (404), bad request
 * (400, 422) and conflict (409) with Daytona's message, transient (5xx).
 */
export function classifyDaytonaError(e: unknown): DaytonaProviderError {
  if (e instanceof DaytonaProviderError) return e;
  const err = e as DaytonaError & { statusCode?: number; headers?: Record<string, unknown> };
  const status = err?.statusCode;
  const message = `Daytona: ${err?.message ?? String(e)}`;
  if (status === 429) {
    const h = (name: string) => {
      const headers = err.headers ?? {};
      const v = Object.entries(headers).find(([k]) => k.toLowerCase() === name)?.[1];
      return v === undefined ? undefined : Number(v);
    };
    const retryAfter = h('retry-after');
    const reset = h('x-ratelimit-reset');
    const now = Date.now();
    const resetAt = retryAfter !== undefined && !Number.isNaN(retryAfter) ? now + retryAfter * 1000 : reset !== undefined && !Number.isNaN(reset) ? (reset > 1e9 ? reset * 1000 : now + reset * 1000) : now + 1000;
    return new DaytonaProviderError(`${message} (rate limited until ${new Date(resetAt).toISOString()})`, 'rate_limit', status, resetAt);
  }
  if (status === 402 || (status === 403 && /quota|limit|exceed/i.test(err.message ?? ''))) return new DaytonaProviderError(message, 'quota', status);
  if (status === 401 || status === 403) return new DaytonaProviderError(message, 'unauthorized', status);
  if (status === 404) return new DaytonaProviderError(message, 'not_found', status);
  // Daytona refused the request as given (a path it will not write, a bad name): its message says why.
  if (status === 400 || status === 422) return new DaytonaProviderError(message, 'bad_request', status, undefined, err.message);
  if (status === 409) return new DaytonaProviderError(message, 'conflict', status, undefined, err.message);
  if (status !== undefined && status >= 500) return new DaytonaProviderError(message, 'transient', status);
  return new DaytonaProviderError(message, 'other', status);
}

/** Where a command's script goes inside the sandbox (next to the workspace, never in it). */
const scriptPath = (workspace: string, id: string) => path.posix.join(path.posix.dirname(workspace), '.slipway-exec', `${id}.sh`);

/**
 * The start of a command's script: its pid recorded (it leads its process group), its directory,
 * its environment (values travel in the file, which the shell removes at once, never in argv).
 */
function scriptHead(script: string, cwd: string, env: Record<string, string>): string[] {
  return [
    `echo $$ > ${q(`${script}.pid`)}`,
    `cd -- ${q(cwd)} || exit 1`,
    ...Object.entries(env).map(([k, v]) => {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new SessionRequestError(`env: ${JSON.stringify(k)} is not a variable name`);
      return `export ${k}=${q(v)}`;
    }),
    `rm -f -- "$0"`,
  ];
}

/**
 * The rest of a session script without a pty: stdin arrives as base64 lines (a `.` line is EOF)
 * decoded into a FIFO; the command runs in its own process group (pid in `<script>.cmd.pid`, so
 * a signal reaches it and not the relays); its stdout and stderr leave as base64 lines on the
 * script's own, one chunk per read (dd count=1), so output streams as it comes. The script
 * exits with the command's status.
 */
function streamedCommand(script: string, command: string): string[] {
  const f = (suffix: string) => q(`${script}${suffix}`);
  return [
    'exec 4<&0 0</dev/null',
    `rm -f -- ${f('.fifo')} && mkfifo -m 600 -- ${f('.fifo')} || exit 1`,
    `{ while IFS= read -r l && [ "$l" != . ]; do printf %s "$l" | base64 -d || break; done <&4 > ${f('.fifo')}; } &`,
    'dec=$!',
    'exec 4<&-',
    'enc() { while c=$(dd bs=65536 count=1 2>/dev/null | base64 -w0) && [ -n "$c" ]; do printf \'%s\\n\' "$c"; done; }',
    `{ { setsid /bin/sh -c 'echo $$ > "$0"; exec "$@"' ${f('.cmd.pid')} ${command} < ${f('.fifo')} 3>&-; echo $? > ${f('.status')}; } 2>&1 1>&3 3>&- | enc >&2; } 3>&1 | enc`,
    'kill "$dec" 2>/dev/null',
    `st=$(cat -- ${f('.status')} 2>/dev/null)`,
    'exit "${st:-1}"',
  ];
}

export class DaytonaSandboxProvider implements SandboxProvider {
  readonly kind = 'daytona';
  /** Hosted: a sandbox is reachable from any worker with the credentials. */
  readonly hostBound = false;
  private client?: Daytona;
  private readonly sandboxes = new Map<string, Sandbox>();
  private readonly options: DaytonaProviderOptions;

  constructor(options: DaytonaProviderOptions = {}) {
    this.options = options;
  }

  private daytona(): Daytona {
    if (this.client) return this.client;
    const apiKey = this.options.apiKey ?? process.env.DAYTONA_API_KEY;
    if (!apiKey) throw new DaytonaProviderError('DAYTONA_API_KEY is not set in the worker\'s environment: the daytona provider needs it', 'unauthorized');
    // The SDK (31 MB) is loaded on first use (ADR 0036): a worker without Daytona sandboxes forks less memory per process it starts.
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { Daytona: DaytonaClient } = require('@daytonaio/sdk') as typeof import('@daytonaio/sdk');
    this.client = new DaytonaClient({ apiKey, apiUrl: this.options.apiUrl ?? process.env.DAYTONA_API_URL, target: this.options.target ?? process.env.DAYTONA_TARGET });
    return this.client;
  }

  /** Runs a Daytona call, retrying 5xx and waiting out a rate limit; other errors are mapped and thrown. */
  async call<T>(what: string, op: () => Promise<T>): Promise<T> {
    const retries = this.options.retries ?? 4;
    for (let attempt = 0; ; attempt++) {
      try {
        return await op();
      } catch (e) {
        const err = classifyDaytonaError(e);
        const wait = err.kind === 'rate_limit' ? Math.max(0, (err.resetAt ?? Date.now()) - Date.now()) : err.kind === 'transient' ? 200 * 2 ** attempt : undefined;
        if (wait === undefined || attempt >= retries || wait > (this.options.maxRateLimitWaitMs ?? 60_000)) {
          err.message = `${what}: ${err.message}`;
          throw err;
        }
        await sleep(wait);
      }
    }
  }

  private where(root: string) {
    const resolved = path.resolve(root);
    const parsed = parseDaytonaRoot(resolved);
    if (!parsed) throw new Error(`not a Daytona sandbox root (<repo>/${DAYTONA_DIR}/<group>/<name>): ${root}`);
    return { ...parsed, root: resolved, recordFile: `${resolved}.json` };
  }

  private async record(root: string): Promise<DaytonaRecord> {
    const w = this.where(root);
    const r = await readJson<DaytonaRecord>(w.recordFile);
    if (!r) throw new Error(`no record of the Daytona sandbox at ${w.root}`);
    return r;
  }

  private async remote(daytonaId: string, fresh = false): Promise<Sandbox> {
    const known = this.sandboxes.get(daytonaId);
    if (known && !fresh) return known;
    const s = await this.call('finding the sandbox', () => this.daytona().get(daytonaId));
    this.sandboxes.set(daytonaId, s);
    return s;
  }

  /** A trusted control command (mkdir, realpath, kill), output combined; never one of the agent's. */
  private async control(s: Sandbox, script: string, args: string[] = []): Promise<{ exitCode: number; output: string }> {
    const r = await this.call('running a command in the sandbox', () => s.process.executeCommand(`/bin/sh -c ${q(script)} slipway ${args.map(q).join(' ')}`));
    return { exitCode: r.exitCode, output: r.result };
  }

  async create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    return this.createSandbox(req, true);
  }

  /** `usePrepared`: start from the repository's prepared snapshot when Daytona has one for this setup (not when building it). */
  private async createSandbox(req: SandboxCreateRequest, usePrepared: boolean): Promise<SandboxHandle> {
    const started = Date.now();
    const repo = await fs.realpath(req.repository);
    await ensureSlipwayExcluded(repo);
    const w = this.where(daytonaSandboxRoot(repo, req.group, req.name));
    const [baseCommit, record] = await Promise.all([resolveCommit(repo, req.base), readJson<DaytonaRecord>(w.recordFile)]);
    if (record && record.state !== 'creating') {
      const s = await this.remote(record.daytonaId, true).catch((e: DaytonaProviderError) => {
        if (e.kind === 'not_found') return undefined;
        throw e;
      });
      if (s && s.state !== 'destroyed') {
        if (record.branch !== req.branch) throw new Error(`sandbox ${w.root} exists on branch ${record.branch}, expected ${req.branch}`);
        if (s.state !== 'started') await this.call('starting the sandbox', () => s.start());
        const headCommit = await this.head(w.root);
        return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit, reused: true };
      }
    }
    if (record) await this.deleteRemote(record.daytonaId);
    if (!(await branchExists(repo, req.branch))) await git(repo, ['update-ref', `refs/heads/${req.branch}`, baseCommit, '']);
    const startCommit = await resolveCommit(repo, `refs/heads/${req.branch}`);
    const labels = { ...this.options.labels, 'slipway.repository': repositoryLabel(repo), 'slipway.group': req.group, 'slipway.name': req.name, 'slipway.sandbox': req.sandboxId };
    const hasSetup = !!req.setup && (req.setup.commands.length > 0 || req.setup.verify.length > 0);
    // The fingerprint finds the prepared snapshot on any worker (no manifest needed); else the configured one.
    const prepared = usePrepared && hasSetup ? await this.preparedSnapshot(repo, baseCommit, req.setup) : undefined;
    const snapshot = prepared ?? this.options.snapshot;
    const s = await this.call('creating the sandbox', () =>
      this.daytona().create(
        {
          ...(snapshot ? { snapshot } : {}),
          labels,
          // The objective's or the profile's `network: false` blocks the sandbox's network (Daytona's networkBlockAll); the stricter wins.
          ...((req.container && !req.container.network) || this.options.network === false ? { networkBlockAll: true } : {}),
          autoStopInterval: this.options.autoStopMinutes ?? 30,
          autoDeleteInterval: this.options.autoDeleteMinutes ?? 7 * 24 * 60,
        },
        { timeout: 300 },
      ),
    );
    this.sandboxes.set(s.id, s);
    const home = (await this.control(s, 'printf %s "$HOME"')).output.trim();
    if (!home.startsWith('/')) throw new Error(`the Daytona sandbox ${s.id} reports no home directory (${JSON.stringify(home.slice(0, 80))})`);
    const workspace = path.posix.join(home, 'workspace');
    const base: DaytonaRecord = { version: 1, sandboxId: req.sandboxId, daytonaId: s.id, group: req.group, name: req.name, branch: req.branch, baseCommit, startCommit, workspace, state: 'creating', createdAt: new Date().toISOString() };
    await writeJsonAtomic(w.recordFile, base, { mkdir: true });
    const local = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-daytona-'));
    const bundle = path.posix.join(home, '.slipway-in', 'base.bundle');
    try {
      await makeBaseBundle(repo, req.branch, path.join(local, 'base.bundle'));
      await this.call('uploading the base bundle', async () => s.fs.uploadFile(await fs.readFile(path.join(local, 'base.bundle')), bundle));
    } finally {
      await fs.rm(local, { recursive: true, force: true });
    }
    await this.control(s, 'mkdir -p -- "$1"', [workspace]);
    const { name, email } = await commitIdentity(repo);
    const start = await this.exec({ root: w.root }, { command: '/bin/sh', args: ['-c', START_FROM_BUNDLE_SCRIPT, 'start', bundle, req.branch, name, email], timeoutMs: 10 * 60_000, signal: req.signal });
    if (start.exitCode !== 0) throw new Error(`starting the sandbox from its bundle failed (exit ${start.exitCode}): ${start.stderr.trim()}`);
    let setup: SandboxHandle['setup'];
    if (req.setup && hasSetup) {
      const run = (p: ProjectSetup) => runProjectSetup((r) => this.exec({ root: w.root }, r), p, { signal: req.signal, onProgress: req.onProgress });
      // From the prepared snapshot setup's files are there: verify only; setup runs in full if a check fails.
      setup = prepared ? await run({ ...req.setup, commands: [], attempts: 1 }).catch(() => run(req.setup!)) : await run(req.setup);
    }
    const headCommit = await this.head(w.root);
    await writeJsonAtomic(w.recordFile, { ...base, state: 'ready' });
    return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit, reused: false, origin: prepared ? 'template' : 'cold', ...(setup ? { setup } : {}), durationMs: Date.now() - started };
  }

  /** Daytona's record of a snapshot by name, or undefined when it has none. */
  private async snapshotInfo(name: string): Promise<{ state: string; errorReason?: string | null } | undefined> {
    return this.call(`reading the snapshot ${name}`, () => this.daytona().snapshot.get(name)).catch((e: DaytonaProviderError) => {
      if (e.kind === 'not_found') return undefined;
      throw e;
    });
  }

  /** The name of the active prepared snapshot for this repository, base lockfiles and setup, if Daytona has it. */
  private async preparedSnapshot(repo: string, baseCommit: string, setup: ProjectSetup | undefined): Promise<string | undefined> {
    const name = daytonaSnapshotName(repo, (await snapshotFingerprint(repo, baseCommit, setup)).hash);
    return (await this.snapshotInfo(name))?.state === 'active' ? name : undefined;
  }

  /** Waits until Daytona has built the snapshot (pending, building -> active); its error with Daytona's reason otherwise. */
  private async waitForSnapshot(name: string, timeoutMs = 30 * 60_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const info = await this.snapshotInfo(name);
      if (info?.state === 'active') return;
      if (!info || info.state === 'error' || info.state === 'build_failed') {
        throw new DaytonaProviderError(`Daytona: the snapshot ${name} failed: ${info ? `${info.state}: ${info.errorReason ?? 'no reason given'}` : 'it disappeared'}`, 'other');
      }
      if (Date.now() > deadline) throw new DaytonaProviderError(`Daytona: the snapshot ${name} is still ${info.state} after ${timeoutMs / 60_000} min`, 'transient');
      await sleep(Math.max(this.options.pollMs ?? 100, 500));
    }
  }

  async readSnapshotManifest(repository: string): Promise<DaytonaSnapshotManifest | undefined> {
    return readJson<DaytonaSnapshotManifest>(path.join(await fs.realpath(repository), DAYTONA_SNAPSHOT_MANIFEST));
  }

  /**
   * Builds the repository's prepared snapshot: a sandbox at `base` (from the configured snapshot)
   * runs the setup, keeps only what setup made, and is snapshotted under the fingerprint's name;
   * the builder sandbox and its branch go whatever happens. A snapshot of that name already
   * active (built elsewhere) is taken as it is. The previous prepared snapshot is deleted once
   * the new one is active.
   */
  async buildSnapshot(repository: string, opts: { base: string; setup?: ProjectSetup; signal?: AbortSignal; onProgress?: (line: string) => void }): Promise<DaytonaSnapshotManifest> {
    const started = Date.now();
    const repo = await fs.realpath(repository);
    const baseCommit = await resolveCommit(repo, opts.base);
    const fp = await snapshotFingerprint(repo, baseCommit, opts.setup);
    const name = daytonaSnapshotName(repo, fp.hash);
    const previous = await this.readSnapshotManifest(repo);
    const existing = await this.snapshotInfo(name);
    if (existing && existing.state !== 'active') {
      if (existing.state === 'error' || existing.state === 'build_failed') await this.call(`deleting the failed snapshot ${name}`, () => this.daytona().snapshot.delete(name));
      else await this.waitForSnapshot(name);
    }
    if (existing?.state !== 'active' && (await this.snapshotInfo(name))?.state !== 'active') {
      const tag = randomBytes(4).toString('hex');
      const branch = `slipway/daytona-snapshot/${tag}`;
      const root = daytonaSandboxRoot(repo, 'snapshots', `build-${tag}`);
      try {
        await this.createSandbox({ sandboxId: `snapshot.${tag}`, repository: repo, group: 'snapshots', name: `build-${tag}`, branch, base: baseCommit, setup: opts.setup, signal: opts.signal, onProgress: opts.onProgress }, false);
        const record = await this.record(root);
        const s = await this.remote(record.daytonaId);
        opts.onProgress?.('setup done; keeping only what it made in the workspace');
        const clean = await this.control(s, 'cd -- "$1" && git ls-files -z | xargs -0 -r rm -f -- && rm -rf .git && cd .. && rm -rf .slipway-in .slipway-out .slipway-exec', [record.workspace]);
        if (clean.exitCode !== 0) throw new Error(`clearing the workspace before the snapshot failed: ${clean.output.trim().slice(0, 400)}`);
        opts.onProgress?.(`taking the snapshot ${name}`);
        await this.call('taking the snapshot', () => s.createSnapshot(name, 30 * 60));
        await this.waitForSnapshot(name);
      } finally {
        await this.destroy({ repository: repo, root }).catch(() => undefined);
        await gitMaybe(repo, ['update-ref', '-d', `refs/heads/${branch}`]);
      }
    }
    const manifest: DaytonaSnapshotManifest = {
      version: 1,
      name,
      baseRef: opts.base,
      baseCommit,
      ...(opts.setup ? { setup: opts.setup } : {}),
      ...(this.options.snapshot ? { from: this.options.snapshot } : {}),
      fingerprint: fp,
      createdAt: new Date().toISOString(),
      durationMs: Date.now() - started,
    };
    await ensureSlipwayExcluded(repo);
    await writeJsonAtomic(path.join(repo, DAYTONA_SNAPSHOT_MANIFEST), manifest, { mkdir: true });
    if (previous && previous.name !== name) {
      await this.call(`deleting the previous snapshot ${previous.name}`, () => this.daytona().snapshot.delete(previous.name)).catch((e: DaytonaProviderError) => {
        if (e.kind !== 'not_found') throw e;
      });
    }
    return manifest;
  }

  /** Is the prepared snapshot current? Stale when Daytona lost it or it is not active, a lockfile at its base changed, or the setup commands did. */
  async checkSnapshot(repository: string, opts: { base?: string; setup?: ProjectSetup } = {}): Promise<DaytonaSnapshotCheck> {
    const repo = await fs.realpath(repository);
    const manifest = await this.readSnapshotManifest(repo);
    if (!manifest) return { state: 'missing', reasons: ['no Daytona snapshot: run `slipway template create --provider daytona`'] };
    const reasons: string[] = [];
    const info = await this.snapshotInfo(manifest.name);
    if (!info) reasons.push(`Daytona has no snapshot ${manifest.name} any more`);
    else if (info.state !== 'active') reasons.push(`the snapshot ${manifest.name} is ${info.state}${info.errorReason ? ` (${info.errorReason})` : ''}`);
    const baseRef = opts.base ?? manifest.baseRef;
    const baseCommit = await resolveCommit(repo, baseRef).catch(() => undefined);
    if (!baseCommit) return { state: 'stale', reasons: [...reasons, `base "${baseRef}" no longer resolves to a commit`], manifest };
    const now = await snapshotFingerprint(repo, baseCommit, opts.setup ?? manifest.setup);
    reasons.push(...describeChanges(manifest.fingerprint.parts, now.parts));
    return { state: reasons.length === 0 ? 'fresh' : 'stale', reasons, manifest, baseCommit };
  }

  /** HEAD inside the sandbox (untrusted: only compared, or collected through a bundle). */
  private async head(root: string): Promise<string> {
    const r = await this.exec({ root }, { command: 'git', args: ['rev-parse', '--verify', '--quiet', 'HEAD^{commit}'], timeoutMs: 60_000 });
    const head = r.stdout.trim();
    if (r.exitCode !== 0 || !OBJECT_ID.test(head)) throw new Error(`the sandbox at ${root} has no commit at HEAD`);
    return head;
  }

  /**
   * `requested` resolved inside the sandbox, or PathEscapeError: lexically first, then with every
   * symbolic link followed there (`realpath -m`; the last component only when `followFinal`),
   * then `opts.reservedNames` (`.git`, `.slipway` for the files API) refused in what it resolved
   * to. `kind` is what the resolved path is there (a link only when the last component is kept).
   * Output is NUL-separated: a name may hold a newline.
   */
  private async resolve(s: Sandbox, workspace: string, requested: string, followFinal = true, opts: FileIoOptions = {}): Promise<{ path: string; kind: 'file' | 'folder' | 'link' | 'other' | 'none' }> {
    checkRequestedPath(requested, opts);
    const rel = path.posix.normalize(requested);
    if (rel === '..' || rel.startsWith('../')) throw new PathEscapeError(requested, 'it leads outside the sandbox');
    const [dir, last] = followFinal || rel === '.' ? [rel, ''] : [path.posix.dirname(rel), path.posix.basename(rel)];
    const r = await this.control(
      s,
      'cd -- "$1" && realpath -mz -- "$2" "$1" && t=$2${3:+/$3} && ' +
        'if [ -n "$3" ] && [ -L "$t" ]; then echo link; elif [ -d "$t" ]; then echo folder; elif [ -f "$t" ]; then echo file; elif [ -e "$t" ]; then echo other; else echo none; fi',
      [workspace, dir, last],
    );
    const [resolved, ws, kind] = r.output.split('\0');
    if (r.exitCode !== 0 || !resolved || !ws || !kind) throw new Error(`resolving ${JSON.stringify(requested)} in the sandbox failed: ${r.output.trim().slice(0, 400)}`);
    const inside = resolved === ws || resolved.startsWith(`${ws}/`);
    if (!inside) throw new PathEscapeError(requested, 'a symbolic link leads outside the sandbox');
    const final = last ? path.posix.join(resolved, last) : resolved;
    checkReservedPath(requested, path.posix.relative(ws, final), opts);
    return { path: final, kind: kind.trim() as 'file' | 'folder' | 'link' | 'other' | 'none' };
  }

  /** A command's cwd: confined as any path (PathEscapeError), and an existing folder there (NotAFolderError), checked inside the sandbox. */
  private async resolveCwd(s: Sandbox, workspace: string, cwd: string): Promise<string> {
    const { path: resolved, kind } = await this.resolve(s, workspace, cwd);
    if (kind === 'folder') return resolved;
    throw new NotAFolderError(cwd, kind === 'none' ? 'no such folder' : 'not a folder');
  }

  async exec(handle: Pick<SandboxHandle, 'root'>, req: ExecRequest): Promise<RunResult> {
    const started = Date.now();
    const record = await this.record(handle.root);
    const s = await this.remote(record.daytonaId);
    const cwd = req.cwd ? await this.resolveCwd(s, record.workspace, req.cwd) : record.workspace;
    const result = (over: Partial<RunResult>): RunResult => ({ exitCode: null, signal: null, stdout: '', stderr: '', timedOut: false, cancelled: false, durationMs: Date.now() - started, ...over });
    if (req.signal?.aborted) return result({ cancelled: true });
    const id = randomBytes(8).toString('hex');
    const script = scriptPath(record.workspace, id);
    const lines = [
      ...scriptHead(script, cwd, { ...SANDBOX_BASE_ENV, ...req.env }),
      req.stdin !== undefined ? `exec 0< ${q(`${script}.in`)}; rm -f -- ${q(`${script}.in`)}` : 'exec 0</dev/null',
      req.shell ? `exec /bin/sh -c ${q(req.command)}` : `exec ${[req.command, ...(req.args ?? [])].map(q).join(' ')}`,
    ];
    await this.call('uploading the command', () => s.fs.uploadFile(Buffer.from(`${lines.join('\n')}\n`), script));
    if (req.stdin !== undefined) await this.call('uploading stdin', () => s.fs.uploadFile(Buffer.from(req.stdin!), `${script}.in`));
    const session = `slipway-${id}`;
    await this.call('opening a session', () => s.process.createSession(session));
    try {
      // Its own session (setsid) so a timeout kills everything it started, by process group.
      const { cmdId } = await this.call('starting the command', () => s.process.executeSessionCommand(session, { command: `setsid -w /bin/sh ${q(script)}`, runAsync: true }));
      if (!cmdId) throw new Error('Daytona started the command without an id');
      const deadline = req.timeoutMs ? started + req.timeoutMs : Infinity;
      const max = req.maxCaptureBytes ?? 64 * 1024 * 1024;
      const streams = { stdout: { seen: 0, partial: '' }, stderr: { seen: 0, partial: '' } };
      let out = { stdout: '', stderr: '' };
      const emit = (final: boolean) => {
        for (const name of ['stdout', 'stderr'] as const) {
          const st = streams[name];
          const text = out[name];
          const fresh = st.partial + text.slice(st.seen);
          st.seen = text.length;
          const parts = fresh.split('\n');
          st.partial = parts.pop() ?? '';
          for (const line of parts) req.onLine?.(name, line);
          if (final && st.partial) {
            req.onLine?.(name, st.partial);
            st.partial = '';
          }
        }
      };
      let ending: 'timedOut' | 'cancelled' | undefined;
      let exitCode: number | undefined;
      for (;;) {
        const cmd = await this.call('polling the command', () => s.process.getSessionCommand(session, cmdId));
        const logs = await this.call('reading the command output', () => s.process.getSessionCommandLogs(session, cmdId));
        out = { stdout: logs.stdout ?? '', stderr: logs.stderr ?? '' };
        if (cmd.exitCode !== undefined && cmd.exitCode !== null) {
          exitCode = cmd.exitCode;
          break;
        }
        emit(false);
        if (req.signal?.aborted) ending = 'cancelled';
        else if (Date.now() > deadline) ending = 'timedOut';
        if (ending) break;
        await sleep(this.options.pollMs ?? 100);
      }
      if (ending) {
        if (req.killGraceMs) {
          await this.killGroup(s, script, 'TERM');
          await sleep(req.killGraceMs);
        }
        await this.killGroup(s, script, 'KILL');
        const logs = await this.call('reading the command output', () => s.process.getSessionCommandLogs(session, cmdId)).catch(() => undefined);
        if (logs) out = { stdout: logs.stdout ?? out.stdout, stderr: logs.stderr ?? out.stderr };
      }
      emit(true);
      return result({
        exitCode: ending ? (exitCode ?? 137) : (exitCode ?? null),
        signal: ending ? 'SIGKILL' : null,
        stdout: out.stdout.slice(-max),
        stderr: out.stderr.slice(-max),
        timedOut: ending === 'timedOut',
        cancelled: ending === 'cancelled',
      });
    } finally {
      await this.call('closing the session', () => s.process.deleteSession(session)).catch(() => undefined);
      await this.control(s, 'rm -f -- "$1" "$1.pid" "$1.in"', [script]).catch(() => undefined);
    }
  }

  /** Signals the process group whose leader wrote its pid to `<pidBase>.pid` (`signal` without SIG: TERM, KILL). */
  private async killGroup(s: Sandbox, pidBase: string, signal: string): Promise<void> {
    await this.control(s, 'p=$(cat -- "$1.pid" 2>/dev/null) && [ -n "$p" ] && kill -s "$2" -- "-$p" 2>/dev/null; exit 0', [pidBase, signal]).catch(() => undefined);
  }

  /**
   * An interactive process (ADR 0019, sessions). With a pty: Daytona's PTY (SDK createPty, a
   * WebSocket) whose shell is told to exec our script; output before the script's random marker
   * (the shell's prompt, the echo of that line) is dropped. Without: a session command whose
   * stdin, stdout and stderr travel base64-encoded line by line (sendSessionCommandInput takes
   * text, and the followed log stream decodes text), so bytes arrive unchanged and EOF is a `.`
   * line. Environment and cwd go up in the script file, as for exec, never in argv.
   */
  async openSession(handle: Pick<SandboxHandle, 'root'>, req: SessionRequest): Promise<SandboxSession> {
    if (!req.command) throw new SessionRequestError('command must not be empty');
    const pty = req.pty ? checkSize(req.pty.cols, req.pty.rows) : undefined;
    const record = await this.record(handle.root);
    const s = await this.remote(record.daytonaId);
    const cwd = req.cwd ? await this.resolveCwd(s, record.workspace, req.cwd) : record.workspace;
    const id = randomBytes(8).toString('hex');
    const script = scriptPath(record.workspace, id);
    const command = (req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])]).map(q).join(' ');
    const head = scriptHead(script, cwd, { ...SANDBOX_BASE_ENV, ...(pty ? { TERM: 'xterm-256color' } : {}), ...req.env });
    const cleanup = () => this.control(s, 'rm -f -- "$1" "$1.pid" "$1.cmd.pid" "$1.fifo" "$1.status"', [script]).catch(() => undefined);
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let exited = false;
    let killed = false;
    const checkSignal = (sig: NodeJS.Signals) => {
      if (!/^SIG[A-Z0-9]+$/.test(sig)) throw new SessionRequestError(`signal must be a signal name such as SIGTERM, got ${JSON.stringify(sig)}`);
      return sig.slice(3);
    };
    if (pty) {
      const marker = `slipway-session-${randomBytes(12).toString('hex')}`;
      await this.call('uploading the session script', () => s.fs.uploadFile(Buffer.from(`${[...head, `printf '%s\\n' ${marker}`, `exec ${command}`].join('\n')}\n`), script));
      let pending: Buffer | undefined = Buffer.alloc(0);
      const onData = (data: Uint8Array) => {
        if (!pending) return void stdout.write(Buffer.from(data));
        pending = Buffer.concat([pending, data]);
        const at = pending.indexOf(marker);
        const eol = at < 0 ? -1 : pending.indexOf('\n', at);
        if (eol < 0) return;
        const rest = pending.subarray(eol + 1);
        pending = undefined;
        if (rest.length) stdout.write(rest);
      };
      const terminal = await this.call('opening a terminal', () => s.process.createPty({ id: `slipway-${id}`, cols: pty.cols, rows: pty.rows, onData })).catch(async (e: unknown) => {
        await cleanup();
        throw e;
      });
      const exit = terminal.wait().then(async (r) => {
        exited = true;
        await this.killGroup(s, script, 'KILL');
        await cleanup();
        await terminal.disconnect().catch(() => undefined);
        stdout.end();
        stderr.end();
        return killed ? { exitCode: null, signal: 'SIGKILL' as const } : { exitCode: r.exitCode ?? null, signal: null };
      });
      // A leading space keeps the line out of an interactive shell's history.
      await terminal.sendInput(` exec /bin/sh ${q(script)}\n`);
      // Daytona's PTY has no end of input: closing stdin types it (session.ts terminalInput).
      const typed = new Writable({
        write: (chunk: Buffer, _e, cb) => void terminal.sendInput(new Uint8Array(chunk)).then(() => cb(), () => cb()),
      });
      const stdin = terminalInput(typed, false);
      return {
        pid: undefined,
        pty: true,
        stdin,
        stdout,
        stderr,
        exit,
        resize: (cols, rows) => {
          const size = checkSize(cols, rows, 'resize');
          if (!exited) void terminal.resize(size.cols, size.rows).catch(() => undefined);
        },
        signal: (sig) => {
          const name = checkSignal(sig);
          if (exited) return;
          const key = TERMINAL_SIGNAL_KEYS[sig];
          if (key) void terminal.sendInput(key).catch(() => undefined);
          else void this.killGroup(s, script, name);
        },
        kill: () => {
          if (exited) return;
          killed = true;
          void this.killGroup(s, script, 'KILL').then(() => terminal.kill().catch(() => undefined));
        },
      };
    }
    await this.call('uploading the session script', () => s.fs.uploadFile(Buffer.from(`${[...head, ...streamedCommand(script, command)].join('\n')}\n`), script));
    const session = `slipway-${id}`;
    await this.call('opening a session', () => s.process.createSession(session));
    const started = await this.call('starting the command', () => s.process.executeSessionCommand(session, { command: `setsid -w /bin/sh ${q(script)}`, runAsync: true })).catch(async (e: unknown) => {
      await this.call('closing the session', () => s.process.deleteSession(session)).catch(() => undefined);
      await cleanup();
      throw e;
    });
    const cmdId = started.cmdId!;
    const decoder = (out: PassThrough) => {
      let partial = '';
      return (chunk: string) => {
        const lines = (partial + chunk).split('\n');
        partial = lines.pop() ?? '';
        for (const line of lines) if (line) out.write(Buffer.from(line, 'base64'));
      };
    };
    const exit = (async () => {
      await this.call('following the output', () => s.process.getSessionCommandLogs(session, cmdId, decoder(stdout), decoder(stderr))).catch(() => undefined);
      // The log stream ends with the command; its exit code may be recorded a moment later.
      let exitCode: number | null = null;
      for (let i = 0; i < 100; i++) {
        const cmd = await this.call('reading the exit code', () => s.process.getSessionCommand(session, cmdId)).catch(() => undefined);
        if (cmd?.exitCode !== undefined && cmd.exitCode !== null) {
          exitCode = cmd.exitCode;
          break;
        }
        await sleep(this.options.pollMs ?? 100);
      }
      exited = true;
      await this.killGroup(s, `${script}.cmd`, 'KILL');
      await this.call('closing the session', () => s.process.deleteSession(session)).catch(() => undefined);
      await cleanup();
      stdout.end();
      stderr.end();
      return killed ? { exitCode: null, signal: 'SIGKILL' as const } : { exitCode, signal: null };
    })();
    let sent = Promise.resolve();
    const send = (data: string) => (sent = sent.then(() => this.call('sending input', () => s.process.sendSessionCommandInput(session, cmdId, data)).catch(() => undefined)));
    const stdin = new Writable({
      write: (chunk: Buffer, _e, cb) => void send(`${chunk.toString('base64')}\n`).then(() => cb()),
      final: (cb) => void send('.\n').then(() => cb()),
    });
    stdin.on('error', () => undefined);
    return {
      pid: undefined,
      pty: false,
      stdin,
      stdout,
      stderr,
      exit,
      resize: () => {
        throw new SessionRequestError('resize needs a session with a pty');
      },
      signal: (sig) => {
        const name = checkSignal(sig);
        if (!exited) void this.killGroup(s, `${script}.cmd`, name);
      },
      kill: () => {
        if (exited) return;
        killed = true;
        void Promise.all([this.killGroup(s, `${script}.cmd`, 'KILL'), this.killGroup(s, script, 'KILL')]);
      },
    };
  }

  /**
   * A file call's failure: a missing file is ENOENT unless the sandbox itself is what Daytona no
   * longer has (then its not_found stands: the service answers 409, not 404).
   */
  private async fileError(record: DaytonaRecord, e: unknown, file: string): Promise<unknown> {
    const missing = e instanceof SandboxProviderError ? e.kind === 'not_found' || /no such file|not found/i.test(e.message) : false;
    if (!missing) return e;
    const gone = await this.remote(record.daytonaId, true).then(
      () => undefined,
      (err: unknown) => err,
    );
    if (gone instanceof SandboxProviderError && gone.kind === 'not_found') return gone;
    return Object.assign(new Error(`ENOENT: no such file in the sandbox: ${file}`), { code: 'ENOENT' });
  }

  /** Where a files-API path lands inside the sandbox (confined, reserved names refused), and what is there. */
  private async place(handle: Pick<SandboxHandle, 'root'>, file: string, followFinal: boolean, opts: FileIoOptions) {
    const record = await this.record(handle.root);
    const s = await this.remote(record.daytonaId);
    return { record, s, ...(await this.resolve(s, record.workspace, file, followFinal, opts)) };
  }

  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<Buffer> {
    const { stream } = await this.openFile(handle, file, bufferCapped(opts));
    const chunks: Buffer[] = [];
    for await (const chunk of stream) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  /**
   * Stat first (the SDK's getFileDetails): a folder, a special file or a file over `maxBytes` is
   * refused before anything is downloaded. Then a streamed download (the SDK's downloadFileStream),
   * cut at the size the stat gave: a file growing meanwhile sends no more than that, one that
   * shrank ends the stream with an error rather than short.
   */
  async openFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<OpenedFile> {
    const { record, s, path: p, kind } = await this.place(handle, file, true, opts);
    if (kind === 'none') throw Object.assign(new Error(`ENOENT: no such file in the sandbox: ${file}`), { code: 'ENOENT' });
    if (kind === 'folder') throw Object.assign(new Error(`EISDIR: "${file}" is a directory`), { code: 'EISDIR' });
    const info = await this.call(`reading ${file}`, () => s.fs.getFileDetails(p)).catch(async (e: unknown) => {
      throw await this.fileError(record, e, file);
    });
    if (info.isDir) throw Object.assign(new Error(`EISDIR: "${file}" is a directory`), { code: 'EISDIR' });
    if (kind !== 'file' || !info.mode.startsWith('-')) throw new NotRegularFileError(file, 'special file');
    const size = Number(info.size);
    if (opts.maxBytes !== undefined && size > opts.maxBytes) throw new FileTooLargeError(file, size, opts.maxBytes);
    if (size === 0) return { size: 0, stream: Readable.from([]) };
    const abort = new AbortController();
    const source = await this.call(`reading ${file}`, () => s.fs.downloadFileStream(p, { signal: abort.signal })).catch(async (e: unknown) => {
      throw await this.fileError(record, e, file);
    });
    source.on('error', () => undefined);
    async function* capped() {
      let sent = 0;
      try {
        for await (const chunk of source) {
          const part = (chunk as Buffer).subarray(0, size - sent);
          sent += part.length;
          if (part.length > 0) yield part;
          if (sent >= size) return;
        }
        if (sent < size) throw new Error(`"${file}" shrank while it was read (${sent} of ${size} bytes)`);
      } finally {
        if (sent < size || !source.readableEnded) abort.abort();
        source.destroy();
      }
    }
    return { size, stream: Readable.from(capped(), { objectMode: false }) };
  }

  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string, opts: FileIoOptions = {}): Promise<void> {
    const { record, s, path: p, kind } = await this.place(handle, file, true, opts);
    if (kind === 'folder') throw Object.assign(new Error(`EISDIR: "${file}" is a directory`), { code: 'EISDIR' });
    await this.call(`writing ${file}`, () => s.fs.uploadFile(Buffer.isBuffer(content) ? content : Buffer.from(content), p)).catch(async (e: unknown) => {
      throw await this.fileError(record, e, file);
    });
  }

  /** A link is removed, never its target (the last component is not followed); what is gone already is fine. */
  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<void> {
    const { record, s, path: p, kind } = await this.place(handle, file, false, opts);
    if (p === record.workspace || path.posix.normalize(file) === '.') throw new PathEscapeError(file, 'the sandbox root itself cannot be deleted');
    if (kind === 'none') return;
    if (kind === 'folder') throw Object.assign(new Error(`EISDIR: "${file}" is a directory`), { code: 'EISDIR' });
    await this.call(`deleting ${file}`, () => s.fs.deleteFile(p)).catch(async (e: unknown) => {
      const err = await this.fileError(record, e, file);
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    });
  }

  /** A folder's entries through the SDK's listFiles (entries are not followed), reserved names left out. */
  async listFiles(handle: Pick<SandboxHandle, 'root'>, dir: string, opts: FileIoOptions = {}): Promise<FileEntry[]> {
    const { record, s, path: p, kind } = await this.place(handle, dir, true, opts);
    if (kind === 'none') throw Object.assign(new Error(`ENOENT: no such folder in the sandbox: ${dir}`), { code: 'ENOENT' });
    if (kind !== 'folder') throw Object.assign(new Error(`ENOTDIR: "${dir}" is not a directory`), { code: 'ENOTDIR' });
    const found = await this.call(`listing ${dir}`, () => s.fs.listFiles(p)).catch(async (e: unknown) => {
      throw await this.fileError(record, e, dir);
    });
    // Go's FileMode strings: "-rw-r--r--" a file, "drwx..." a folder, "Lrwx..." a link.
    const type = (f: { isDir: boolean; mode: string }): FileEntry['type'] => (f.mode.startsWith('L') ? 'symlink' : f.isDir ? 'directory' : f.mode.startsWith('-') ? 'file' : 'other');
    return listedEntries(found.map((f) => ({ name: f.name, type: type(f), size: Number(f.size) })), opts);
  }

  private async deleteRemote(daytonaId: string): Promise<void> {
    this.sandboxes.delete(daytonaId);
    await this.call('deleting the sandbox', async () => (await this.daytona().get(daytonaId)).delete()).catch((e: DaytonaProviderError) => {
      if (e.kind !== 'not_found') throw e;
    });
  }

  async destroy({ root }: { repository: string; root: string }): Promise<void> {
    const w = this.where(root);
    const record = await readJson<DaytonaRecord>(w.recordFile);
    if (record) await this.deleteRemote(record.daytonaId);
    await fs.rm(w.recordFile, { force: true });
    await fs.rm(`${w.root}.rebuild.json`, { force: true });
    await fs.rmdir(path.dirname(w.root)).catch(() => undefined);
  }

  async collect(handle: Pick<SandboxHandle, 'root'>, options: { known?: string[]; signal?: AbortSignal } = {}): Promise<{ head: string; imported: boolean }> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    const head = await this.head(w.root);
    const prior = await collectKnownHead(w.repository, record, head, options.known);
    if (prior.collected) return { head, imported: false };
    const { known } = prior;
    const s = await this.remote(record.daytonaId);
    const remoteBundle = path.posix.join(path.posix.dirname(record.workspace), '.slipway-out', `${randomBytes(6).toString('hex')}.bundle`);
    const made = await this.exec(handle, { command: '/bin/sh', args: ['-c', `mkdir -p "$(dirname "$1")" && out=$1 && shift && /bin/sh -c "$0" collect "$@" > "$out"`, BUNDLE_HEAD_SCRIPT, remoteBundle, ...known], timeoutMs: 10 * 60_000, signal: options.signal });
    if (made.exitCode !== 0) throw new Error(`bundling the sandbox's work failed (exit ${made.exitCode}): ${made.stderr.trim()}`);
    const max = this.options.maxBundleBytes ?? MAX_COLLECT_PACK_BYTES;
    const size = Number((await this.control(s, 'stat -c %s -- "$1"', [remoteBundle])).output.trim());
    if (!Number.isFinite(size) || size > max) throw new BundleRefusedError(`it exceeds ${max} bytes`);
    const local = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-daytona-'));
    try {
      const file = path.join(local, 'work.bundle');
      await fs.writeFile(file, await this.call('downloading the bundle', () => s.fs.downloadFile(remoteBundle)));
      // importBundle reads a producer's stdout: here, the downloaded file (still hostile; checked in quarantine).
      const imported = await importBundle(w.repository, { command: 'cat', args: [file], env: { PATH: SANDBOX_BASE_ENV.PATH }, cwd: local }, { branch: record.branch, baseCommit: record.startCommit, maxBytes: max, signal: options.signal });
      return { head: imported.head, imported: true };
    } finally {
      await fs.rm(local, { recursive: true, force: true });
      await this.control(s, 'rm -f -- "$1"', [remoteBundle]).catch(() => undefined);
    }
  }

  /** A fresh bundle of the repository's branches and tags, fetched inside under refs/slipway/upstream/ (as container sandboxes do). */
  async bringCommits(handle: Pick<SandboxHandle, 'root'>, commits: string[]): Promise<void> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    const s = await this.remote(record.daytonaId);
    const local = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-daytona-'));
    const remoteBundle = path.posix.join(path.posix.dirname(record.workspace), '.slipway-in', 'update.bundle');
    try {
      await git(w.repository, ['bundle', 'create', '-q', path.join(local, 'update.bundle'), '--branches', '--tags']);
      await this.call('uploading the update bundle', async () => s.fs.uploadFile(await fs.readFile(path.join(local, 'update.bundle')), remoteBundle));
    } finally {
      await fs.rm(local, { recursive: true, force: true });
    }
    const fetch = await this.exec(handle, { command: 'git', args: ['fetch', '-q', '--no-tags', remoteBundle, '+refs/heads/*:refs/slipway/upstream/heads/*', '+refs/tags/*:refs/slipway/upstream/tags/*'], timeoutMs: 10 * 60_000 });
    if (fetch.exitCode !== 0) throw new Error(`fetching the repository's branches into the sandbox failed (exit ${fetch.exitCode}): ${fetch.stderr.trim()}`);
    for (const c of commits) {
      const has = await this.exec(handle, { command: 'git', args: ['cat-file', '-e', `${c}^{commit}`], timeoutMs: 60_000 });
      if (has.exitCode !== 0) throw new Error(`commit ${c} is on no branch or tag of ${w.repository}: it cannot be brought into the sandbox`);
    }
  }

  /** Sandboxes of the repository, found by label (rediscovery after a restart, the janitor). */
  async list(repository: string) {
    const repo = await fs.realpath(repository);
    const out: Array<{ root: string; branch?: string; head: string; sandboxId?: string }> = [];
    const found = await this.call('listing sandboxes', async () => {
      const all: Sandbox[] = [];
      for await (const s of this.daytona().list({ labels: { 'slipway.repository': repositoryLabel(repo) } })) all.push(s);
      return all;
    });
    for (const s of found) {
      const group = s.labels?.['slipway.group'];
      const name = s.labels?.['slipway.name'];
      if (!group || !name || s.state === 'destroyed') continue;
      const root = daytonaSandboxRoot(repo, group, name);
      const record = await readJson<DaytonaRecord>(`${root}.json`);
      if (!record || record.state === 'creating' || record.daytonaId !== s.id) continue;
      this.sandboxes.set(s.id, s);
      const head = record.state === 'suspended' && record.suspendedHead ? record.suspendedHead : s.state === 'started' ? await this.head(root).catch(() => record.startCommit) : record.startCommit;
      out.push({ root, branch: record.branch, head, sandboxId: record.sandboxId });
    }
    return out;
  }

  /**
   * The janitor's sweep of an ended objective (ADR 0019): every Daytona sandbox of the
   * repository's group found by its labels is deleted (one whose record a crash lost too), then
   * Slipway's records in the group. Returns the roots of the sandboxes deleted.
   */
  async sweepGroup(repository: string, group: string): Promise<string[]> {
    const repo = await fs.realpath(repository);
    const found = await this.call('listing sandboxes', async () => {
      const all: Sandbox[] = [];
      for await (const s of this.daytona().list({ labels: { 'slipway.repository': repositoryLabel(repo), 'slipway.group': group } })) all.push(s);
      return all;
    });
    const removed: string[] = [];
    for (const s of found) {
      await this.deleteRemote(s.id);
      const name = s.labels?.['slipway.name'];
      if (name) removed.push(daytonaSandboxRoot(repo, group, name));
    }
    const dir = path.join(repo, DAYTONA_DIR, group);
    await fs.rm(dir, { recursive: true, force: true });
    return removed;
  }

  /** Stops the Daytona sandbox; its disk stays, so restore is a start (processes do not survive). */
  async suspend(handle: Pick<SandboxHandle, 'root'>): Promise<{ snapshotRef: string; bytes: number }> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    const suspendedHead = record.state === 'suspended' ? record.suspendedHead : await this.head(w.root).catch(() => undefined);
    const s = await this.remote(record.daytonaId, true);
    if (s.state !== 'stopped') await this.call('stopping the sandbox', () => s.stop());
    await writeJsonAtomic(w.recordFile, { ...record, state: 'suspended', ...(suspendedHead ? { suspendedHead } : {}) });
    return { snapshotRef: `daytona:${record.daytonaId}`, bytes: 0 };
  }

  async restore(handle: Pick<SandboxHandle, 'root'>): Promise<{ root: string; branch?: string; head: string }> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    const s = await this.remote(record.daytonaId, true);
    if (s.state !== 'started') await this.call('starting the sandbox', () => s.start());
    const head = await this.head(w.root);
    await writeJsonAtomic(w.recordFile, { ...record, state: 'ready', suspendedHead: undefined });
    return { root: w.root, branch: record.branch, head };
  }

  /** Nothing to drop: a suspended Daytona sandbox is the stopped sandbox, which destroy deletes. */
  async deleteSnapshot(): Promise<void> {}

  /** Polls Daytona's state: a sandbox stopped, archived or deleted outside Slipway is dead, with the reason. */
  async probe(handle: Pick<SandboxHandle, 'root'>): Promise<SandboxLiveness> {
    const record = await this.record(handle.root);
    const s = await this.remote(record.daytonaId, true).catch((e: DaytonaProviderError) => {
      if (e.kind === 'not_found') return undefined;
      throw e;
    });
    if (!s || s.state === 'destroyed' || s.state === 'destroying') return { alive: false, reason: 'sandbox_deleted', detail: `Daytona sandbox ${record.daytonaId} was deleted` };
    if (s.state === 'started') return { alive: true };
    if (s.state === 'stopped' && record.state === 'suspended') return { alive: true };
    if (s.state === 'archived' || s.state === 'archiving') return { alive: false, reason: 'sandbox_archived', detail: `Daytona sandbox ${record.daytonaId} was archived` };
    if (s.state === 'stopped' || s.state === 'stopping') return { alive: false, reason: 'sandbox_stopped', detail: `Daytona sandbox ${record.daytonaId} was stopped outside Slipway (auto-stop or by hand)` };
    if (s.state === 'error' || s.state === 'build_failed') return { alive: false, reason: 'sandbox_error', detail: `Daytona sandbox ${record.daytonaId} is in error: ${s.errorReason ?? 'no reason given'}` };
    return { alive: true };
  }
}
