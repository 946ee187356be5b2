/**
 * Kubernetes sandboxes (`provider: kubernetes`, ADR 0020): one pod per Slipway sandbox, made
 * through the API server with @kubernetes/client-node; its workspace is a PersistentVolumeClaim
 * (kept while suspended) or an emptyDir, mounted at /workspace.
 *
 *   <repo>/.slipway/kubernetes/<group>/<name>        the sandbox's root as Slipway names it (no folder)
 *   <repo>/.slipway/kubernetes/<group>/<name>.json   Slipway's record (namespace, pod, claim, branch, start commit, state)
 *
 * Every command goes through the pod's `exec` subresource (client-node's Exec, a WebSocket to the
 * API server, which reaches the kubelet): no inbound connection to the pod, no agent in it.
 * A command runs in its own session (setsid) under a wrapper whose argv carries the exec's id,
 * so a timeout or cancel kills its whole process group inside the pod (closing the WebSocket
 * alone does not, on every kubelet). The command's directory and environment travel as the first
 * line of its stdin, never in argv; the rest of stdin is the command's.
 *
 * The workspace is a repository of its own started from a base bundle sent over exec's stdin
 * (git-transport.ts); work comes back as a bundle read from exec's stdout and checked by
 * importBundle in quarantine. Files go through exec too (cat in, cat out), confined to the
 * workspace: `..` and absolute paths are refused here, symbolic links are resolved inside the
 * pod (`realpath -m`) and a path landing outside the workspace is refused. That check confines
 * within the pod; the pod is the boundary (nothing of the worker's is in it).
 */
import { createHash, randomBytes } from 'node:crypto';
import { spawn } from 'node:child_process';
import { createWriteStream, promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { PassThrough, Readable, Writable } from 'node:stream';
import type { CoreV1Api, Exec, KubeConfig, V1Pod, V1Status } from '@kubernetes/client-node';
import { kubernetesSdk } from './kube-watch';
import { quote } from 'shell-quote';
import { ENV_HEADER_WRAPPER, envHeader, envHeaderArgv } from './env-header';
import { SLIPWAY_DIR } from '../../core/ids';
import { classifyKubeStatus, KUBE_CONTAINER, KUBE_LABELS, KUBE_WORKSPACE, LABEL_VALUE, podEnd, podReady, sandboxClaim, sandboxPod, unschedulable, type KubeFailureKind, type KubernetesSettings } from '../../core/kubernetes';
import { readJson, writeJsonAtomic } from '../../lib/atomic-write';
import { branchExists, commitIdentity, ensureSlipwayExcluded, git, gitMaybe, resolveCommit } from '../../lib/git';
import { TailBuffer, type RunResult } from '../process';
import { KILL_EXEC_SCRIPT, newExecId, SIGNAL_EXEC_SCRIPT } from './container';
import { PodWatchers, type PodExit, type SandboxPodWatch } from './kube-watch';
import { BUNDLE_HEAD_SCRIPT, BundleRefusedError, collectKnownHead, importBundle, makeBaseBundle, START_FROM_BUNDLE_SCRIPT } from './git-transport';
import { checkRequestedPath, checkReservedPath, FileTooLargeError, listedEntries, NotRegularFileError, type FileEntry, type FileIoOptions, type OpenedFile } from './file-io';
import { NotAFolderError, parseProviderRoot, PathEscapeError, providerSandboxRoot } from './paths';
import { SANDBOX_BASE_ENV, SandboxProviderError, type ExecRequest, type ProjectSetup, type ProviderFailureKind, type SandboxCreateRequest, type SandboxHandle, type SandboxLiveness, type SandboxProvider, type SandboxSession, type SessionExit, type SessionRequest } from './provider';
import { checkSize, SessionRequestError, TERMINAL_SIGNAL_KEYS, terminalInput } from './session';
import { MAX_COLLECT_PACK_BYTES, OBJECT_ID } from './sandbox-git';
import { runProjectSetup } from './setup';
import { PoolFills } from './pool-fills';

export const KUBERNETES_DIR = `${SLIPWAY_DIR}/kubernetes`;

export interface KubernetesProviderOptions {
  /** Default: KUBECONFIG or ~/.kube/config or the in-cluster service account (client-node's loadFromDefault). */
  kubeConfig?: KubeConfig;
  /** Settings for sandboxes whose request names none (namespace, image, nodeSelector, ...). */
  defaults?: KubernetesSettings;
  /** Extra labels (account, project) on every pod and claim. */
  labels?: Record<string, string>;
  /** How long a pod may take to be Ready (default 5 minutes). */
  readyTimeoutMs?: number;
  /** How long the scheduler may refuse a pod before the create fails with its message (default 30 s). */
  unschedulableTimeoutMs?: number;
  /** Retries of a 429 or 5xx (default 4). */
  retries?: number;
  maxBundleBytes?: number;
  /** The informers this provider's pods are watched by (default: the process's, PodWatchers.shared: one per namespace per worker). */
  watchers?: PodWatchers;
}

interface KubeRecord {
  version: 1;
  sandboxId: string;
  group: string;
  name: string;
  branch: string;
  baseCommit: string;
  startCommit: string;
  namespace: string;
  pod: string;
  /** The workspace's claim; absent for an emptyDir workspace. */
  claim?: string;
  image: string;
  settings: KubernetesSettings;
  state: 'creating' | 'ready' | 'suspended';
  suspendedHead?: string;
  createdAt: string;
}

/** The API server refused or failed; `kind` says how (quota, rate_limit, not_found, transient, unauthorized, other). */
export class KubernetesProviderError extends SandboxProviderError {
  constructor(message: string, kind: ProviderFailureKind, status?: number, readonly kubeKind: KubeFailureKind = kind) {
    super(message, kind, status);
    this.name = 'KubernetesProviderError';
  }
}

export function kubernetesSandboxRoot(repository: string, group: string, name: string): string {
  return providerSandboxRoot(KUBERNETES_DIR, repository, group, name);
}

/** `<repo>/.slipway/kubernetes/<group>/<name>` -> its parts, or undefined for other paths. */
export function parseKubernetesRoot(root: string): { repository: string; group: string; name: string } | undefined {
  return parseProviderRoot(KUBERNETES_DIR, root);
}

/**
 * A label value from any string: itself when it is a valid one, else a readable prefix and a
 * hash (the exact value travels in an annotation).
 */
export function kubeLabelValue(value: string): string {
  if (value.length <= 63 && LABEL_VALUE.test(value)) return value;
  const hash = createHash('sha256').update(value).digest('hex').slice(0, 12);
  const prefix = value.replace(/[^A-Za-z0-9_.-]/g, '-').replace(/^[^A-Za-z0-9]+/, '').slice(0, 48).replace(/[^A-Za-z0-9]+$/, '');
  return prefix ? `${prefix}-${hash}` : hash;
}

const repositoryLabel = (repo: string) => createHash('sha256').update(repo).digest('hex').slice(0, 24);
const q = (s: string) => quote([s]);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** An error from client-node (ApiException: `code`, `body`) or a refused WebSocket, as a KubernetesProviderError. */
export function classifyKubeError(e: unknown, what: string): KubernetesProviderError {
  if (e instanceof KubernetesProviderError) return e;
  const err = e as { code?: number; body?: unknown; message?: string };
  let status = typeof err?.code === 'number' ? err.code : undefined;
  let message = err?.message ?? String(e);
  let body = err?.body;
  if (typeof body === 'string') {
    try {
      body = JSON.parse(body);
    } catch {
      /* not JSON */
    }
  }
  if (body && typeof body === 'object' && typeof (body as { message?: unknown }).message === 'string') message = (body as { message: string }).message;
  const ws = /Unexpected server response: (\d+)/.exec(message);
  if (ws) status = Number(ws[1]);
  if (status === undefined && /ECONNREFUSED|ECONNRESET|socket hang up|ETIMEDOUT|EPIPE/.test(message)) status = 503;
  const c = classifyKubeStatus(status, message);
  const kind: ProviderFailureKind = c.kind === 'conflict' || c.kind === 'gone' ? 'other' : c.kind;
  return new KubernetesProviderError(`Kubernetes: ${what}: ${c.message}`, kind, status, c.kind);
}

/** Splits a byte stream into lines for onLine; the last partial line on flush. */
function lineSplitter(emit: (line: string) => void) {
  let partial = '';
  return {
    push: (chunk: Buffer) => {
      const parts = (partial + chunk.toString('utf8')).split('\n');
      partial = parts.pop() ?? '';
      for (const l of parts) emit(l);
    },
    flush: () => {
      if (partial) emit(partial);
      partial = '';
    },
  };
}

/**
 * Every command runs under env-header.ts's wrapper: `setsid -w /bin/sh -c WRAPPER <exec id> <command...>`.
 * The first stdin line is a base64 header (cwd check, cd, exports) evaluated before the command;
 * the command gets the rest of stdin.
 */
const WRAPPER = ENV_HEADER_WRAPPER;
/** Exit code and stderr marker of a refused cwd (the command never started). */
const CWD_REFUSED = 125;
const CWD_MARK = 'slipway-cwd:';

function header(workspace: string, cwd: string | undefined, env: Record<string, string>): Buffer {
  const lines: string[] = [];
  if (cwd) {
    lines.push(
      `w=$(realpath -m -- ${q(workspace)}) && c=$(cd -- ${q(workspace)} && realpath -m -- ${q(cwd)}) || { echo ${CWD_MARK}error >&2; exit ${CWD_REFUSED}; }`,
      `case "$c" in "$w"|"$w"/*) ;; *) echo ${CWD_MARK}escape >&2; exit ${CWD_REFUSED};; esac`,
      `if [ ! -d "$c" ]; then if [ -e "$c" ]; then echo ${CWD_MARK}other >&2; else echo ${CWD_MARK}none >&2; fi; exit ${CWD_REFUSED}; fi`,
      'cd -- "$c" || exit 125',
    );
  } else lines.push(`cd -- ${q(workspace)} || exit 125`);
  lines.push('unset h w c');
  return envHeader(env, lines);
}

/** A file operation's script: $1 workspace, $2 path; refusals by exit code (never reached by the sandbox's own commands). */
const RESOLVE = 'w=$(realpath -m -- "$1") && cd -- "$1" && r=$(realpath -m -- "$2") || exit 90\ncase "$r" in "$w"|"$w"/*) ;; *) exit 91;; esac';
const READ_SCRIPT = `${RESOLVE}\n[ -e "$r" ] || exit 92\n[ -f "$r" ] || exit 93\nexec cat -- "$r"`;
const WRITE_SCRIPT = `${RESOLVE}\n[ "$r" = "$w" ] && exit 93\nmkdir -p -- "$(dirname -- "$r")" && exec cat > "$r"`;
/** Deletes the last component itself (a link, never its target): its folder resolved, the name kept. */
const DELETE_SCRIPT = `${RESOLVE}\n[ -d "$r/$3" ] && [ ! -L "$r/$3" ] && exit 93\nexec rm -f -- "$r/$3"`;
/** The resolved path (relative to the workspace, NUL-ended), then `d`, `f<size>` or `o`. */
const STAT_SCRIPT = `${RESOLVE}\n[ -e "$r" ] || exit 92\nprintf '%s\\0' "\${r#"$w"}"\nif [ -d "$r" ]; then printf d; elif [ -f "$r" ]; then printf "f%s" "$(stat -c %s -- "$r")"; else printf o; fi`;
/** The resolved folder (relative, NUL-ended), then `<type> <size> <name>` NUL-ended per entry. */
const LIST_SCRIPT = `${RESOLVE}\n[ -e "$r" ] || exit 92\n[ -d "$r" ] || exit 94\nprintf '%s\\0' "\${r#"$w"}"\ncd -- "$r" && exec find . -mindepth 1 -maxdepth 1 -printf '%y %s %f\\0'`;

/** Internal: stdin as bytes (bundles), output as bytes as it comes (collect). */
type KubeExecRequest = ExecRequest & { stdinBytes?: Buffer; onBytes?: (stream: 'stdout' | 'stderr', chunk: Buffer) => void };

interface RawExec {
  status: V1Status | undefined;
  exitCode: number | null;
}

export class KubernetesSandboxProvider implements SandboxProvider {
  readonly kind = 'kubernetes';
  /** A pod is reachable from any worker with the credentials. */
  readonly hostBound = false;
  private kcCache?: KubeConfig;
  private coreCache?: CoreV1Api;
  private unsubscribe?: () => void;
  private readonly fills = new PoolFills();

  constructor(private readonly options: KubernetesProviderOptions = {}) {}

  private kc(): KubeConfig {
    if (this.kcCache) return this.kcCache;
    if (this.options.kubeConfig) return (this.kcCache = this.options.kubeConfig);
    const kc = new (kubernetesSdk().KubeConfig)();
    kc.loadFromDefault();
    if (!kc.getCurrentCluster()) throw new KubernetesProviderError('Kubernetes: no cluster configured: set KUBECONFIG (or run the worker in a cluster with a service account)', 'unauthorized');
    return (this.kcCache = kc);
  }

  private core(): CoreV1Api {
    return (this.coreCache ??= this.kc().makeApiClient(kubernetesSdk().CoreV1Api));
  }

  /** The namespace sandboxes go to when their settings name none: the kubeconfig context's, else `default`. */
  defaultNamespace(): string {
    const kc = this.kc();
    return this.options.defaults?.namespace ?? kc.getContextObject(kc.getCurrentContext())?.namespace ?? 'default';
  }

  private get watchers(): PodWatchers {
    return this.options.watchers ?? PodWatchers.shared;
  }

  /**
   * The pod watcher on the provider's namespace, or `opts.namespace` (the worker's one informer there, started on
   * first use): `onExit` hears of every sandbox pod there that dies outside Slipway, and probe
   * answers from what it saw.
   */
  watch(onExit?: (exit: PodExit) => void, opts: { resourceVersion?: string; namespace?: string } = {}): SandboxPodWatch {
    const { namespace = this.defaultNamespace(), ...rest } = opts;
    const w = this.watchers.watch(this.kc(), namespace, rest);
    if (onExit && !this.unsubscribe) this.unsubscribe = this.watchers.onExit((e) => e.namespace === namespace && onExit(e));
    return w;
  }

  async stopWatch(): Promise<void> {
    this.unsubscribe?.();
    this.unsubscribe = undefined;
    await this.watchers.stop(this.kc(), this.defaultNamespace());
  }

  /** Runs an API call, retrying 429 and 5xx with back-off; other errors are mapped and thrown. */
  async call<T>(what: string, op: () => Promise<T>): Promise<T> {
    const retries = this.options.retries ?? 4;
    for (let attempt = 0; ; attempt++) {
      try {
        return await op();
      } catch (e) {
        const err = classifyKubeError(e, what);
        if ((err.kind !== 'transient' && err.kind !== 'rate_limit') || attempt >= retries) throw err;
        await sleep(Math.min(250 * 2 ** attempt, 5_000));
      }
    }
  }

  private where(root: string) {
    const resolved = path.resolve(root);
    const parsed = parseKubernetesRoot(resolved);
    if (!parsed) throw new Error(`not a Kubernetes sandbox root (<repo>/${KUBERNETES_DIR}/<group>/<name>): ${root}`);
    return { ...parsed, root: resolved, recordFile: `${resolved}.json` };
  }

  private async record(root: string): Promise<KubeRecord> {
    const w = this.where(root);
    const r = await readJson<KubeRecord>(w.recordFile);
    if (!r) throw new Error(`no record of the Kubernetes sandbox at ${w.root}`);
    return r;
  }

  private async readPod(namespace: string, name: string): Promise<V1Pod | undefined> {
    return this.call(`reading pod ${namespace}/${name}`, () => this.core().readNamespacedPod({ namespace, name })).catch((e: KubernetesProviderError) => {
      if (e.kind === 'not_found') return undefined;
      throw e;
    });
  }

  private settingsOf(req: SandboxCreateRequest): KubernetesSettings {
    const d = this.options.defaults ?? {};
    const r = req.kubernetes ?? {};
    return { ...d, ...Object.fromEntries(Object.entries(r).filter(([, v]) => v !== undefined)), labels: { ...d.labels, ...r.labels } };
  }

  async create(req: SandboxCreateRequest): Promise<SandboxHandle> {
    const started = Date.now();
    const repo = await fs.realpath(req.repository);
    await ensureSlipwayExcluded(repo);
    const w = this.where(kubernetesSandboxRoot(repo, req.group, req.name));
    const [baseCommit, record] = await Promise.all([resolveCommit(repo, req.base), readJson<KubeRecord>(w.recordFile)]);
    if (record && record.state !== 'creating') {
      if (record.branch !== req.branch) throw new Error(`sandbox ${w.root} exists on branch ${record.branch}, expected ${req.branch}`);
      if (record.state === 'suspended') {
        await this.restore({ root: w.root });
        return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit: await this.head(w.root), reused: true };
      }
      const pod = await this.readPod(record.namespace, record.pod);
      if (pod && !podEnd(pod)) {
        if (!podReady(pod)) await this.waitReady(record.namespace, record.pod, req.signal);
        return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit: await this.head(w.root), reused: true };
      }
    }
    // A half-made or dead sandbox: its pod and claim go before a new one is made.
    if (record) await this.deleteObjects(record);
    if (!(await branchExists(repo, req.branch))) await git(repo, ['update-ref', `refs/heads/${req.branch}`, baseCommit, '']);
    const startCommit = await resolveCommit(repo, `refs/heads/${req.branch}`);
    const settings = this.settingsOf(req);
    const image = settings.image ?? process.env.SLIPWAY_KUBE_IMAGE;
    if (!image) throw new Error('kubernetes.image is not set: name the sandbox image in the objective file\'s sandbox.kubernetes.image, the profile, or SLIPWAY_KUBE_IMAGE');
    const namespace = settings.namespace ?? this.defaultNamespace();
    // A fresh name per pod: a destroyed sandbox's pod may still be terminating under the old one.
    const podName = `slipway-${createHash('sha256').update(w.root).digest('hex').slice(0, 12)}-${randomBytes(3).toString('hex')}`;
    const claim = settings.workspace === 'ephemeral' ? undefined : podName;
    const warm = (req.warmPool ?? 0) > 0;
    const draft: KubeRecord = { version: 1, sandboxId: req.sandboxId, group: req.group, name: req.name, branch: req.branch, baseCommit, startCommit, namespace, pod: podName, ...(claim ? { claim } : {}), image, settings, state: 'creating', createdAt: new Date().toISOString() };
    const pooled = warm ? await this.claimPooled(draft, repo) : undefined;
    const base: KubeRecord = pooled ? { ...draft, pod: pooled.pod, ...(pooled.claim ? { claim: pooled.claim } : {}) } : draft;
    await writeJsonAtomic(w.recordFile, base, { mkdir: true });
    // A worker watches every namespace it makes pods in (one informer each): deaths are pushed, not polled.
    this.watchers.ensure(this.kc(), namespace);
    if (warm) void this.fillPool(namespace, image, settings, req.warmPool!).catch(() => undefined);
    try {
      if (!pooled) {
        await this.makePod(base, repo);
        await this.waitReady(namespace, base.pod, req.signal);
      }
      const local = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-kube-'));
      let bundle: Buffer;
      try {
        await makeBaseBundle(repo, req.branch, path.join(local, 'base.bundle'));
        bundle = await fs.readFile(path.join(local, 'base.bundle'));
      } finally {
        await fs.rm(local, { recursive: true, force: true });
      }
      const { name, email } = await commitIdentity(repo);
      const start = await this.exec(
        { root: w.root },
        {
          command: '/bin/sh',
          args: ['-c', 'mkdir -p /tmp/slipway-in && cat > /tmp/slipway-in/base.bundle && /bin/sh -c "$0" start /tmp/slipway-in/base.bundle "$1" "$2" "$3" && rm -f /tmp/slipway-in/base.bundle', START_FROM_BUNDLE_SCRIPT, req.branch, name, email],
          stdinBytes: bundle,
          timeoutMs: 10 * 60_000,
          signal: req.signal,
        } as KubeExecRequest,
      );
      if (start.exitCode !== 0) throw new Error(`starting the sandbox from its bundle failed (exit ${start.exitCode}): ${start.stderr.trim()}`);
      for (const host of req.container?.readable ?? []) await this.copyIn({ root: w.root }, host);
      let setup: SandboxHandle['setup'];
      if (req.setup && (req.setup.commands.length > 0 || req.setup.verify.length > 0)) {
        setup = await runProjectSetup((r) => this.exec({ root: w.root }, r), req.setup as ProjectSetup, { signal: req.signal, onProgress: req.onProgress });
      }
      const headCommit = await this.head(w.root);
      await writeJsonAtomic(w.recordFile, { ...base, state: 'ready' });
      return { sandboxId: req.sandboxId, provider: this.kind, root: w.root, branch: req.branch, baseCommit, headCommit, reused: false, origin: pooled ? 'pool' : 'cold', ...(setup ? { setup } : {}), durationMs: Date.now() - started };
    } catch (e) {
      // Nothing half-made stays: the pod and claim go, and the record with them.
      await this.deleteObjects(base).catch(() => undefined);
      await fs.rm(w.recordFile, { force: true });
      throw e;
    }
  }

  private labelsOf(r: KubeRecord, repo: string): Record<string, string> {
    return {
      ...r.settings.labels,
      ...this.options.labels,
      [KUBE_LABELS.managed]: 'true',
      [KUBE_LABELS.sandbox]: kubeLabelValue(r.sandboxId),
      [KUBE_LABELS.repository]: repositoryLabel(repo),
      [KUBE_LABELS.group]: kubeLabelValue(r.group),
    };
  }

  private annotationsOf(r: KubeRecord): Record<string, string> {
    return { 'slipway.dev/sandbox-id': r.sandboxId, 'slipway.dev/group': r.group, 'slipway.dev/name': r.name };
  }

  /** The claim (when the workspace is one, and not there yet) and the pod of a record. */
  private async makePod(r: KubeRecord, repo: string | undefined, poolKey?: string): Promise<void> {
    const labels = poolKey
      ? { ...r.settings.labels, ...this.options.labels, [KUBE_LABELS.managed]: 'true', [KUBE_LABELS.pool]: poolKey, [KUBE_LABELS.poolProfile]: this.poolProfile(r.namespace, r.settings), [KUBE_LABELS.claimed]: 'false' }
      : this.labelsOf(r, repo!);
    const annotations = poolKey ? {} : this.annotationsOf(r);
    if (r.claim) {
      const claimName = r.claim;
      const existing = await this.call(`reading claim ${r.namespace}/${claimName}`, () => this.core().readNamespacedPersistentVolumeClaim({ namespace: r.namespace, name: claimName })).catch((e: KubernetesProviderError) => {
        if (e.kind === 'not_found') return undefined;
        throw e;
      });
      if (!existing) await this.call(`creating claim ${r.namespace}/${claimName}`, () => this.core().createNamespacedPersistentVolumeClaim({ namespace: r.namespace, body: sandboxClaim({ name: claimName, namespace: r.namespace, settings: r.settings, labels, annotations }) as never }));
    }
    await this.call(`creating pod ${r.namespace}/${r.pod}`, () => this.core().createNamespacedPod({ namespace: r.namespace, body: sandboxPod({ name: r.pod, namespace: r.namespace, image: r.image, settings: r.settings, labels, annotations, claim: r.claim }) as never }));
  }

  /**
   * A host folder the sandbox should read (the objective's folder, where script agents and
   * prompt files live), copied into the pod at the same absolute path: a pod cannot bind a
   * worker's folder as a container does. A copy, made read-only for the sandbox's user by mode
   * only; at most 64 MiB. A path that does not exist is left out.
   */
  private async copyIn(handle: Pick<SandboxHandle, 'root'>, host: string): Promise<void> {
    const stat = await fs.stat(host).catch(() => undefined);
    if (!stat) return;
    const tar = await new Promise<Buffer>((resolve, reject) => {
      const child = spawn('tar', ['-C', path.dirname(host), '-cf', '-', '--', path.basename(host)], { stdio: ['ignore', 'pipe', 'pipe'] });
      const out: Buffer[] = [];
      let size = 0;
      let err = '';
      child.stdout.on('data', (c: Buffer) => {
        size += c.length;
        if (size > 64 * 1024 * 1024) child.kill('SIGKILL');
        else out.push(c);
      });
      child.stderr.on('data', (c: Buffer) => (err += c.toString()));
      child.on('error', reject);
      child.on('close', (code) => (size > 64 * 1024 * 1024 ? reject(new Error(`${host} is over 64 MiB: too big to copy into a pod`)) : code === 0 ? resolve(Buffer.concat(out)) : reject(new Error(`tar of ${host} failed: ${err.trim()}`))));
    });
    const r = await this.exec(handle, { command: '/bin/sh', args: ['-c', 'mkdir -p -- "$1" && tar -C "$1" -xf - --no-same-owner && chmod -R a-w -- "$1/$2"', 'copy-in', path.dirname(host), path.basename(host)], stdinBytes: tar, timeoutMs: 5 * 60_000 } as KubeExecRequest);
    if (r.exitCode !== 0) throw new Error(`copying ${host} into the pod failed (exit ${r.exitCode}): ${r.stderr.trim()}`);
  }

  /** The warm pool a sandbox with these settings draws from: its image and everything in its pod spec. */
  poolKey(namespace: string, image: string, settings: KubernetesSettings): string {
    const { labels: _labels, ...spec } = settings;
    return createHash('sha256').update(JSON.stringify({ namespace, image, spec })).digest('hex').slice(0, 16);
  }

  /** The pool's settings without the image: pods of the same profile made from an older image share it, and are retired. */
  private poolProfile(namespace: string, settings: KubernetesSettings): string {
    const { labels: _labels, image: _image, ...spec } = settings;
    return createHash('sha256').update(JSON.stringify({ namespace, spec })).digest('hex').slice(0, 16);
  }

  /**
   * Keeps `size` unclaimed pods (and their claims) of this key Ready; resolves once they are.
   * Unclaimed pods of the same settings made from another image are retired (deleted, with
   * their claims): an image roll drains the pool. One fill per key at a time in this provider
   * (concurrent creates do not overshoot), and one asked for meanwhile passes again (PoolFills).
   */
  fillPool(namespace: string, image: string, settings: KubernetesSettings, size: number): Promise<number> {
    const key = this.poolKey(namespace, image, settings);
    return this.fills.run(key, () => this.fillPoolOnce(key, namespace, image, settings, size));
  }

  private async fillPoolOnce(key: string, namespace: string, image: string, settings: KubernetesSettings, size: number): Promise<number> {
    const profile = this.poolProfile(namespace, settings);
    const stale = await this.call('listing the warm pool', () => this.core().listNamespacedPod({ namespace, labelSelector: `${KUBE_LABELS.poolProfile}=${profile},${KUBE_LABELS.pool}!=${key},${KUBE_LABELS.claimed}=false` }));
    for (const pod of stale.items) {
      const name = pod.metadata!.name!;
      const claim = pod.spec?.volumes?.find((v) => v.name === 'workspace')?.persistentVolumeClaim?.claimName;
      await this.deleteObjects({ namespace, pod: name, ...(claim ? { claim } : {}) } as KubeRecord);
    }
    const pods = await this.call('listing the warm pool', () => this.core().listNamespacedPod({ namespace, labelSelector: `${KUBE_LABELS.pool}=${key},${KUBE_LABELS.claimed}=false` }));
    const live = pods.items.filter((p) => !podEnd(p));
    const missing = Math.max(0, size - live.length);
    const made: string[] = [];
    for (let i = 0; i < missing; i++) {
      const name = `slipway-pool-${key.slice(0, 8)}-${randomBytes(3).toString('hex')}`;
      const r: KubeRecord = { version: 1, sandboxId: `pool.${key}`, group: 'pool', name, branch: '', baseCommit: '', startCommit: '', namespace, pod: name, ...(settings.workspace === 'ephemeral' ? {} : { claim: name }), image, settings, state: 'creating', createdAt: new Date().toISOString() };
      await this.makePod(r, undefined, key);
      made.push(name);
    }
    await Promise.all(made.map((name) => this.waitReady(namespace, name)));
    return made.length;
  }

  /**
   * Takes a Ready pod of the pool: a label patch carrying the pod's resourceVersion, so of two
   * creates that pick the same pod one wins and the other gets 409 Conflict and tries the next.
   * The winner relabels the pod's claim as the sandbox's too. Undefined when the pool is empty.
   */
  private async claimPooled(r: KubeRecord, repo: string): Promise<{ pod: string; claim?: string } | undefined> {
    const key = this.poolKey(r.namespace, r.image, r.settings);
    const pods = await this.call('listing the warm pool', () => this.core().listNamespacedPod({ namespace: r.namespace, labelSelector: `${KUBE_LABELS.pool}=${key},${KUBE_LABELS.claimed}=false` }));
    const ready = pods.items.filter((p) => podReady(p) && !p.metadata?.deletionTimestamp).sort(() => Math.random() - 0.5);
    const labels = { ...this.labelsOf(r, repo), [KUBE_LABELS.claimed]: 'true' };
    // The orphan sweep counts a claimed pool pod's age from its claim: its record is written just after.
    const annotations = { ...this.annotationsOf(r), 'slipway.dev/claimed-at': new Date().toISOString() };
    const { setHeaderOptions, PatchStrategy } = kubernetesSdk();
    const merge = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
    for (const pod of ready) {
      const name = pod.metadata!.name!;
      try {
        await this.core().patchNamespacedPod({ namespace: r.namespace, name, body: { metadata: { resourceVersion: pod.metadata!.resourceVersion, labels, annotations } } }, merge);
      } catch (e) {
        const err = classifyKubeError(e, `claiming pod ${r.namespace}/${name} from the warm pool`);
        if (err.kubeKind === 'conflict' || err.kind === 'not_found') continue;
        throw err;
      }
      const claim = pod.spec?.volumes?.find((v) => v.name === 'workspace')?.persistentVolumeClaim?.claimName;
      if (claim) await this.call(`relabelling claim ${r.namespace}/${claim}`, () => this.core().patchNamespacedPersistentVolumeClaim({ namespace: r.namespace, name: claim, body: { metadata: { labels, annotations } } }, merge));
      return { pod: name, ...(claim ? { claim } : {}) };
    }
    return undefined;
  }

  /** Until the pod is Ready; fails with the scheduler's message once it has refused the pod long enough, or with how the pod ended. */
  private async waitReady(namespace: string, name: string, signal?: AbortSignal): Promise<void> {
    const deadline = Date.now() + (this.options.readyTimeoutMs ?? 5 * 60_000);
    let refusedSince: number | undefined;
    let last: V1Pod | undefined;
    for (;;) {
      if (signal?.aborted) throw new Error(`cancelled while waiting for pod ${namespace}/${name}`);
      last = await this.readPod(namespace, name);
      if (!last) throw new KubernetesProviderError(`Kubernetes: pod ${namespace}/${name} disappeared before it was ready`, 'other');
      if (podReady(last)) return;
      const ended = podEnd(last);
      if (ended) throw new KubernetesProviderError(`Kubernetes: pod ${namespace}/${name} ended before it was ready: ${ended.detail}${last.status?.message ? ` (${last.status.message})` : ''}`, 'other');
      const waiting = last.status?.containerStatuses?.find((c) => c.state?.waiting && /ErrImagePull|ImagePullBackOff|InvalidImageName|CreateContainerConfigError|CreateContainerError/.test(c.state.waiting.reason ?? ''))?.state?.waiting;
      if (waiting) throw new KubernetesProviderError(`Kubernetes: pod ${namespace}/${name} cannot start: ${waiting.reason}: ${waiting.message ?? ''}`.trim(), 'other');
      const refused = unschedulable(last);
      if (refused) {
        refusedSince ??= Date.now();
        if (Date.now() - refusedSince > (this.options.unschedulableTimeoutMs ?? 30_000)) throw new KubernetesProviderError(`Kubernetes: pod ${namespace}/${name} cannot be scheduled: ${refused}`, 'quota');
      } else refusedSince = undefined;
      if (Date.now() > deadline) throw new KubernetesProviderError(`Kubernetes: pod ${namespace}/${name} not ready after ${(this.options.readyTimeoutMs ?? 300_000) / 1000} s (phase ${last.status?.phase ?? 'unknown'})`, 'transient');
      await sleep(200);
    }
  }

  /**
   * One command in the pod through `pods/exec`. `input` is the whole stdin (the header line
   * first); output arrives through `onData`. Resolves when the API server closes the stream,
   * with the exit code from the v4 status (null when none came: the stream was cut).
   */
  private async rawExec(r: Pick<KubeRecord, 'namespace' | 'pod'>, argv: string[], input: Buffer, onData: (stream: 'stdout' | 'stderr', chunk: Buffer) => void, control?: (close: () => void) => void): Promise<RawExec> {
    const sink = (stream: 'stdout' | 'stderr') =>
      new Writable({
        write(chunk: Buffer, _e, cb) {
          onData(stream, Buffer.from(chunk));
          cb();
        },
      });
    for (let attempt = 0; ; attempt++) {
      const stdin = new PassThrough();
      let status: V1Status | undefined;
      let ws: Awaited<ReturnType<Exec['exec']>>;
      try {
        ws = await new (kubernetesSdk().Exec)(this.kc()).exec(r.namespace, r.pod, KUBE_CONTAINER, argv, sink('stdout'), sink('stderr'), stdin, false, (s) => (status = s));
      } catch (e) {
        const err = classifyKubeError(e, `exec in pod ${r.namespace}/${r.pod}`);
        if (err.status === 403) throw new KubernetesProviderError(`Kubernetes: missing RBAC permission: get pods/exec in namespace ${r.namespace} (the API server refused the exec with 403; an API server that authorizes the WebSocket upgrade as create needs create pods/exec too)`, 'unauthorized', 403);
        // The handshake failed: nothing ran, so a 5xx or 429 can be tried again.
        if ((err.kind === 'transient' || err.kind === 'rate_limit') && attempt < (this.options.retries ?? 4)) {
          await sleep(Math.min(250 * 2 ** attempt, 5_000));
          continue;
        }
        throw err;
      }
      const closed = new Promise<void>((resolve) => ws.once('close', () => resolve()));
      control?.(() => ws.terminate());
      stdin.end(input);
      await closed;
      let exitCode: number | null = null;
      if (status?.status === 'Success') exitCode = 0;
      else if (status?.reason === 'NonZeroExitCode') exitCode = Number(status.details?.causes?.find((c) => c.reason === 'ExitCode')?.message ?? NaN);
      if (Number.isNaN(exitCode)) exitCode = null;
      return { status, exitCode };
    }
  }

  /** A trusted control command (kill, realpath), output collected; never one of the sandbox's. */
  private async control(r: Pick<KubeRecord, 'namespace' | 'pod'>, argv: string[], stdin: Buffer = Buffer.alloc(0)): Promise<{ exitCode: number | null; stdout: Buffer; stderr: string; status?: V1Status }> {
    const out: Buffer[] = [];
    let err = '';
    const res = await this.rawExec(r, argv, stdin, (s, c) => (s === 'stdout' ? out.push(c) : (err += c.toString())));
    return { exitCode: res.exitCode, stdout: Buffer.concat(out), stderr: err, status: res.status };
  }

  private async killGroup(r: KubeRecord, id: string, signal: 'TERM' | 'KILL'): Promise<void> {
    const half = Math.floor(id.length / 2);
    await this.control(r, ['/bin/sh', '-c', KILL_EXEC_SCRIPT, 'kill', id.slice(0, half), id.slice(half), signal]).catch(() => undefined);
  }

  async exec(handle: Pick<SandboxHandle, 'root'>, req: KubeExecRequest): Promise<RunResult> {
    const started = Date.now();
    const record = await this.record(handle.root);
    const result = (over: Partial<RunResult>): RunResult => ({ exitCode: null, signal: null, stdout: '', stderr: '', timedOut: false, cancelled: false, durationMs: Date.now() - started, ...over });
    const cwd = req.cwd ? lexical(req.cwd) : undefined;
    if (req.signal?.aborted) return result({ cancelled: true });
    const env = req.inheritEnv === false ? { ...req.env } : { ...SANDBOX_BASE_ENV, ...req.env };
    const id = newExecId();
    const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
    const argv = envHeaderArgv(id, inner);
    const input = Buffer.concat([header(KUBE_WORKSPACE, cwd === '.' ? undefined : cwd, env), req.stdinBytes ?? Buffer.from(req.stdin ?? '')]);
    const limit = req.maxCaptureBytes ?? 64 * 1024 * 1024;
    const out = { stdout: new TailBuffer(limit), stderr: new TailBuffer(limit) };
    const lines = { stdout: lineSplitter((l) => req.onLine?.('stdout', l)), stderr: lineSplitter((l) => req.onLine?.('stderr', l)) };
    let ending: 'timedOut' | 'cancelled' | undefined;
    let closeStream: (() => void) | undefined;
    const stop = (why: 'timedOut' | 'cancelled') => {
      if (ending) return;
      ending = why;
      void (async () => {
        if (req.killGraceMs) {
          await this.killGroup(record, id, 'TERM');
          await sleep(req.killGraceMs);
        }
        await this.killGroup(record, id, 'KILL');
        // The stream ends with the command; one that does not (a lost connection) is cut.
        setTimeout(() => closeStream?.(), 15_000).unref();
      })();
    };
    const timer = req.timeoutMs ? setTimeout(() => stop('timedOut'), req.timeoutMs) : undefined;
    const onAbort = () => stop('cancelled');
    req.signal?.addEventListener('abort', onAbort, { once: true });
    let res: RawExec;
    try {
      res = await this.rawExec(record, argv, input, (s, c) => {
        out[s].push(c);
        req.onBytes?.(s, c);
        if (req.onLine) lines[s].push(c);
      }, (close) => (closeStream = close));
    } finally {
      if (timer) clearTimeout(timer);
      req.signal?.removeEventListener('abort', onAbort);
    }
    lines.stdout.flush();
    lines.stderr.flush();
    const stderr = out.stderr.toString();
    if (!ending && res.exitCode === CWD_REFUSED && cwd) {
      const mark = new RegExp(`${CWD_MARK}(\\w+)\\n?$`).exec(stderr)?.[1];
      if (mark === 'escape') throw new PathEscapeError(req.cwd!, 'a symbolic link leads outside the sandbox');
      if (mark === 'none' || mark === 'other') throw new NotAFolderError(req.cwd!, mark === 'other' ? 'not a folder' : 'no such folder');
    }
    if (!ending && res.exitCode === null && res.status?.status === 'Failure') {
      throw new KubernetesProviderError(`Kubernetes: exec in pod ${record.namespace}/${record.pod} failed: ${res.status.message ?? res.status.reason ?? 'no message'}`, 'other');
    }
    return result({ exitCode: ending ? (res.exitCode ?? 137) : res.exitCode, stdout: out.stdout.toString(), stderr, timedOut: ending === 'timedOut', cancelled: ending === 'cancelled' });
  }

  /** Whether a process whose command line holds `marker` runs in any sandbox pod of the namespace (tests against a real cluster). */
  async processRunningInAny(marker: string): Promise<boolean> {
    const namespace = this.defaultNamespace();
    const pods = await this.call('listing sandbox pods', () => this.core().listNamespacedPod({ namespace, labelSelector: `${KUBE_LABELS.managed}=true` }));
    const half = Math.floor(marker.length / 2);
    for (const pod of pods.items.filter(podReady)) {
      // The marker in two halves, so this scan's own command line never matches.
      const r = await this.control({ namespace, pod: pod.metadata!.name! }, ['/bin/sh', '-c', 'm="$1$2"; for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] && continue; tr "\\000" " " < $d/cmdline 2>/dev/null | grep -qF -- "$m" && exit 0; done; exit 1', 'scan', marker.slice(0, half), marker.slice(half)]).catch(() => undefined);
      if (r?.exitCode === 0) return true;
    }
    return false;
  }

  /**
   * An interactive process through pods/exec, under the same wrapper as exec (its own process
   * group, found by the exec id for signals and kill). Without a pty its directory and environment
   * come first on stdin, as for exec; under a pty the terminal would echo that line, so they go
   * first into a file only root in the pod reads, which the wrapper reads and removes. A pty is
   * the kubelet's (tty=true), sized through exec's resize channel; ^C, ^\ and ^Z are typed (no setsid there: the command keeps
   * the terminal as its controlling one, so they reach it).
   */
  async openSession(handle: Pick<SandboxHandle, 'root'>, req: SessionRequest): Promise<SandboxSession> {
    const record = await this.record(handle.root);
    const cwd = req.cwd ? lexical(req.cwd) : undefined;
    const size = req.pty ? checkSize(req.pty.cols, req.pty.rows) : undefined;
    const env = { ...(req.inheritEnv === false ? {} : SANDBOX_BASE_ENV), ...(req.pty ? { TERM: 'xterm-256color' } : {}), ...req.env };
    const id = newExecId();
    const head = header(KUBE_WORKSPACE, cwd === '.' ? undefined : cwd, env);
    const inner = req.shell ? ['/bin/sh', '-c', req.command] : [req.command, ...(req.args ?? [])];
    let wrapper = WRAPPER;
    if (size) {
      const file = `/tmp/slipway-exec/${id}.env`;
      const put = await this.control(record, ['/bin/sh', '-c', 'umask 077 && mkdir -p /tmp/slipway-exec && cat > "$1"', 'put', file], head);
      if (put.exitCode !== 0) throw new Error(`preparing the session in the pod failed: ${put.stderr.trim()}`);
      // The wrapper outlives a typed ^C or ^\ (caught, so the command starts with the default
      // action and decides for itself) and passes the command's exit code on.
      wrapper = WRAPPER.replace('IFS= read -r h || exit 125', `trap : INT QUIT; IFS= read -r h < ${file}; rm -f ${file}; [ -n "$h" ] || exit 125`);
    }
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    // client-node sends the terminal's size for a stdout with rows and columns, and on its 'resize'.
    const sink = Object.assign(
      new Writable({
        write(chunk: Buffer, _e, cb) {
          stdout.write(chunk, () => cb());
        },
      }),
      size ? { columns: size.cols, rows: size.rows } : {},
    );
    const errSink = new Writable({
      write(chunk: Buffer, _e, cb) {
        stderr.write(chunk, () => cb());
      },
    });
    const input = new PassThrough();
    let status: V1Status | undefined;
    const ws = await new (kubernetesSdk().Exec)(this.kc()).exec(record.namespace, record.pod, KUBE_CONTAINER, [...(size ? [] : ['setsid', '-w']), '/bin/sh', '-c', wrapper, id, ...inner], sink, size ? null : errSink, input, !!size, (s) => (status = s)).catch((e: unknown) => {
      throw classifyKubeError(e, `opening a session in pod ${record.namespace}/${record.pod}`);
    });
    if (!size) input.write(head);
    let exited = false;
    let killed = false;
    const exit = new Promise<SessionExit>((resolve) => {
      ws.once('close', () => {
        exited = true;
        stdout.end();
        stderr.end();
        let code: number | null = null;
        if (status?.status === 'Success') code = 0;
        else if (status?.reason === 'NonZeroExitCode') code = Number(status.details?.causes?.find((c) => c.reason === 'ExitCode')?.message ?? NaN);
        if (Number.isNaN(code)) code = null;
        resolve(killed ? { exitCode: null, signal: 'SIGKILL' } : { exitCode: code, signal: null });
      });
    });
    const pipe = new Writable({
      write: (chunk: Buffer, _e, cb) => {
        if (exited) return cb();
        input.write(chunk, () => cb());
      },
      final: (cb) => {
        input.end();
        cb();
      },
    });
    pipe.on('error', () => undefined);
    // Whether closing a kubelet's tty input types an end of file is the runtime's business: typed here.
    const stdin = size ? terminalInput(pipe, false) : pipe;
    const half = Math.floor(id.length / 2);
    const signalGroup = (sig: string) => this.control(record, ['/bin/sh', '-c', SIGNAL_EXEC_SCRIPT, 'signal', id.slice(0, half), id.slice(half), sig]).catch(() => undefined);
    return {
      pid: undefined,
      pty: !!size,
      stdin,
      stdout,
      stderr,
      exit,
      resize: (cols, rows) => {
        if (!size) throw new SessionRequestError('resize needs a session with a pty');
        const next = checkSize(cols, rows, 'resize');
        if (exited) return;
        Object.assign(sink, { columns: next.cols, rows: next.rows });
        sink.emit('resize');
      },
      signal: (sig) => {
        if (!/^SIG[A-Z0-9]+$/.test(sig)) throw new SessionRequestError(`signal: ${JSON.stringify(sig)} is not a signal name`);
        if (exited) return;
        const key = size ? TERMINAL_SIGNAL_KEYS[sig] : undefined;
        if (key) input.write(key);
        else void signalGroup(sig.slice(3));
      },
      kill: () => {
        if (exited) return;
        killed = true;
        void this.killGroup(record, id, 'KILL').then(() => setTimeout(() => ws.terminate(), 5_000).unref());
      },
    };
  }

  /** A file operation through exec; its refusals as PathEscapeError / ENOENT. */
  private async fileOp(handle: Pick<SandboxHandle, 'root'>, file: string, script: string, extra: string[], stdin?: Buffer): Promise<Buffer> {
    const rel = lexical(file);
    const record = await this.record(handle.root);
    const r = await this.control(record, ['/bin/sh', '-c', script, 'file', KUBE_WORKSPACE, ...(extra.length ? [path.posix.dirname(rel), path.posix.basename(rel)] : [rel])], stdin);
    if (r.exitCode === 0) return r.stdout;
    if (r.exitCode === 91) throw new PathEscapeError(file, 'a symbolic link leads outside the sandbox');
    if (r.exitCode === 92) throw Object.assign(new Error(`ENOENT: no such file in the sandbox: ${file}`), { code: 'ENOENT' });
    if (r.exitCode === 93) throw new Error(`${file} is not a regular file in the sandbox`);
    if (r.exitCode === 94) throw Object.assign(new Error(`ENOTDIR: not a directory in the sandbox: ${file}`), { code: 'ENOTDIR' });
    if (/No such file|Not a directory/i.test(r.stderr)) throw Object.assign(new Error(`ENOENT: no such file in the sandbox: ${file}: ${r.stderr.trim()}`), { code: 'ENOENT' });
    throw new Error(`${file}: the sandbox refused the file operation (exit ${r.exitCode}): ${r.stderr.trim().slice(0, 400)}`);
  }

  /**
   * Checks a path before a read or listing: lexically, then (links followed inside the pod) that it
   * names no reserved folder; returns what it is. Resolved and used in two calls, like Daytona's
   * (ADR 0019): the pod holds nothing of the worker's, so a swapped link reaches only the pod.
   */
  private async stat(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions): Promise<{ type: 'd' | 'f' | 'o'; size: number }> {
    checkRequestedPath(file, opts);
    const out = (await this.fileOp(handle, file, STAT_SCRIPT, [])).toString('utf8');
    const cut = out.indexOf('\0');
    checkReservedPath(file, out.slice(0, cut).replace(/^\//, ''), opts);
    const kind = out.slice(cut + 1);
    return { type: kind[0] as 'd' | 'f' | 'o', size: kind[0] === 'f' ? Number(kind.slice(1)) : 0 };
  }

  async readFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<Buffer> {
    // Nothing to check before the content: one exec, not a stat and a read.
    if (opts.maxBytes === undefined && !opts.reservedNames?.length) return this.fileOp(handle, file, READ_SCRIPT, []);
    const opened = await this.openFile(handle, file, opts);
    const chunks: Buffer[] = [];
    for await (const c of opened.stream) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  /** Stat first (size checked against the cap before any content moves), then the content, cut at that size. */
  async openFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<OpenedFile> {
    const st = await this.stat(handle, file, opts);
    if (st.type === 'd') throw new NotRegularFileError(file, 'folder');
    if (st.type !== 'f') throw new NotRegularFileError(file, 'special file');
    if (opts.maxBytes !== undefined && st.size > opts.maxBytes) throw new FileTooLargeError(file, st.size, opts.maxBytes);
    const content = (await this.fileOp(handle, file, READ_SCRIPT, [])).subarray(0, st.size);
    return { size: content.length, stream: Readable.from([content]) };
  }

  async listFiles(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<FileEntry[]> {
    checkRequestedPath(file, opts);
    const parts = (await this.fileOp(handle, file, LIST_SCRIPT, [])).toString('utf8').split('\0');
    checkReservedPath(file, (parts.shift() ?? '').replace(/^\//, ''), opts);
    const types: Record<string, FileEntry['type']> = { f: 'file', d: 'directory', l: 'symlink' };
    const entries = parts.filter(Boolean).map((line) => {
      const [type, size, ...name] = line.split(' ');
      return { name: name.join(' '), type: types[type] ?? 'other', size: Number(size) } satisfies FileEntry;
    });
    return listedEntries(entries, opts);
  }

  async writeFile(handle: Pick<SandboxHandle, 'root'>, file: string, content: Buffer | string, opts: FileIoOptions = {}): Promise<void> {
    checkRequestedPath(file, opts);
    await this.fileOp(handle, file, WRITE_SCRIPT, [], Buffer.isBuffer(content) ? content : Buffer.from(content));
  }

  async deleteFile(handle: Pick<SandboxHandle, 'root'>, file: string, opts: FileIoOptions = {}): Promise<void> {
    checkRequestedPath(file, opts);
    if (lexical(file) === '.') throw new PathEscapeError(file, 'the sandbox root itself cannot be deleted');
    await this.fileOp(handle, file, DELETE_SCRIPT, ['split']);
  }

  /** Deletes a pod (at once: no grace; Slipway's own deletion, so the informer does not report it) or a claim; gone already is fine. */
  private async deleteObject(o: { kind: 'pod' | 'claim'; namespace: string; name: string }): Promise<void> {
    const gone = (e: KubernetesProviderError) => {
      if (e.kind !== 'not_found') throw e;
    };
    const { namespace, name } = o;
    if (o.kind === 'claim') return void (await this.call(`deleting claim ${namespace}/${name}`, () => this.core().deleteNamespacedPersistentVolumeClaim({ namespace, name })).catch(gone));
    this.watchers.ensure(this.kc(), namespace)?.expectDeletion(name);
    await this.call(`deleting pod ${namespace}/${name}`, () => this.core().deleteNamespacedPod({ namespace, name, gracePeriodSeconds: 0 })).catch(gone);
  }

  /** Deletes a record's pod (at once: the sandbox's processes need no grace) and claim; gone already is fine. */
  private async deleteObjects(r: KubeRecord, keepClaim = false): Promise<void> {
    await this.deleteObject({ kind: 'pod', namespace: r.namespace, name: r.pod });
    if (r.claim && !keepClaim) await this.deleteObject({ kind: 'claim', namespace: r.namespace, name: r.claim });
  }

  async destroy({ root }: { repository: string; root: string }): Promise<void> {
    const w = this.where(root);
    const record = await readJson<KubeRecord>(w.recordFile);
    if (record) await this.deleteObjects(record);
    await fs.rm(w.recordFile, { force: true });
    await fs.rm(`${w.root}.rebuild.json`, { force: true });
    await fs.rmdir(path.dirname(w.root)).catch(() => undefined);
  }

  /** HEAD inside the sandbox (untrusted: only compared, or collected through a bundle). */
  private async head(root: string): Promise<string> {
    const r = await this.exec({ root }, { command: 'git', args: ['rev-parse', '--verify', '--quiet', 'HEAD^{commit}'], timeoutMs: 60_000 });
    const head = r.stdout.trim();
    if (r.exitCode !== 0 || !OBJECT_ID.test(head)) throw new Error(`the sandbox at ${root} has no commit at HEAD`);
    return head;
  }

  async collect(handle: Pick<SandboxHandle, 'root'>, options: { known?: string[]; signal?: AbortSignal } = {}): Promise<{ head: string; imported: boolean }> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    const head = await this.head(w.root);
    const prior = await collectKnownHead(w.repository, record, head, options.known);
    if (prior.collected) return { head, imported: false };
    const { known } = prior;
    const max = this.options.maxBundleBytes ?? MAX_COLLECT_PACK_BYTES;
    const local = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-kube-'));
    try {
      const file = path.join(local, 'work.bundle');
      const sink = createWriteStream(file);
      let bytes = 0;
      let over = false;
      const made = await this.exec(handle, {
        command: '/bin/sh',
        args: ['-c', BUNDLE_HEAD_SCRIPT, 'collect', ...known],
        timeoutMs: 10 * 60_000,
        signal: options.signal,
        maxCaptureBytes: 64 * 1024,
        onBytes: (stream: 'stdout' | 'stderr', chunk: Buffer) => {
          if (stream !== 'stdout' || over) return;
          bytes += chunk.length;
          if (bytes > max) over = true;
          else sink.write(chunk);
        },
      } as KubeExecRequest);
      await new Promise<void>((resolve, reject) => sink.end((e?: Error | null) => (e ? reject(e) : resolve())));
      if (over) throw new BundleRefusedError(`it exceeds ${max} bytes`);
      if (made.exitCode !== 0) throw new Error(`bundling the sandbox's work failed (exit ${made.exitCode}): ${made.stderr.trim()}`);
      // importBundle reads a producer's stdout: here, the bundle as it came (still hostile; checked in quarantine).
      const imported = await importBundle(w.repository, { command: 'cat', args: [file], env: { PATH: SANDBOX_BASE_ENV.PATH }, cwd: local }, { branch: record.branch, baseCommit: record.startCommit, maxBytes: max, signal: options.signal });
      return { head: imported.head, imported: true };
    } finally {
      await fs.rm(local, { recursive: true, force: true });
    }
  }

  /** A fresh bundle of the repository's branches and tags, fetched inside under refs/slipway/upstream/ (as container sandboxes do). */
  async bringCommits(handle: Pick<SandboxHandle, 'root'>, commits: string[]): Promise<void> {
    const w = this.where(handle.root);
    const local = await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-kube-'));
    let bundle: Buffer;
    try {
      await git(w.repository, ['bundle', 'create', '-q', path.join(local, 'update.bundle'), '--branches', '--tags']);
      bundle = await fs.readFile(path.join(local, 'update.bundle'));
    } finally {
      await fs.rm(local, { recursive: true, force: true });
    }
    const script = 'mkdir -p /tmp/slipway-in && cat > /tmp/slipway-in/update.bundle && git fetch -q --no-tags /tmp/slipway-in/update.bundle "+refs/heads/*:refs/slipway/upstream/heads/*" "+refs/tags/*:refs/slipway/upstream/tags/*"; s=$?; rm -f /tmp/slipway-in/update.bundle; exit $s';
    const fetch = await this.exec(handle, { command: '/bin/sh', args: ['-c', script], stdinBytes: bundle, timeoutMs: 10 * 60_000 } as KubeExecRequest);
    if (fetch.exitCode !== 0) throw new Error(`fetching the repository's branches into the sandbox failed (exit ${fetch.exitCode}): ${fetch.stderr.trim()}`);
    for (const c of commits) {
      const has = await this.exec(handle, { command: 'git', args: ['cat-file', '-e', `${c}^{commit}`], timeoutMs: 60_000 });
      if (has.exitCode !== 0) throw new Error(`commit ${c} is on no branch or tag of ${w.repository}: it cannot be brought into the sandbox`);
    }
  }

  /** Sandboxes of the repository, found by label in the provider's namespace (rediscovery after a restart, the janitor): pods, and claims of suspended ones. */
  async list(repository: string) {
    const repo = await fs.realpath(repository);
    const namespace = this.defaultNamespace();
    const labelSelector = `${KUBE_LABELS.repository}=${repositoryLabel(repo)}`;
    const [pods, claims] = await Promise.all([
      this.call('listing sandbox pods', () => this.core().listNamespacedPod({ namespace, labelSelector })),
      this.call('listing sandbox claims', () => this.core().listNamespacedPersistentVolumeClaim({ namespace, labelSelector })),
    ]);
    const out: Array<{ root: string; branch?: string; head: string; sandboxId?: string }> = [];
    const seen = new Set<string>();
    for (const o of [...pods.items, ...claims.items]) {
      const a = o.metadata?.annotations ?? {};
      const group = a['slipway.dev/group'];
      const name = a['slipway.dev/name'];
      if (!group || !name) continue;
      const root = kubernetesSandboxRoot(repo, group, name);
      if (seen.has(root)) continue;
      const record = await readJson<KubeRecord>(`${root}.json`);
      if (!record || record.state === 'creating') continue;
      const isPod = (o as V1Pod).kind === 'Pod' || pods.items.includes(o as V1Pod);
      if (isPod ? record.pod !== o.metadata?.name : record.state !== 'suspended' || record.claim !== o.metadata?.name) continue;
      if (isPod && podEnd(o as V1Pod)) continue;
      seen.add(root);
      const head = record.state === 'suspended' ? (record.suspendedHead ?? record.startCommit) : await this.head(root).catch(() => record.startCommit);
      out.push({ root, branch: record.branch, head, sandboxId: record.sandboxId });
    }
    return out;
  }

  /** The namespaces this repository's sandboxes may be in: the provider's, and every one its records name. */
  private async namespacesOf(repo: string): Promise<string[]> {
    const out = new Set([this.defaultNamespace()]);
    const dir = path.join(repo, KUBERNETES_DIR);
    for (const group of await fs.readdir(dir).catch(() => [] as string[])) {
      for (const file of await fs.readdir(path.join(dir, group)).catch(() => [] as string[])) {
        if (!file.endsWith('.json') || file.endsWith('.rebuild.json')) continue;
        const r = await readJson<KubeRecord>(path.join(dir, group, file)).catch(() => undefined);
        if (r?.namespace) out.add(r.namespace);
      }
    }
    return [...out];
  }

  /** The repository's sandbox pods and claims (labelled slipway.dev/sandbox), in every namespace it uses, optionally of one group. */
  private async labelled(repo: string, group?: string): Promise<Array<{ kind: 'pod' | 'claim'; namespace: string; name: string; annotations: Record<string, string>; madeAtMs: number }>> {
    const labelSelector = [`${KUBE_LABELS.managed}=true`, KUBE_LABELS.sandbox, `${KUBE_LABELS.repository}=${repositoryLabel(repo)}`, ...(group !== undefined ? [`${KUBE_LABELS.group}=${kubeLabelValue(group)}`] : [])].join(',');
    const out: Awaited<ReturnType<KubernetesSandboxProvider['labelled']>> = [];
    for (const namespace of await this.namespacesOf(repo)) {
      const [pods, claims] = await Promise.all([
        this.call('listing sandbox pods', () => this.core().listNamespacedPod({ namespace, labelSelector })),
        this.call('listing sandbox claims', () => this.core().listNamespacedPersistentVolumeClaim({ namespace, labelSelector })),
      ]);
      const entry = (kind: 'pod' | 'claim', m: { name?: string; annotations?: Record<string, string>; creationTimestamp?: Date }) => {
        const a = m.annotations ?? {};
        // A pool pod claimed a moment ago is as young as its claim, not its creation.
        const madeAtMs = Math.max(m.creationTimestamp ? new Date(m.creationTimestamp).getTime() : 0, a['slipway.dev/claimed-at'] ? Date.parse(a['slipway.dev/claimed-at']) : 0);
        out.push({ kind, namespace, name: m.name!, annotations: a, madeAtMs });
      };
      for (const p of pods.items) entry('pod', p.metadata ?? {});
      for (const c of claims.items) entry('claim', c.metadata ?? {});
    }
    return out;
  }

  /**
   * The janitor's sweep of an ended objective's (or project's) sandboxes: every pod and claim of
   * the group found by label, one whose record a crash lost included, and the records. Returns
   * the roots removed.
   */
  async sweepGroup(repository: string, group: string): Promise<string[]> {
    const repo = await fs.realpath(repository);
    const removed = new Set<string>();
    for (const o of await this.labelled(repo, group)) {
      if (o.annotations['slipway.dev/group'] !== group) continue;
      await this.deleteObject(o);
      const name = o.annotations['slipway.dev/name'];
      if (name) removed.add(kubernetesSandboxRoot(repo, group, name));
    }
    await fs.rm(path.join(repo, KUBERNETES_DIR, group), { recursive: true, force: true });
    return [...removed];
  }

  /**
   * Pods and claims with Slipway's labels that no record names (a crash between making them and
   * recording them, a record removed by hand, the old pod of a restored sandbox), deleted once
   * older than `graceMs`: a create writes its record before it makes its pod, and a pool claim
   * stamps its time. With `isLive`, the recorded sandboxes it says have ended go too (pod, claim
   * and record): the reaper's sweep of ended service sandboxes whose pod died or outlived them.
   */
  async sweepOrphans(repository: string, options: { graceMs: number; isLive?: (sandbox: { root: string; sandboxId: string; group: string; createdAt: string }) => Promise<boolean> }): Promise<string[]> {
    const repo = await fs.realpath(repository);
    const removed: string[] = [];
    const ended = new Set<string>();
    for (const o of await this.labelled(repo)) {
      if (Date.now() - o.madeAtMs < options.graceMs) continue;
      const group = o.annotations['slipway.dev/group'];
      const name = o.annotations['slipway.dev/name'];
      const root = group && name ? kubernetesSandboxRoot(repo, group, name) : undefined;
      const record = root ? await readJson<KubeRecord>(`${root}.json`).catch(() => undefined) : undefined;
      const named = record && record.namespace === o.namespace && (o.kind === 'pod' ? record.pod === o.name : record.claim === o.name);
      if (named && root && record) {
        if (!options.isLive || ended.has(root) || (await options.isLive({ root, sandboxId: record.sandboxId, group: record.group, createdAt: record.createdAt }))) continue;
        ended.add(root);
        await this.destroy({ repository: repo, root });
        removed.push(root);
        continue;
      }
      await this.deleteObject(o);
      removed.push(`${o.namespace}/${o.kind === 'pod' ? 'pods' : 'persistentvolumeclaims'}/${o.name}`);
    }
    return removed;
  }

  /** Deletes the pod and keeps the claim (the workspace's files); processes do not survive. */
  async suspend(handle: Pick<SandboxHandle, 'root'>): Promise<{ snapshotRef: string; bytes: number }> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    if (!record.claim) throw new Error(`the Kubernetes sandbox at ${w.root} has an ephemeral workspace (kubernetes.workspace: ephemeral): it cannot be suspended with its files`);
    const suspendedHead = record.state === 'suspended' ? record.suspendedHead : await this.head(w.root).catch(() => undefined);
    await this.deleteObjects(record, true);
    await writeJsonAtomic(w.recordFile, { ...record, state: 'suspended', ...(suspendedHead ? { suspendedHead } : {}) });
    return { snapshotRef: `kubernetes:${record.namespace}/${record.claim}`, bytes: 0 };
  }

  /** A new pod on the kept claim. */
  async restore(handle: Pick<SandboxHandle, 'root'>): Promise<{ root: string; branch?: string; head: string }> {
    const w = this.where(handle.root);
    const record = await this.record(w.root);
    if (record.state === 'suspended') {
      const pod = `${record.pod.replace(/-[0-9a-f]{6}$/, '')}-${randomBytes(3).toString('hex')}`;
      const next: KubeRecord = { ...record, pod, state: 'ready', suspendedHead: undefined };
      await this.makePod(next, w.repository);
      await writeJsonAtomic(w.recordFile, next);
      await this.waitReady(next.namespace, pod);
    }
    return { root: w.root, branch: record.branch, head: await this.head(w.root) };
  }

  /** The claim goes with destroy. */
  async deleteSnapshot(): Promise<void> {}

  /** The pod's state: ended, evicted, OOM-killed, its node lost, or deleted outside Slipway is dead, with the reason. */
  async probe(handle: Pick<SandboxHandle, 'root'>): Promise<SandboxLiveness> {
    const record = await this.record(handle.root);
    if (record.state === 'suspended') return { alive: true };
    // The informer on the pod's namespace (started now in a worker that had none: a restart) knows how it ended.
    const seen = this.watchers.ensure(this.kc(), record.namespace)?.exitOf(record.pod);
    if (seen) return { alive: false, reason: seen.reason, detail: `pod ${record.namespace}/${record.pod}: ${seen.detail}`, endedAtMs: seen.endedAtMs };
    const end = podEnd(await this.readPod(record.namespace, record.pod));
    return end ? { alive: false, reason: end.reason, detail: `pod ${record.namespace}/${record.pod}: ${end.detail}`, ...(end.finishedAt ? { endedAtMs: Date.parse(end.finishedAt) } : {}) } : { alive: true };
  }
}

/** A path relative to the workspace, lexically inside it ('.' for the workspace), or PathEscapeError. */
function lexical(requested: string): string {
  if (requested.includes('\0')) throw new PathEscapeError(requested, 'it contains a NUL byte');
  if (path.posix.isAbsolute(requested)) throw new PathEscapeError(requested, 'absolute paths are not allowed; use a path relative to the sandbox root');
  const rel = path.posix.normalize(requested);
  if (rel === '..' || rel.startsWith('../')) throw new PathEscapeError(requested, 'it leads outside the sandbox');
  return rel === '' ? '.' : rel.replace(/\/$/, '');
}
