/**
 * The sandbox pod watcher (ADR 0020): an informer on the pods Slipway made in a namespace. It
 * lists them, then watches from the list's resourceVersion; a watch that ends is resumed from the
 * last resourceVersion it saw (bookmarks included), a 410 Gone (that version is no longer in the
 * API server's window) re-lists, and a connection that fails (API server restart) is retried
 * with back-off. A pod that ends (evicted, OOM-killed, failed), whose node is lost, or that is
 * deleted without Slipway asking is reported once, with the reason and the pod's finish time.
 */
import type { KubeConfig, V1Pod } from '@kubernetes/client-node';

type KubernetesSdk = typeof import('@kubernetes/client-node');
let sdk: KubernetesSdk | undefined;
/**
 * @kubernetes/client-node, loaded on first use (ADR 0036): it is 58 MB of the worker's memory, and
 * every process the worker starts forks that memory, so a worker that never makes a Kubernetes
 * sandbox does not carry it. Types stay static (`import type`).
 */
export function kubernetesSdk(): KubernetesSdk {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return (sdk ??= require('@kubernetes/client-node') as KubernetesSdk);
}
import { podDeletedAt, podEnd } from '../../core/kubernetes';

export interface PodExit {
  namespace: string;
  pod: string;
  /** The exact sandbox id (annotation), when the pod carries it. */
  sandboxId?: string;
  /** The sandbox's group and name (annotations): its root is `<repo>/.slipway/kubernetes/<group>/<name>`. */
  group?: string;
  name?: string;
  reason: 'oom_killed' | 'evicted' | 'deleted' | 'node_lost' | 'pod_failed';
  detail: string;
  /** When the pod ended (its container's finish time, the node's loss, its deletion), epoch ms. */
  endedAtMs: number;
}

export interface PodWatchOptions {
  namespace: string;
  labelSelector: string;
  onExit: (exit: PodExit) => void;
  /** Resume from a resourceVersion seen earlier instead of listing first (a 410 re-lists). */
  resourceVersion?: string;
  /** Longest back-off between reconnects (default 5 s). */
  maxBackoffMs?: number;
}

export class SandboxPodWatch {
  /** What the informer did (tests and the bench read it). */
  readonly stats = { lists: 0, watches: 0, connected: 0, gone: 0, failures: 0 };
  /** The last list or watch failure (a 403 names the missing permission through classifyKubeError). */
  lastError?: unknown;
  private readonly pods = new Map<string, V1Pod>();
  private readonly exits = new Map<string, PodExit>();
  /** Pods Slipway deletes itself (destroy, suspend): their deletion is no death. */
  private readonly expected = new Set<string>();
  private stopped = false;
  private abort?: AbortController;
  /** Ends a back-off wait early (stop). */
  private wake?: () => void;
  private resourceVersion?: string;
  private syncedResolve!: () => void;
  /** Settles after the first list (or the first watch when resuming). */
  readonly synced = new Promise<void>((r) => (this.syncedResolve = r));
  private readonly done: Promise<void>;

  get namespace(): string {
    return this.opts.namespace;
  }

  constructor(private readonly kc: KubeConfig, private readonly opts: PodWatchOptions) {
    this.resourceVersion = opts.resourceVersion;
    this.done = this.loop();
  }

  /** The exit seen for a pod, if it ended. */
  exitOf(pod: string): PodExit | undefined {
    return this.exits.get(pod);
  }

  /** Slipway is about to delete this pod: its deletion is not reported. */
  expectDeletion(pod: string): void {
    this.expected.add(pod);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.abort?.abort();
    this.wake?.();
    await this.done;
  }

  private see(type: string, pod: V1Pod): void {
    const name = pod.metadata?.name;
    if (!name) return;
    if (type === 'DELETED') {
      this.pods.delete(name);
      // Gone for good: its name is free of Slipway's expectation again.
      if (this.expected.delete(name)) return;
      this.report(pod, { reason: 'deleted', detail: 'the pod was deleted outside Slipway', finishedAt: podDeletedAt(pod) });
      return;
    }
    this.pods.set(name, pod);
    if (this.expected.has(name)) return;
    const end = podEnd(pod);
    if (end) this.report(pod, end);
  }

  private report(pod: V1Pod, end: { reason: PodExit['reason']; detail: string; finishedAt?: string }): void {
    const name = pod.metadata!.name!;
    if (this.exits.has(name)) return;
    const a = pod.metadata?.annotations ?? {};
    const exit: PodExit = {
      namespace: this.opts.namespace,
      pod: name,
      sandboxId: a['slipway.dev/sandbox-id'],
      group: a['slipway.dev/group'],
      name: a['slipway.dev/name'],
      reason: end.reason,
      detail: end.detail,
      // Never later than now: a finish time in the future would bill time that has not passed.
      endedAtMs: Math.min(Date.now(), end.finishedAt ? Date.parse(end.finishedAt) : Date.now()),
    };
    this.exits.set(name, exit);
    try {
      this.opts.onExit(exit);
    } catch {
      /* the listener's error is its own */
    }
  }

  private async list(): Promise<void> {
    const core = this.kc.makeApiClient(kubernetesSdk().CoreV1Api);
    const list = await core.listNamespacedPod({ namespace: this.opts.namespace, labelSelector: this.opts.labelSelector });
    this.stats.lists++;
    const names = new Set<string>();
    for (const pod of list.items) {
      names.add(pod.metadata!.name!);
      this.see(this.pods.has(pod.metadata!.name!) ? 'MODIFIED' : 'ADDED', pod);
    }
    // Deleted while no watch ran (the API server was away, or the watch fell behind).
    for (const [name, pod] of [...this.pods]) if (!names.has(name)) this.see('DELETED', pod);
    this.resourceVersion = list.metadata?.resourceVersion;
  }

  /** One watch from the current resourceVersion; resolves when it ends, with whether it was a 410. */
  private watchOnce(): Promise<{ gone: boolean; error?: unknown }> {
    return new Promise((resolve) => {
      let gone = false;
      let ended = false;
      this.stats.watches++;
      new (kubernetesSdk().Watch)(this.kc)
        .watch(
          `/api/v1/namespaces/${this.opts.namespace}/pods`,
          { labelSelector: this.opts.labelSelector, resourceVersion: this.resourceVersion, allowWatchBookmarks: true },
          (type: string, obj: V1Pod & { code?: number }) => {
            if (type === 'ERROR') {
              if (obj?.code === 410) gone = true;
              return;
            }
            if (obj?.metadata?.resourceVersion) this.resourceVersion = obj.metadata.resourceVersion;
            if (type === 'BOOKMARK') return;
            this.see(type, obj);
          },
          (err: unknown) => {
            ended = true;
            // A refused watch (client-node: an Error with statusCode) says which permission it lacked.
            const status = (err as { statusCode?: number } | null)?.statusCode;
            const error = status ? Object.assign(new Error(`watch pods in namespace ${this.opts.namespace} (the API server answered ${status} ${(err as Error).message})`), { code: status }) : (err ?? undefined);
            resolve({ gone: gone || status === 410, error: status === 410 ? undefined : error });
          },
        )
        .then(
          (controller) => {
            // done() runs first when the API server refused the watch: that is no connection.
            if (!ended) this.stats.connected++;
            this.abort = controller;
            if (this.stopped) controller.abort();
          },
          (error: unknown) => resolve({ gone: (error as { code?: number })?.code === 410, error }),
        );
    });
  }

  private async loop(): Promise<void> {
    let backoff = 0;
    while (!this.stopped) {
      try {
        if (this.resourceVersion === undefined) await this.list();
        this.syncedResolve();
        const { gone, error } = await this.watchOnce();
        if (gone) {
          this.stats.gone++;
          this.resourceVersion = undefined;
          backoff = 0;
          continue;
        }
        if (!error) {
          backoff = 0;
          continue;
        }
        throw error;
      } catch (e) {
        if ((e as { code?: number })?.code === 410) {
          this.stats.gone++;
          this.resourceVersion = undefined;
          continue;
        }
        if (this.stopped) break;
        this.stats.failures++;
        this.lastError = e;
        backoff = Math.min(backoff ? backoff * 2 : 200, this.opts.maxBackoffMs ?? 5_000);
        // Unref'd: a watcher waiting to reconnect does not keep a process alive on its own; stop() ends the wait.
        await new Promise<void>((r) => {
          const t = setTimeout(r, backoff);
          t.unref();
          this.wake = () => {
            clearTimeout(t);
            r();
          };
        });
        this.wake = undefined;
      }
    }
  }
}

/**
 * The worker's pod watchers: one informer per namespace of a cluster, shared by every Kubernetes
 * provider of the process (the service makes one provider per profile setting), so a worker
 * watches each namespace once. While a worker holds them (`hold()`), providers start the informer
 * of each namespace they make or probe pods in; listeners hear every exit any of them reports.
 * `shared` is the process's own, which providers use unless given another.
 */
export class PodWatchers {
  static readonly shared = new PodWatchers();
  private readonly watches = new Map<string, SandboxPodWatch>();
  private readonly listeners = new Set<(exit: PodExit) => void>();
  private holders = 0;

  private static key(kc: KubeConfig, namespace: string): string {
    return `${kc.getCurrentCluster()?.server ?? ''}|${namespace}`;
  }

  /** A worker's hold: providers start informers while one is held; the last release stops them all. */
  hold(): () => Promise<void> {
    this.holders++;
    let released = false;
    return async () => {
      if (released) return;
      released = true;
      if (--this.holders === 0) await this.stop();
    };
  }

  get held(): boolean {
    return this.holders > 0;
  }

  /** The informer on this namespace of the kubeconfig's cluster, started on first use. */
  watch(kc: KubeConfig, namespace: string, opts: { resourceVersion?: string } = {}): SandboxPodWatch {
    const key = PodWatchers.key(kc, namespace);
    let w = this.watches.get(key);
    if (!w) {
      w = new SandboxPodWatch(kc, { namespace, labelSelector: 'slipway.dev/managed=true', onExit: (e) => this.emit(e), ...opts });
      this.watches.set(key, w);
    }
    return w;
  }

  /** The informer on this namespace: running, or started now when a worker holds the watchers; else undefined. */
  ensure(kc: KubeConfig, namespace: string): SandboxPodWatch | undefined {
    return this.held ? this.watch(kc, namespace) : this.watches.get(PodWatchers.key(kc, namespace));
  }

  /** Hears every pod exit; returns the unsubscribe. */
  onExit(listener: (exit: PodExit) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private emit(exit: PodExit): void {
    for (const l of [...this.listeners]) {
      try {
        l(exit);
      } catch {
        /* a listener's error is its own */
      }
    }
  }

  /** Stops one namespace's informer (or all); a later watch() starts it again. */
  async stop(kc?: KubeConfig, namespace?: string): Promise<void> {
    const keys = kc && namespace !== undefined ? [PodWatchers.key(kc, namespace)] : [...this.watches.keys()];
    await Promise.all(
      keys.map(async (k) => {
        const w = this.watches.get(k);
        this.watches.delete(k);
        await w?.stop();
      }),
    );
  }
}
