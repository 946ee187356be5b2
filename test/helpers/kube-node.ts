/**
 * A test node for the test control plane (test/helpers/kube-cluster.ts, ADR 0021): the parts of
 * a cluster that are not the API server, played by test code against the real API, each doing
 * what the real component does through the same API calls.
 *
 *   scheduler       binds Pending pods through `pods/binding` to a Ready node whose labels match
 *                   the nodeSelector, whose NoSchedule/NoExecute taints are tolerated and whose
 *                   allocatable cpu/memory fit the requests; else PodScheduled=False, reason
 *                   Unschedulable, with the scheduler's message ("0/1 nodes are available: ...")
 *   kubelet         runs the pods bound to its node with podman (a podman pod per pod, whose infra
 *                   container holds the network and IP as the pause container does; a container
 *                   per pod container, init containers first); volumes (emptyDir,
 *                   persistentVolumeClaim, projected service-account token, configMap, secret) are
 *                   host folders; reports phase, IPs, conditions and containerStatuses (OOMKilled
 *                   from podman or, as the kubelet's OOM watcher, the kernel log); exec readiness
 *                   probes; restartPolicy; on deletion stops the containers, then deletes the pod
 *                   with gracePeriodSeconds 0; node-pressure eviction (evict()) as the kubelet does
 *   node lifecycle  lose(): the node stops reporting; the node goes Ready=Unknown with the
 *                   unreachable taints and its pods Ready=False, reason NodeLost
 *   PV controller   binds each claim to a new hostPath PersistentVolume (a folder under the
 *                   cluster's dir that outlives pods), removes the pvc-protection finalizer when
 *                   no pod uses a deleted claim, and deletes the volume and its data after it
 *   quota           ResourceQuota status.hard/used (the admission plugin refuses pods until set)
 *
 * The scheduler and the PV and quota controllers run once per cluster, with its first node.
 * Pods' images map to local podman images (`images`, default: every image is the sandbox image).
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promises as fs, mkdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import {
  CoreV1Api,
  type V1Container,
  type V1ContainerStatus,
  type V1Node,
  type V1PersistentVolumeClaim,
  type V1Pod,
  type V1PodCondition,
  type V1ResourceQuota,
  type V1Taint,
  type V1Volume,
} from '@kubernetes/client-node';
import { engineEnv, defaultSandboxImage } from '../../activities/sandbox/container';
import { engineCwd } from '../../activities/sandbox/container-engine';
import { informer, type Informer, type KubeCluster } from './kube-cluster';
import { startKubeletExec } from './kubelet-exec';

export interface TestNode {
  name: string;
  /** The podman container running a pod's container on this node. */
  containerName(ns: string, pod: string, container: string): string | undefined;
  /** Node-pressure eviction, as the kubelet does it: containers killed, pod Failed, reason Evicted. */
  evict(ns: string, pod: string): Promise<void>;
  /** The node stops reporting; plays the node lifecycle controller (node Ready=Unknown, pods Ready=False, reason NodeLost). */
  lose(): Promise<void>;
  stop(): Promise<void>;
}

export interface TestNodeOptions {
  name?: string;
  labels?: Record<string, string>;
  taints?: V1Taint[];
  /** Pod image -> local podman image; default: every image runs as the sandbox image (.tools/containers/image). */
  images?: Record<string, string>;
  /** The kubelet's podPidsLimit (--pids-limit of every container); default 1024. */
  podPidsLimit?: number;
  /** Allocatable cpu and memory; default 4 and 8Gi. */
  allocatable?: { cpu: string; memory: string };
  /** Every podman command the node runs goes through this (tests: to hold one until another has run). */
  interceptPodman?: (args: string[], run: () => Promise<RunResult>) => Promise<RunResult>;
}

const NODE_LABEL = 'slipway-test-node';
const now = () => new Date();
const code = (e: unknown) => (e as { code?: number }).code;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** podman with the project's containers.conf; `env` reaches podman only (for `--env NAME`, values never in argv). */
function podman(args: string[], env: Record<string, string> = {}): Promise<RunResult> {
  return new Promise((resolve) => {
    const child = spawn('podman', args, { cwd: engineCwd(), env: engineEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    child.on('error', (e) => resolve({ code: 127, stdout, stderr: String(e) }));
    child.on('close', (c) => resolve({ code: c ?? 1, stdout, stderr }));
  });
}

/** Read, change, write back a pod's status; again on a conflict. Undefined when the pod is gone. */
async function updatePodStatus(core: CoreV1Api, namespace: string, name: string, uid: string | undefined, mutate: (pod: V1Pod) => void): Promise<V1Pod | undefined> {
  for (;;) {
    let pod: V1Pod;
    try {
      pod = await core.readNamespacedPod({ namespace, name });
    } catch (e) {
      if (code(e) === 404) return undefined;
      throw e;
    }
    if (uid && pod.metadata?.uid !== uid) return undefined;
    pod.status ??= {};
    mutate(pod);
    try {
      return await core.replaceNamespacedPodStatus({ namespace, name, body: pod });
    } catch (e) {
      if (code(e) === 409) continue;
      if (code(e) === 404) return undefined;
      throw e;
    }
  }
}

function setCondition(conditions: V1PodCondition[] | undefined, c: V1PodCondition): V1PodCondition[] {
  const list = (conditions ?? []).filter((x) => x.type !== c.type);
  const old = conditions?.find((x) => x.type === c.type);
  list.push({ ...c, lastTransitionTime: old && old.status === c.status ? old.lastTransitionTime : now() });
  return list;
}

const SUFFIX: Record<string, number> = { '': 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
/** A resource quantity ("500m", "64Mi", "1e3") as a number (client-node's quantityToScalar is not exported). */
export function scalar(q: string | number | undefined): number {
  if (q === undefined) return 0;
  const m = /^([+-]?[0-9.]+(?:[eE][+-]?\d+)?)([a-zA-Z]*)$/.exec(String(q).trim());
  if (!m || SUFFIX[m[2]] === undefined) throw new Error(`not a resource quantity: ${JSON.stringify(q)}`);
  return Number(m[1]) * SUFFIX[m[2]];
}

function podRequests(pod: V1Pod): { cpu: number; memory: number } {
  let cpu = 0;
  let memory = 0;
  for (const c of pod.spec?.containers ?? []) {
    const r = c.resources?.requests ?? c.resources?.limits ?? {};
    cpu += scalar(r.cpu);
    memory += scalar(r.memory);
  }
  return { cpu, memory };
}

const terminal = (pod: V1Pod) => pod.status?.phase === 'Succeeded' || pod.status?.phase === 'Failed';

// --- the scheduler ------------------------------------------------------------------------------

/** Why a node cannot take a pod, in the scheduler's words; undefined when it can. */
export function unfit(pod: V1Pod, node: V1Node, podsOnNode: V1Pod[]): string | undefined {
  const ready = node.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True';
  const taints = [...(node.spec?.taints ?? [])];
  if (node.spec?.unschedulable) taints.push({ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule' });
  if (!ready && !taints.some((t) => t.key === 'node.kubernetes.io/unreachable' || t.key === 'node.kubernetes.io/not-ready')) {
    taints.push({ key: 'node.kubernetes.io/not-ready', effect: 'NoSchedule' });
  }
  for (const t of taints) {
    if (t.effect !== 'NoSchedule' && t.effect !== 'NoExecute') continue;
    const tolerated = (pod.spec?.tolerations ?? []).some(
      (tol) =>
        (!tol.effect || tol.effect === t.effect) &&
        (tol.operator === 'Exists' ? !tol.key || tol.key === t.key : tol.key === t.key && (tol.value ?? '') === (t.value ?? '')),
    );
    if (!tolerated) return `node(s) had untolerated taint {${t.key}: ${t.value ?? ''}}`;
  }
  const labels = node.metadata?.labels ?? {};
  for (const [k, v] of Object.entries(pod.spec?.nodeSelector ?? {})) if (labels[k] !== v) return "node(s) didn't match Pod's node affinity/selector";
  const want = podRequests(pod);
  const used = podsOnNode.filter((p) => !terminal(p)).reduce((a, p) => ({ cpu: a.cpu + podRequests(p).cpu, memory: a.memory + podRequests(p).memory }), { cpu: 0, memory: 0 });
  const alloc = node.status?.allocatable ?? {};
  if (want.cpu && used.cpu + want.cpu > scalar(alloc.cpu)) return 'Insufficient cpu';
  if (want.memory && used.memory + want.memory > scalar(alloc.memory)) return 'Insufficient memory';
  return undefined;
}

/** The scheduler's message for a pod no node takes. */
export function unschedulableMessage(reasons: string[]): string {
  const n = reasons.length;
  if (n === 0) return 'no nodes available to schedule pods';
  const counts = new Map<string, number>();
  for (const r of reasons) counts.set(r, (counts.get(r) ?? 0) + 1);
  const parts = [...counts].sort(([a], [b]) => a.localeCompare(b)).map(([r, c]) => `${c} ${r}`);
  return `0/${n} nodes are available: ${parts.join(', ')}. preemption: 0/${n} nodes are available: ${n} Preemption is not helpful for scheduling.`;
}

interface ClusterControllers {
  refs: number;
  stop(): void;
}
const controllersByCluster = new Map<string, ClusterControllers>();

function startClusterControllers(cluster: KubeCluster): ClusterControllers {
  const kc = cluster.config('admin');
  const core = kc.makeApiClient(CoreV1Api);
  const informers: Informer<unknown & object>[] = [];
  let nodes: Informer<V1Node>;
  let pods: Informer<V1Pod>;
  const pending = new Set<string>();

  const schedule = async (pod: V1Pod) => {
    const ns = pod.metadata!.namespace!;
    const name = pod.metadata!.name!;
    const nodeList = nodes.list().sort((a, b) => a.metadata!.name!.localeCompare(b.metadata!.name!));
    const reasons: string[] = [];
    for (const node of nodeList) {
      const why = unfit(pod, node, pods.list().filter((p) => p.spec?.nodeName === node.metadata!.name));
      if (!why) {
        try {
          await core.createNamespacedPodBinding({
            namespace: ns,
            name,
            body: { metadata: { name, namespace: ns, uid: pod.metadata!.uid }, target: { apiVersion: 'v1', kind: 'Node', name: node.metadata!.name! } },
          });
        } catch (e) {
          if (code(e) !== 409 && code(e) !== 404) throw e;
        }
        return;
      }
      reasons.push(why);
    }
    const message = unschedulableMessage(reasons);
    const old = pod.status?.conditions?.find((c) => c.type === 'PodScheduled');
    if (old?.status === 'False' && old.message === message) return;
    await updatePodStatus(core, ns, name, pod.metadata!.uid, (p) => {
      if (p.spec?.nodeName) return;
      p.status!.phase = 'Pending';
      p.status!.conditions = setCondition(p.status!.conditions, { type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message });
    });
  };
  const consider = (pod: V1Pod) => {
    const uid = pod.metadata?.uid;
    if (!uid || pod.spec?.nodeName || pod.metadata?.deletionTimestamp || terminal(pod)) return;
    if ((pod.spec?.schedulerName ?? 'default-scheduler') !== 'default-scheduler') return;
    if (pending.has(uid)) return;
    pending.add(uid);
    void schedule(pod)
      .catch(() => undefined)
      .finally(() => pending.delete(uid));
  };
  const reconsiderAll = () => {
    for (const p of pods.list()) consider(p);
  };

  // --- ResourceQuota: status.hard from spec.hard, status.used from what the namespace holds.
  const quotaRecount = new Set<string>();
  const recountQuotas = (namespace: string) => {
    if (quotaRecount.has(namespace)) return;
    quotaRecount.add(namespace);
    void (async () => {
      try {
        const quotas = await core.listNamespacedResourceQuota({ namespace });
        if (!quotas.items.length) return;
        const live = (await core.listNamespacedPod({ namespace })).items.filter((p) => !terminal(p));
        const claims = (await core.listNamespacedPersistentVolumeClaim({ namespace })).items;
        const sum = (f: (c: V1Container) => string | undefined) => live.flatMap((p) => p.spec?.containers ?? []).reduce((a, c) => a + scalar(f(c)), 0);
        const cpu = (n: number) => `${Math.round(n * 1000)}m`;
        const usage: Record<string, string> = {
          pods: String(live.length),
          'count/pods': String(live.length),
          'requests.cpu': cpu(sum((c) => c.resources?.requests?.cpu)),
          cpu: cpu(sum((c) => c.resources?.requests?.cpu)),
          'requests.memory': String(sum((c) => c.resources?.requests?.memory)),
          memory: String(sum((c) => c.resources?.requests?.memory)),
          'limits.cpu': cpu(sum((c) => c.resources?.limits?.cpu)),
          'limits.memory': String(sum((c) => c.resources?.limits?.memory)),
          persistentvolumeclaims: String(claims.length),
          'count/persistentvolumeclaims': String(claims.length),
          'requests.storage': String(claims.reduce((a, c) => a + scalar(c.spec?.resources?.requests?.storage), 0)),
        };
        for (const q of quotas.items) {
          const hard = q.spec?.hard ?? {};
          const used: Record<string, string> = {};
          for (const k of Object.keys(hard)) used[k] = usage[k] ?? '0';
          q.status = { hard, used };
          await core.replaceNamespacedResourceQuotaStatus({ namespace, name: q.metadata!.name!, body: q }).catch(() => undefined);
        }
      } finally {
        quotaRecount.delete(namespace);
      }
    })().catch(() => undefined);
  };

  // --- PV controller (+ pvc-protection and pv-protection): hostPath volumes under the cluster's dir.
  const volumesDir = path.join(cluster.dir, 'volumes');
  mkdirSync(volumesDir, { recursive: true });
  const claimBusy = new Set<string>();
  const syncClaim = async (pvc: V1PersistentVolumeClaim) => {
    const namespace = pvc.metadata!.namespace!;
    const name = pvc.metadata!.name!;
    if (pvc.metadata?.deletionTimestamp) {
      const inUse = pods.list().some((p) => p.metadata?.namespace === namespace && !terminal(p) && (p.spec?.volumes ?? []).some((v) => v.persistentVolumeClaim?.claimName === name));
      if (inUse) return;
      const finalizers = (pvc.metadata.finalizers ?? []).filter((f) => f !== 'kubernetes.io/pvc-protection');
      if (finalizers.length !== (pvc.metadata.finalizers ?? []).length) {
        await core.patchNamespacedPersistentVolumeClaim({ namespace, name, body: [{ op: 'replace', path: '/metadata/finalizers', value: finalizers }] }).catch(() => undefined);
      }
      return;
    }
    if (pvc.status?.phase === 'Bound') return;
    const pvName = `pvc-${pvc.metadata!.uid}`;
    const dir = path.join(volumesDir, pvName);
    await fs.mkdir(dir, { recursive: true, mode: 0o777 });
    await fs.chmod(dir, 0o777);
    const storage = pvc.spec?.resources?.requests?.storage ?? '1Gi';
    await core
      .createPersistentVolume({
        body: {
          metadata: { name: pvName, annotations: { 'pv.kubernetes.io/provisioned-by': 'slipway-test-node' } },
          spec: {
            capacity: { storage },
            accessModes: pvc.spec?.accessModes ?? ['ReadWriteOnce'],
            persistentVolumeReclaimPolicy: 'Delete',
            storageClassName: pvc.spec?.storageClassName ?? '',
            hostPath: { path: dir, type: 'Directory' },
            claimRef: { apiVersion: 'v1', kind: 'PersistentVolumeClaim', namespace, name, uid: pvc.metadata!.uid },
          },
        },
      })
      .catch((e) => {
        if (code(e) !== 409) throw e;
      });
    const fresh = await core.readNamespacedPersistentVolumeClaim({ namespace, name });
    if (!fresh.spec?.volumeName) {
      fresh.spec = { ...fresh.spec, volumeName: pvName };
      await core.replaceNamespacedPersistentVolumeClaim({ namespace, name, body: fresh });
    }
    const bound = await core.readNamespacedPersistentVolumeClaim({ namespace, name });
    bound.status = { phase: 'Bound', accessModes: bound.spec?.accessModes, capacity: { storage } };
    await core.replaceNamespacedPersistentVolumeClaimStatus({ namespace, name, body: bound });
    const pv = await core.readPersistentVolume({ name: pvName });
    pv.status = { phase: 'Bound' };
    await core.replacePersistentVolumeStatus({ name: pvName, body: pv });
  };
  const considerClaim = (pvc: V1PersistentVolumeClaim) => {
    const uid = pvc.metadata?.uid;
    if (!uid || claimBusy.has(uid)) return;
    claimBusy.add(uid);
    void syncClaim(pvc)
      .catch(() => undefined)
      .finally(() => claimBusy.delete(uid));
  };
  /** Reclaim policy Delete: a released volume goes, with its data. */
  const releaseVolume = async (pvc: V1PersistentVolumeClaim) => {
    const pvName = pvc.spec?.volumeName;
    if (!pvName || !pvName.startsWith('pvc-')) return;
    await core.deletePersistentVolume({ name: pvName }).catch(() => undefined);
    await core.patchPersistentVolume({ name: pvName, body: [{ op: 'replace', path: '/metadata/finalizers', value: [] }] }).catch(() => undefined);
    await fs.rm(path.join(volumesDir, pvName), { recursive: true, force: true });
  };

  let claims: Informer<V1PersistentVolumeClaim> | undefined;
  nodes = informer<V1Node>(kc, '/api/v1/nodes', () => core.listNode(), () => reconsiderAll());
  pods = informer<V1Pod>(kc, '/api/v1/pods', () => core.listPodForAllNamespaces(), (type, pod) => {
    if (type !== 'DELETED') consider(pod);
    const ns = pod.metadata?.namespace;
    if (ns && (type === 'DELETED' || terminal(pod))) {
      recountQuotas(ns);
      // A claim waiting for its last pod to go.
      for (const v of pod.spec?.volumes ?? []) {
        const claim = v.persistentVolumeClaim && claims?.list().find((c) => c.metadata?.namespace === ns && c.metadata?.name === v.persistentVolumeClaim!.claimName);
        if (claim) considerClaim(claim);
      }
    }
  });
  claims = informer<V1PersistentVolumeClaim>(kc, '/api/v1/persistentvolumeclaims', () => core.listPersistentVolumeClaimForAllNamespaces(), (type, pvc) => {
    if (type === 'DELETED') {
      void releaseVolume(pvc).catch(() => undefined);
      recountQuotas(pvc.metadata!.namespace!);
    } else considerClaim(pvc);
  });
  const quotas = informer<V1ResourceQuota>(kc, '/api/v1/resourcequotas', () => core.listResourceQuotaForAllNamespaces(), (type, q) => {
    if (type === 'DELETED') return;
    const hard = JSON.stringify(q.spec?.hard ?? {});
    if (hard !== JSON.stringify(q.status?.hard ?? {}) || !q.status?.used) recountQuotas(q.metadata!.namespace!);
  });
  informers.push(nodes, pods, claims, quotas);
  return {
    refs: 0,
    stop() {
      for (const i of informers) i.stop();
    },
  };
}

// --- the kubelet ---------------------------------------------------------------------------------

interface PodState {
  uid: string;
  namespace: string;
  name: string;
  /** container name -> podman container */
  containers: Map<string, string>;
  dir: string;
  /** Set once the pod is finished for the kubelet (terminal, evicted, deleted): no more status writes. */
  done: boolean;
  /** Serializes the work on one pod. */
  chain: Promise<void>;
  restarts: Map<string, number>;
  /** The podman pod holding the pod's network namespace. */
  sandbox?: string;
  /** The pod's IP (the sandbox's). */
  podIP?: string;
}

export async function startTestNode(cluster: KubeCluster, opts: TestNodeOptions = {}): Promise<TestNode> {
  const nodePodman = (args: string[], env: Record<string, string> = {}) => (opts.interceptPodman ? opts.interceptPodman(args, () => podman(args, env)) : podman(args, env));
  const name = opts.name ?? `node-${randomBytes(3).toString('hex')}`;
  const kc = cluster.config('admin');
  const core = kc.makeApiClient(CoreV1Api);
  const sandboxImage = defaultSandboxImage();
  if (!opts.images && !sandboxImage) throw new Error('kube-node: no sandbox image (.tools/containers/image); run bash scripts/setup.sh (needs podman)');
  const check = await nodePodman(['version', '--format', '{{.Client.Version}}']);
  if (check.code !== 0) throw new Error(`kube-node: podman is missing or broken: ${check.stderr.trim() || check.stdout.trim()}`);
  const nodeDir = path.join(cluster.dir, 'nodes', name);
  await fs.mkdir(nodeDir, { recursive: true });
  const pids = opts.podPidsLimit ?? 1024;
  const allocatable = opts.allocatable ?? { cpu: '4', memory: '8Gi' };
  const pods = new Map<string, PodState>();
  const containerOf = (ns: string, pod: string, container: string) => {
    for (const s of pods.values()) if (s.namespace === ns && s.name === pod && !s.done) return s.containers.get(container);
    return undefined;
  };
  // The kubelet's streaming endpoint (pods/exec), which the API server dials at this node's InternalIP.
  const exec = await startKubeletExec({ resolve: containerOf, clientCa: readFileSync(cluster.clientCaFile, 'utf8') });
  const kubeletPort = exec.port;
  let execStopped: Promise<void> | undefined;
  const stopExec = () => (execStopped ??= exec.stop());
  let lost = false;
  let stopped = false;

  const readyCondition = (status: 'True' | 'Unknown', reason: string, message: string, heartbeat: Date) => ({
    type: 'Ready',
    status,
    reason,
    message,
    lastHeartbeatTime: heartbeat,
    lastTransitionTime: heartbeat,
  });
  const nodeStatus = (heartbeat: Date): V1Node['status'] => ({
    capacity: { ...allocatable, pods: '110' },
    allocatable: { ...allocatable, pods: '110' },
    addresses: [
      { type: 'InternalIP', address: '127.0.0.1' },
      { type: 'Hostname', address: name },
    ],
    daemonEndpoints: { kubeletEndpoint: { Port: kubeletPort } },
    nodeInfo: {
      architecture: 'amd64',
      operatingSystem: 'linux',
      osImage: 'slipway test node',
      kernelVersion: '',
      kubeletVersion: 'v1.34.4-slipway-test',
      kubeProxyVersion: '',
      containerRuntimeVersion: `podman://${check.stdout.trim()}`,
      machineID: name,
      systemUUID: name,
      bootID: name,
    },
    conditions: [readyCondition('True', 'KubeletReady', 'kubelet is posting ready status', heartbeat)],
  });

  // Register, as the kubelet does: the Node, then its status.
  await core.createNode({
    body: {
      metadata: { name, labels: { 'kubernetes.io/hostname': name, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': 'amd64', ...opts.labels } },
      spec: { taints: opts.taints },
    },
  });
  const writeNodeStatus = async (mutate: (node: V1Node) => void) => {
    for (let i = 0; i < 5; i++) {
      const node = await core.readNode({ name });
      mutate(node);
      try {
        await core.replaceNodeStatus({ name, body: node });
        return;
      } catch (e) {
        if (code(e) !== 409) throw e;
      }
    }
  };
  await writeNodeStatus((n) => (n.status = nodeStatus(now())));
  // The TaintNodesByCondition admission plugin gave the new Node the not-ready taint; the node
  // lifecycle controller lifts it once the node reports Ready.
  for (;;) {
    const node = await core.readNode({ name });
    const taints = (node.spec?.taints ?? []).filter((t) => t.key !== 'node.kubernetes.io/not-ready');
    if (taints.length === (node.spec?.taints ?? []).length) break;
    node.spec = { ...node.spec, taints };
    try {
      await core.replaceNode({ name, body: node });
      break;
    } catch (e) {
      if (code(e) !== 409) throw e;
    }
  }
  const controllers = controllersByCluster.get(cluster.server) ?? startClusterControllers(cluster);
  controllersByCluster.set(cluster.server, controllers);
  controllers.refs++;

  // Heartbeat: Ready's lastHeartbeatTime, as the kubelet's node status updates.
  const heartbeat = setInterval(() => {
    if (lost || stopped) return;
    void writeNodeStatus((n) => {
      const t = now();
      n.status!.conditions = (n.status!.conditions ?? []).map((c) => (c.type === 'Ready' ? { ...c, lastHeartbeatTime: t } : c));
    }).catch(() => undefined);
  }, 10_000);

  const imageFor = (image: string | undefined): string | undefined => {
    if (opts.images) return image ? opts.images[image] : undefined;
    return sandboxImage;
  };
  const podmanName = (pod: V1Pod, container: string) => `k8s_${container}_${pod.metadata!.name}_${pod.metadata!.namespace}_${pod.metadata!.uid!.slice(0, 8)}`;

  /** Host folders for the pod's volumes; throws a message for the pod's status when one cannot be made. */
  const prepareVolumes = async (pod: V1Pod, state: PodState): Promise<Map<string, { host: string; readOnly: boolean }>> => {
    const out = new Map<string, { host: string; readOnly: boolean }>();
    const ns = pod.metadata!.namespace!;
    const write = async (dir: string, files: Record<string, string | Buffer>) => {
      await fs.mkdir(dir, { recursive: true });
      for (const [f, content] of Object.entries(files)) {
        await fs.mkdir(path.dirname(path.join(dir, f)), { recursive: true });
        await fs.writeFile(path.join(dir, f), content, { mode: 0o644 });
      }
    };
    for (const v of pod.spec?.volumes ?? ([] as V1Volume[])) {
      const dir = path.join(state.dir, 'volumes', v.name);
      if (v.emptyDir) {
        await fs.mkdir(dir, { recursive: true, mode: 0o777 });
        await fs.chmod(dir, 0o777);
        out.set(v.name, { host: dir, readOnly: false });
      } else if (v.persistentVolumeClaim) {
        // As the kubelet's volume manager: wait until the claim is bound, then mount its volume.
        const claimName = v.persistentVolumeClaim.claimName;
        let pvName: string | undefined;
        for (let i = 0; i < 600 && !pvName && !state.done; i++) {
          const pvc = await core.readNamespacedPersistentVolumeClaim({ namespace: ns, name: claimName }).catch(() => undefined);
          if (pvc?.status?.phase === 'Bound') pvName = pvc.spec?.volumeName;
          else await sleep(100);
        }
        if (!pvName) throw new Error(`persistentvolumeclaim "${claimName}" not bound`);
        const pv = await core.readPersistentVolume({ name: pvName });
        if (!pv.spec?.hostPath?.path) throw new Error(`persistentvolume "${pvName}" is not a hostPath volume`);
        out.set(v.name, { host: pv.spec.hostPath.path, readOnly: !!v.persistentVolumeClaim.readOnly });
      } else if (v.configMap || v.secret) {
        const data: Record<string, string | Buffer> = {};
        if (v.configMap) {
          const cm = await core.readNamespacedConfigMap({ namespace: ns, name: v.configMap.name! });
          for (const [k, val] of Object.entries(cm.data ?? {})) data[k] = val;
        } else {
          const s = await core.readNamespacedSecret({ namespace: ns, name: v.secret!.secretName! });
          for (const [k, val] of Object.entries(s.data ?? {})) data[k] = Buffer.from(val, 'base64');
        }
        const items = v.configMap?.items ?? v.secret?.items;
        const files = items ? Object.fromEntries(items.map((i) => [i.path, data[i.key] ?? ''])) : data;
        await write(dir, files);
        out.set(v.name, { host: dir, readOnly: true });
      } else if (v.projected) {
        const files: Record<string, string | Buffer> = {};
        for (const src of v.projected.sources ?? []) {
          if (src.serviceAccountToken) {
            // TokenRequest bound to this pod, as the kubelet's token manager.
            const tr = await core.createNamespacedServiceAccountToken({
              namespace: ns,
              name: pod.spec?.serviceAccountName ?? 'default',
              body: {
                spec: {
                  audiences: src.serviceAccountToken.audience ? [src.serviceAccountToken.audience] : [],
                  expirationSeconds: src.serviceAccountToken.expirationSeconds ?? 3607,
                  boundObjectRef: { apiVersion: 'v1', kind: 'Pod', name: pod.metadata!.name!, uid: pod.metadata!.uid },
                },
              },
            });
            files[src.serviceAccountToken.path] = tr.status!.token;
          } else if (src.configMap) {
            const cm = await core.readNamespacedConfigMap({ namespace: ns, name: src.configMap.name! });
            for (const i of src.configMap.items ?? Object.keys(cm.data ?? {}).map((k) => ({ key: k, path: k }))) files[i.path] = cm.data?.[i.key] ?? '';
          } else if (src.downwardAPI) {
            for (const i of src.downwardAPI.items ?? []) {
              const f = i.fieldRef?.fieldPath;
              files[i.path] = f === 'metadata.namespace' ? ns : f === 'metadata.name' ? pod.metadata!.name! : f === 'metadata.uid' ? pod.metadata!.uid! : '';
            }
          } else if (src.secret) {
            const s = await core.readNamespacedSecret({ namespace: ns, name: src.secret.name! });
            for (const [k, val] of Object.entries(s.data ?? {})) files[k] = Buffer.from(val, 'base64');
          }
        }
        await write(dir, files);
        out.set(v.name, { host: dir, readOnly: true });
      } else {
        throw new Error(`volume "${v.name}": this test node supports emptyDir, persistentVolumeClaim, configMap, secret and projected volumes`);
      }
    }
    return out;
  };

  /** The container's environment: values go to podman's own environment, never its argv. */
  const containerEnv = async (pod: V1Pod, c: V1Container): Promise<Record<string, string>> => {
    const ns = pod.metadata!.namespace!;
    const env: Record<string, string> = {};
    for (const from of c.envFrom ?? []) {
      if (from.configMapRef) {
        const cm = await core.readNamespacedConfigMap({ namespace: ns, name: from.configMapRef.name! });
        for (const [k, v] of Object.entries(cm.data ?? {})) env[(from.prefix ?? '') + k] = v;
      } else if (from.secretRef) {
        const s = await core.readNamespacedSecret({ namespace: ns, name: from.secretRef.name! });
        for (const [k, v] of Object.entries(s.data ?? {})) env[(from.prefix ?? '') + k] = Buffer.from(v, 'base64').toString('utf8');
      }
    }
    for (const e of c.env ?? []) {
      if (e.value !== undefined) env[e.name] = e.value;
      else if (e.valueFrom?.fieldRef) {
        const f = e.valueFrom.fieldRef.fieldPath;
        env[e.name] = f === 'metadata.name' ? pod.metadata!.name! : f === 'metadata.namespace' ? ns : f === 'metadata.uid' ? pod.metadata!.uid! : f === 'spec.nodeName' ? name : f === 'spec.serviceAccountName' ? (pod.spec?.serviceAccountName ?? 'default') : (pod.metadata?.labels?.[f.replace(/^metadata\.labels\['(.*)'\]$/, '$1')] ?? '');
      } else if (e.valueFrom?.configMapKeyRef) {
        const cm = await core.readNamespacedConfigMap({ namespace: ns, name: e.valueFrom.configMapKeyRef.name! });
        env[e.name] = cm.data?.[e.valueFrom.configMapKeyRef.key] ?? '';
      } else if (e.valueFrom?.secretKeyRef) {
        const s = await core.readNamespacedSecret({ namespace: ns, name: e.valueFrom.secretKeyRef.name! });
        env[e.name] = Buffer.from(s.data?.[e.valueFrom.secretKeyRef.key] ?? '', 'base64').toString('utf8');
      } else env[e.name] = '';
    }
    return env;
  };

  const runArgs = (pod: V1Pod, c: V1Container, container: string, image: string, volumes: Map<string, { host: string; readOnly: boolean }>, env: Record<string, string>, sandbox: string): string[] => {
    const args = ['run', '-d', '--name', container, '--pod', sandbox, '--label', `${NODE_LABEL}=${name}`, '--label', `io.kubernetes.pod.uid=${pod.metadata!.uid}`, '--pids-limit', String(pids)];
    const limits = c.resources?.limits ?? {};
    if (limits.memory) args.push('--memory', `${scalar(limits.memory)}b`, '--memory-swap', `${scalar(limits.memory)}b`);
    if (limits.cpu) args.push('--cpus', String(scalar(limits.cpu)));
    const sc = { ...pod.spec?.securityContext, ...c.securityContext } as NonNullable<V1Container['securityContext']> & { runAsUser?: number; runAsGroup?: number };
    if (sc.runAsUser !== undefined) args.push('--user', sc.runAsGroup !== undefined ? `${sc.runAsUser}:${sc.runAsGroup}` : String(sc.runAsUser));
    if (sc.allowPrivilegeEscalation === false) args.push('--security-opt', 'no-new-privileges');
    if (sc.readOnlyRootFilesystem) args.push('--read-only');
    for (const cap of sc.capabilities?.drop ?? []) args.push(`--cap-drop=${cap.toLowerCase()}`);
    for (const cap of sc.capabilities?.add ?? []) args.push(`--cap-add=${cap.toLowerCase()}`);
    if (c.workingDir) args.push('--workdir', c.workingDir);
    for (const k of Object.keys(env)) args.push('--env', k);
    for (const m of c.volumeMounts ?? []) {
      const v = volumes.get(m.name);
      if (!v) throw new Error(`volumeMount "${m.name}": no such volume`);
      const host = m.subPath ? path.join(v.host, m.subPath) : v.host;
      args.push('-v', `${host}:${m.mountPath}:${v.readOnly || m.readOnly ? 'ro' : 'rw'}`);
    }
    if (c.command?.length) args.push('--entrypoint', JSON.stringify(c.command));
    args.push(image, ...(c.args ?? []));
    return args;
  };

  interface Inspect {
    Id: string;
    State: { Status: string; Running: boolean; ExitCode: number; OOMKilled: boolean; StartedAt: string; FinishedAt: string; Error?: string };
    NetworkSettings?: { IPAddress?: string };
    ImageName?: string;
    Image?: string;
  }
  const inspect = async (container: string): Promise<Inspect | undefined> => {
    const r = await nodePodman(['inspect', '--type', 'container', container]);
    if (r.code !== 0) return undefined;
    return (JSON.parse(r.stdout) as Inspect[])[0];
  };
  /**
   * OOMKilled: podman's own flag, else the kernel's log, where the kubelet's OOM watcher (cAdvisor,
   * /dev/kmsg) finds it too; on cgroup v1 with runc, podman here does not notice memcg OOM kills.
   */
  const oomKilled = async (info: Inspect): Promise<boolean> => {
    if (info.State.OOMKilled) return true;
    if (info.State.ExitCode !== 137) return false;
    const log = await new Promise<string>((resolve) => {
      const child = spawn('dmesg', [], { stdio: ['ignore', 'pipe', 'ignore'] });
      let out = '';
      child.stdout.on('data', (d) => (out += d));
      child.on('error', () => resolve(''));
      child.on('close', () => resolve(out));
    });
    return log.split('\n').some((l) => l.includes('oom-kill:') && l.includes(`task_memcg=`) && l.includes(info.Id));
  };
  const date = (s: string | undefined) => (s && !s.startsWith('0001') ? new Date(s) : undefined);
  const statusOf = (c: V1Container, info: Inspect | undefined, oom: boolean, state: PodState, ready: boolean): V1ContainerStatus => {
    const base = { name: c.name, image: c.image ?? '', imageID: info?.Image ?? '', containerID: info ? `podman://${info.Id}` : undefined, restartCount: state.restarts.get(c.name) ?? 0 };
    if (!info) return { ...base, ready: false, started: false, state: { waiting: { reason: 'ContainerCreating' } } };
    if (info.State.Running) return { ...base, ready, started: true, state: { running: { startedAt: date(info.State.StartedAt) } } };
    const exitCode = info.State.ExitCode;
    const reason = oom ? 'OOMKilled' : exitCode === 0 ? 'Completed' : 'Error';
    return {
      ...base,
      ready: false,
      started: false,
      state: { terminated: { exitCode, reason, startedAt: date(info.State.StartedAt), finishedAt: date(info.State.FinishedAt) ?? now(), containerID: `podman://${info.Id}` } },
    };
  };

  /** Writes the pod's status from what podman says about its containers. */
  const report = async (pod: V1Pod, state: PodState, readiness: Map<string, boolean>) => {
    const containers = pod.spec?.containers ?? [];
    const infos = await Promise.all(containers.map((c) => (state.containers.get(c.name) ? inspect(state.containers.get(c.name)!) : Promise.resolve(undefined))));
    const ooms = await Promise.all(infos.map((i) => (i && !i.State.Running ? oomKilled(i) : false)));
    const statuses = containers.map((c, i) => statusOf(c, infos[i], ooms[i], state, readiness.get(c.name) ?? true));
    const allTerminated = statuses.every((s) => s.state?.terminated);
    const policy = pod.spec?.restartPolicy ?? 'Always';
    let phase: string = 'Running';
    if (allTerminated && policy === 'Never') phase = statuses.every((s) => s.state?.terminated?.exitCode === 0) ? 'Succeeded' : 'Failed';
    if (allTerminated && policy === 'OnFailure' && statuses.every((s) => s.state?.terminated?.exitCode === 0)) phase = 'Succeeded';
    const allReady = statuses.every((s) => s.ready);
    const ip = state.podIP;
    if (phase === 'Succeeded' || phase === 'Failed') state.done = true;
    await updatePodStatus(core, state.namespace, state.name, state.uid, (p) => {
      const s = p.status!;
      s.phase = phase;
      s.hostIP = '127.0.0.1';
      s.hostIPs = [{ ip: '127.0.0.1' }];
      if (ip) {
        s.podIP = ip;
        s.podIPs = [{ ip }];
      }
      s.startTime ??= now();
      s.containerStatuses = statuses;
      let c = setCondition(s.conditions, { type: 'PodReadyToStartContainers', status: phase === 'Running' ? 'True' : 'False' });
      c = setCondition(c, { type: 'Initialized', status: 'True' });
      const ready = phase === 'Running' && allReady;
      c = setCondition(c, { type: 'ContainersReady', status: ready ? 'True' : 'False', ...(ready ? {} : { reason: phase === 'Running' ? 'ContainersNotReady' : 'PodCompleted' }) });
      c = setCondition(c, { type: 'Ready', status: ready ? 'True' : 'False', ...(ready ? {} : { reason: phase === 'Running' ? 'ContainersNotReady' : 'PodCompleted' }) });
      s.conditions = c;
    });
  };

  const failPod = async (state: PodState, reason: string, message: string, waiting: boolean, pod: V1Pod) => {
    // A container that cannot be made stays Waiting with the kubelet's reason, the pod Pending.
    await updatePodStatus(core, state.namespace, state.name, state.uid, (p) => {
      p.status!.phase = waiting ? 'Pending' : 'Failed';
      p.status!.hostIP = '127.0.0.1';
      p.status!.startTime ??= now();
      if (!waiting) {
        p.status!.reason = reason;
        p.status!.message = message;
      }
      p.status!.containerStatuses = (pod.spec?.containers ?? []).map((c) => ({ name: c.name, image: c.image ?? '', imageID: '', ready: false, restartCount: 0, started: false, state: { waiting: { reason, message } } }));
    });
  };

  const startPod = async (pod: V1Pod, state: PodState) => {
    await fs.mkdir(state.dir, { recursive: true });
    let volumes: Map<string, { host: string; readOnly: boolean }>;
    try {
      volumes = await prepareVolumes(pod, state);
    } catch (e) {
      return failPod(state, 'CreateContainerConfigError', (e as Error).message, true, pod);
    }
    const readiness = new Map<string, boolean>();
    // The pod sandbox: a podman pod whose infra container holds the network namespace (and the
    // pod's IP) the containers share, as a real pod's pause container does.
    const sandbox = `k8s_POD_${pod.metadata!.name}_${pod.metadata!.namespace}_${pod.metadata!.uid!.slice(0, 8)}`;
    const created = await nodePodman(['pod', 'create', '--name', sandbox, '--network', 'bridge', '--hostname', pod.metadata!.name!, '--label', `${NODE_LABEL}=${name}`, '--label', `io.kubernetes.pod.uid=${pod.metadata!.uid}`]);
    if (created.code !== 0) return failPod(state, 'FailedCreatePodSandBox', created.stderr.trim(), true, pod);
    state.sandbox = sandbox;
    const started = await nodePodman(['pod', 'start', sandbox]);
    if (started.code !== 0) return failPod(state, 'FailedCreatePodSandBox', started.stderr.trim(), true, pod);
    const infra = await nodePodman(['pod', 'inspect', sandbox, '--format', '{{.InfraContainerID}}']);
    state.podIP = (await inspect(infra.stdout.trim()))?.NetworkSettings?.IPAddress || undefined;
    const all: Array<{ c: V1Container; init: boolean }> = [...(pod.spec?.initContainers ?? []).map((c) => ({ c, init: true })), ...(pod.spec?.containers ?? []).map((c) => ({ c, init: false }))];
    for (const { c, init } of all) {
      if (state.done) return;
      const image = imageFor(c.image);
      if (!image) return failPod(state, 'ErrImagePull', `image "${c.image}" is not among this test node's images`, true, pod);
      const container = podmanName(pod, c.name);
      let env: Record<string, string>;
      let args: string[];
      try {
        env = await containerEnv(pod, c);
        args = runArgs(pod, c, container, image, volumes, env, sandbox);
      } catch (e) {
        return failPod(state, 'CreateContainerConfigError', (e as Error).message, true, pod);
      }
      const r = await nodePodman(args, env);
      if (r.code !== 0) return failPod(state, 'RunContainerError', r.stderr.trim(), false, pod);
      if (init) {
        const w = await nodePodman(['wait', container]);
        await nodePodman(['rm', '-f', container]);
        if (w.stdout.trim() !== '0') {
          state.done = true;
          return failPod(state, 'Init:Error', `init container "${c.name}" exited with ${w.stdout.trim()}`, false, pod);
        }
        continue;
      }
      state.containers.set(c.name, container);
      if (c.readinessProbe?.exec?.command) readiness.set(c.name, false);
    }
    await report(pod, state, readiness);
    // Readiness probes (exec only), then each container's exit.
    for (const c of pod.spec?.containers ?? []) {
      const container = state.containers.get(c.name)!;
      const probe = c.readinessProbe?.exec?.command;
      if (probe) {
        void (async () => {
          while (!state.done && !stopped && !lost) {
            const r = await nodePodman(['exec', container, ...probe]);
            if (r.code === 0) {
              readiness.set(c.name, true);
              await state.chain;
              if (!state.done) await report(pod, state, readiness).catch(() => undefined);
              return;
            }
            await sleep((c.readinessProbe?.periodSeconds ?? 1) * 1000);
          }
        })();
      }
      void (async () => {
        for (;;) {
          await nodePodman(['wait', container]);
          if (state.done || stopped || lost) return;
          const info = await inspect(container);
          const policy = pod.spec?.restartPolicy ?? 'Always';
          if (info && (policy === 'Always' || (policy === 'OnFailure' && info.State.ExitCode !== 0))) {
            state.restarts.set(c.name, (state.restarts.get(c.name) ?? 0) + 1);
            await nodePodman(['start', container]);
            continue;
          }
          state.chain = state.chain.then(() => (state.done ? undefined : report(pod, state, readiness))).catch(() => undefined);
          return;
        }
      })();
    }
  };

  const killContainers = async (state: PodState, grace: number) => {
    await Promise.all([...state.containers.values()].map((c) => nodePodman(['rm', '-f', '-t', String(grace), c])));
    if (state.sandbox) await nodePodman(['pod', 'rm', '-f', '-t', '0', state.sandbox]);
  };

  const syncPod = async (pod: V1Pod) => {
    const uid = pod.metadata!.uid!;
    let state = pods.get(uid);
    if (pod.metadata?.deletionTimestamp) {
      // Graceful deletion: stop the containers (SIGTERM, SIGKILL after the grace), then delete the pod for good.
      if (state) {
        state.done = true;
        await killContainers(state, pod.metadata.deletionGracePeriodSeconds ?? 30);
        await fs.rm(path.join(state.dir, 'volumes'), { recursive: true, force: true }).catch(() => undefined);
      }
      await core
        .deleteNamespacedPod({ namespace: pod.metadata.namespace!, name: pod.metadata.name!, gracePeriodSeconds: 0, body: { gracePeriodSeconds: 0, preconditions: { uid } } })
        .catch(() => undefined);
      pods.delete(uid);
      return;
    }
    if (state || terminal(pod) || stopped || lost) return;
    state = { uid, namespace: pod.metadata!.namespace!, name: pod.metadata!.name!, containers: new Map(), dir: path.join(nodeDir, 'pods', uid), done: false, chain: Promise.resolve(), restarts: new Map() };
    pods.set(uid, state);
    await startPod(pod, state);
  };
  const queues = new Map<string, Promise<void>>();
  const enqueue = (pod: V1Pod) => {
    const uid = pod.metadata?.uid;
    if (!uid || lost || stopped) return;
    const next = (queues.get(uid) ?? Promise.resolve()).then(() => syncPod(pod)).catch(() => undefined);
    queues.set(uid, next);
  };
  const kubelet = informer<V1Pod>(
    kc,
    '/api/v1/pods',
    () => core.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${name}` }),
    (type, pod) => {
      if (type !== 'DELETED') enqueue(pod);
    },
    { fieldSelector: `spec.nodeName=${name}` },
  );

  const find = async (ns: string, pod: string) => {
    const p = await core.readNamespacedPod({ namespace: ns, name: pod });
    return { pod: p, state: pods.get(p.metadata!.uid!) };
  };

  return {
    name,
    containerName(ns, pod, container) {
      for (const s of pods.values()) if (s.namespace === ns && s.name === pod) return s.containers.get(container);
      return undefined;
    },
    async evict(ns, podName) {
      const { pod, state } = await find(ns, podName);
      if (state) {
        state.done = true;
        await state.chain;
        await killContainers(state, 0);
      }
      const message = 'The node was low on resource: memory. Threshold quantity: 100Mi, available: 0Ki. ';
      await updatePodStatus(core, ns, podName, pod.metadata!.uid, (p) => {
        const s = p.status!;
        s.phase = 'Failed';
        s.reason = 'Evicted';
        s.message = message;
        let c = setCondition(s.conditions, { type: 'DisruptionTarget', status: 'True', reason: 'TerminationByKubelet', message });
        c = setCondition(c, { type: 'Ready', status: 'False', reason: 'PodFailed' });
        s.conditions = setCondition(c, { type: 'ContainersReady', status: 'False', reason: 'PodFailed' });
        s.containerStatuses = (s.containerStatuses ?? []).map((cs) => ({
          ...cs,
          ready: false,
          started: false,
          state: { terminated: { exitCode: 137, reason: 'Error', startedAt: cs.state?.running?.startedAt, finishedAt: now() } },
        }));
      });
    },
    async lose() {
      lost = true;
      clearInterval(heartbeat);
      kubelet.stop();
      // Unreachable: the API server's dials for exec fail.
      await stopExec();
      // The node lifecycle controller: node Ready=Unknown with the unreachable taints, its pods not Ready.
      await writeNodeStatus((n) => {
        const t = now();
        n.status!.conditions = (n.status!.conditions ?? []).map((c) =>
          c.type === 'Ready' ? { ...c, status: 'Unknown', reason: 'NodeStatusUnknown', message: 'Kubelet stopped posting node status.', lastTransitionTime: t } : c,
        );
      });
      const node = await core.readNode({ name });
      node.spec = {
        ...node.spec,
        taints: [
          ...(node.spec?.taints ?? []),
          { key: 'node.kubernetes.io/unreachable', effect: 'NoSchedule', timeAdded: now() },
          { key: 'node.kubernetes.io/unreachable', effect: 'NoExecute', timeAdded: now() },
        ],
      };
      await core.replaceNode({ name, body: node });
      const onNode = await core.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${name}` });
      for (const p of onNode.items) {
        if (terminal(p)) continue;
        await updatePodStatus(core, p.metadata!.namespace!, p.metadata!.name!, p.metadata!.uid, (q) => {
          q.status!.reason = 'NodeLost';
          q.status!.message = `Node ${name} which was running pod ${q.metadata!.name} is unresponsive`;
          q.status!.conditions = setCondition(q.status!.conditions, { type: 'Ready', status: 'False', reason: 'NodeLost', message: q.status!.message });
        });
      }
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      clearInterval(heartbeat);
      kubelet.stop();
      await stopExec();
      for (const s of pods.values()) s.done = true;
      const sweep = async () => {
        const ours = await nodePodman(['pod', 'ps', '-q', '--filter', `label=${NODE_LABEL}=${name}`]);
        const ids = ours.stdout.split('\n').filter(Boolean);
        if (ids.length) await nodePodman(['pod', 'rm', '-f', '-t', '0', ...ids]);
        const loose = (await nodePodman(['ps', '-aq', '--filter', `label=${NODE_LABEL}=${name}`])).stdout.split('\n').filter(Boolean);
        if (loose.length) await nodePodman(['rm', '-f', '-t', '0', ...loose]);
      };
      await sweep();
      // A pod being started meanwhile may make its podman pod or container after that listing:
      // once every sync has settled (each stops at its next step, its state done), sweep again.
      await Promise.allSettled([...queues.values()]);
      await sweep();
      await core.deleteNode({ name }).catch(() => undefined);
      if (--controllers.refs === 0) {
        controllers.stop();
        controllersByCluster.delete(cluster.server);
      }
      await fs.rm(nodeDir, { recursive: true, force: true }).catch(() => undefined);
    },
  };
}
