/**
 * Kubernetes sandboxes (ADR 0020) against a real kube-apiserver (test/helpers/kube-cluster.ts)
 * and the test node (test/helpers/kube-node.ts: scheduler, kubelet with podman, PV controller,
 * quota; its exec endpoint is test/helpers/kubelet-exec.ts). Real: the API server (authn, RBAC,
 * admission, quota, pods/exec over WebSocket), client-node, git, podman. Played: the node.
 * Fails, never skips, when a binary is missing.
 */
import { execFileSync } from 'node:child_process';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApplicationFailure } from '@temporalio/common';
import { CoreV1Api, KubernetesObjectApi, PatchStrategy, type KubeConfig } from '@kubernetes/client-node';
import { parseAllDocuments } from 'yaml';
import { defaultSandboxImage, engineEnv } from '../../activities/sandbox/container';
import { classifyKubeError, KubernetesProviderError, KubernetesSandboxProvider, kubernetesSandboxRoot } from '../../activities/sandbox/kubernetes';
import { PodWatchers, SandboxPodWatch, type PodExit } from '../../activities/sandbox/kube-watch';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import { createStreamSandbox } from '../../activities/sandbox/objective-sandboxes';
import type { SandboxHandle } from '../../activities/sandbox/provider';
import { SandboxProviders } from '../../activities/sandbox/router';
import { KUBE_LABELS, KUBE_WORKSPACE } from '../../core/kubernetes';
import { SandboxConfigSchema } from '../../core/objective-schema';
import { startKubeCluster, type KubeCluster } from '../helpers/kube-cluster';
import { startTestNode, type TestNode } from '../helpers/kube-node';
import { describeSandboxContract } from './contract';
import { makeRepo, sandboxRequest, tempDir, waitFor } from './helpers';

const NS = 'sandboxes';
let cluster: KubeCluster;
let node: TestNode;
let admin: KubeConfig;
let core: CoreV1Api;

const podman = (...args: string[]) => execFileSync('podman', args, { env: engineEnv(), encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();

/** Whether a process whose command line holds `marker` runs in any container of the test node. */
async function runningOnNode(marker: string): Promise<boolean> {
  const ids = podman('ps', '-q', '--filter', `label=slipway-test-node=${node.name}`).split('\n').filter(Boolean);
  for (const id of ids) {
    try {
      const out = podman('exec', id, '/bin/sh', '-c', 'for d in /proc/[0-9]*; do tr "\\000" " " < $d/cmdline 2>/dev/null; echo; done');
      if (out.split('\n').some((l) => l.includes(marker) && !l.includes('/proc/[0-9]'))) return true;
    } catch {
      /* a container that went away meanwhile */
    }
  }
  return false;
}

beforeAll(async () => {
  if (!defaultSandboxImage()) throw new Error('no sandbox image: bash scripts/setup.sh builds it');
  cluster = await startKubeCluster();
  node = await startTestNode(cluster);
  admin = cluster.config('admin');
  core = admin.makeApiClient(CoreV1Api);
  await core.createNamespace({ body: { metadata: { name: NS } } });
  expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 60_000)).toBe(true);
}, 240_000);

afterAll(async () => {
  await node?.stop();
  await cluster?.stop();
});

const provider = (over: Partial<ConstructorParameters<typeof KubernetesSandboxProvider>[0]> = {}) =>
  new KubernetesSandboxProvider({ kubeConfig: admin, defaults: { namespace: NS, image: 'slipway-sandbox' }, ...over });

describeSandboxContract('kubernetes (real kube-apiserver, test node)', () => provider(), {
  processRunning: runningOnNode,
  workspacePath: async () => KUBE_WORKSPACE,
});

describe('kubernetes: pods, claims, errors', () => {
  let parent: string;
  let repo: string;
  let p: KubernetesSandboxProvider;
  let handle: SandboxHandle;
  const record = async (h: SandboxHandle) => JSON.parse(await fs.readFile(`${h.root}.json`, 'utf8')) as { pod: string; claim?: string; namespace: string };

  beforeAll(async () => {
    parent = tempDir('kube');
    ({ repo } = makeRepo(parent));
    p = provider({ unschedulableTimeoutMs: 2_000 });
    handle = await p.create({ ...sandboxRequest(repo, 'pods', { group: 'kube-objective' }), kubernetes: { nodeSelector: { 'kubernetes.io/os': 'linux' }, resources: { requests: { cpu: '100m', memory: '64Mi' }, limits: { memory: '512Mi' } } } });
  }, 240_000);
  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('makes a labelled pod on a claim, from the profile\'s settings, with no capability and no service-account token', async () => {
    const r = await record(handle);
    const pod = await core.readNamespacedPod({ namespace: NS, name: r.pod });
    expect(pod.metadata?.labels).toMatchObject({ [KUBE_LABELS.managed]: 'true', [KUBE_LABELS.sandbox]: handle.sandboxId, [KUBE_LABELS.group]: 'kube-objective' });
    expect(pod.spec?.nodeSelector).toEqual({ 'kubernetes.io/os': 'linux' });
    expect(pod.spec?.automountServiceAccountToken).toBe(false);
    const c = pod.spec!.containers[0];
    expect(c.resources?.limits).toEqual({ memory: '512Mi' });
    expect(c.securityContext).toMatchObject({ allowPrivilegeEscalation: false, capabilities: { drop: ['ALL'] } });
    expect(pod.spec?.volumes?.[0].persistentVolumeClaim?.claimName).toBe(r.claim);
    const claim = await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: r.claim! });
    expect(claim.metadata?.labels?.[KUBE_LABELS.sandbox]).toBe(handle.sandboxId);
    // The exec's env values travel on stdin, not argv: nothing of them in the processes' command lines.
    const run = await p.exec(handle, { command: 'cat /proc/*/cmdline | tr "\\000" " "; printf "\\n%s" "$SECRET_VALUE"', shell: true, env: { SECRET_VALUE: 'hunter2-value' } });
    expect(run.stdout.split('\n').at(-1)).toBe('hunter2-value');
    expect(run.stdout.split('\n').slice(0, -1).join('\n')).not.toContain('hunter2-value');
  });

  it('a pod the scheduler cannot place fails the create with the scheduler\'s message; nothing is left', async () => {
    const err = await p.create({ ...sandboxRequest(repo, 'unschedulable', { group: 'kube-objective' }), kubernetes: { nodeSelector: { pool: 'gpu' } } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KubernetesProviderError);
    expect((err as Error).message).toMatch(/cannot be scheduled: 0\/\d+ nodes are available/);
    await expect(fs.access(`${kubernetesSandboxRoot(repo, 'kube-objective', 'unschedulable')}.json`)).rejects.toThrow();
    const left = await core.listNamespacedPod({ namespace: NS, labelSelector: `${KUBE_LABELS.sandbox}=kube-objective.unschedulable` });
    expect(left.items.filter((x) => !x.metadata?.deletionTimestamp)).toEqual([]);
  });

  it('quota exceeded: a sandbox_failure carrying the API server\'s message, nothing started', async () => {
    const quotaNs = 'quota-limited';
    await core.createNamespace({ body: { metadata: { name: quotaNs } } });
    expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: quotaNs, name: 'default' }).catch(() => undefined)), 60_000)).toBe(true);
    await core.createNamespacedResourceQuota({ namespace: quotaNs, body: { metadata: { name: 'pods' }, spec: { hard: { pods: '0' } } } });
    // The quota controller (the test node) writes status.hard; until then admission refuses anyway.
    expect(await waitFor(async () => !!(await core.readNamespacedResourceQuota({ namespace: quotaNs, name: 'pods' })).status?.hard, 60_000)).toBe(true);
    const limited = provider({ defaults: { namespace: quotaNs, image: 'slipway-sandbox', workspace: 'ephemeral' } });
    const router = new SandboxProviders(new LocalSandboxProvider(), undefined, undefined, () => limited);
    const err = await createStreamSandbox(router, {
      sandboxId: 'q.s', provider: 'local', repository: repo, objectiveId: 'kube-quota', name: 'over', branch: 'slipway/kube-quota/over', base: 'main', ownerWorkflowId: 'none',
      options: { provider: 'kubernetes', kubernetes: { namespace: quotaNs, image: 'slipway-sandbox', workspace: 'ephemeral' }, confinement: 'none', network: true, copyIgnored: false, warmPool: 0 },
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApplicationFailure);
    expect((err as ApplicationFailure).type).toBe('sandbox_failure');
    expect((err as Error).message).toMatch(/exceeded quota: pods/);
    expect((await core.listNamespacedPod({ namespace: quotaNs })).items).toEqual([]);
  });

  it('a token without rights is refused naming the missing RBAC permission', async () => {
    const nobody = provider({ kubeConfig: cluster.config('nobody') });
    const err = await nobody.create(sandboxRequest(repo, 'no-rights', { group: 'kube-objective' })).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KubernetesProviderError);
    expect((err as KubernetesProviderError).kind).toBe('unauthorized');
    expect((err as Error).message).toMatch(/missing RBAC permission: (get|create) persistentvolumeclaims in namespace sandboxes/);
  });

  it('probe: a pod deleted outside Slipway is dead with reason deleted; an evicted one with reason evicted', async () => {
    const other = await p.create(sandboxRequest(repo, 'probed', { group: 'kube-objective' }));
    expect(await p.probe(other)).toEqual({ alive: true });
    const r = await record(other);
    await node.evict(NS, r.pod);
    expect(await waitFor(async () => (await p.probe(other)).alive === false, 60_000)).toBe(true);
    expect(await p.probe(other)).toMatchObject({ alive: false, reason: 'evicted' });
    await core.deleteNamespacedPod({ namespace: NS, name: r.pod, gracePeriodSeconds: 0 });
    expect(await waitFor(async () => { const l = await p.probe(other); return !l.alive && l.reason === 'deleted'; }, 60_000)).toBe(true);
    await p.destroy({ repository: repo, root: other.root });
  });

  it('suspend deletes the pod and keeps the claim; restore makes a new pod on it with the files', async () => {
    await p.writeFile(handle, 'kept.txt', 'kept');
    const before = await record(handle);
    const { snapshotRef } = await p.suspend(handle);
    expect(snapshotRef).toBe(`kubernetes:${NS}/${before.claim}`);
    expect(await waitFor(async () => !(await core.readNamespacedPod({ namespace: NS, name: before.pod }).catch(() => undefined)), 60_000)).toBe(true);
    expect((await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: before.claim! })).metadata?.deletionTimestamp).toBeUndefined();
    expect(await p.probe(handle)).toEqual({ alive: true });
    expect((await p.list(repo)).find((s) => s.root === handle.root)?.head).toBe(handle.headCommit);
    const restored = await p.restore(handle);
    expect(restored.head).toBe(handle.headCommit);
    const after = await record(handle);
    expect(after.pod).not.toBe(before.pod);
    expect((await p.readFile(handle, 'kept.txt')).toString()).toBe('kept');
  });

  it('warm pool: 12 concurrent creates never share a pod; the pool refills in the background', async () => {
    const settings = { namespace: NS, image: 'slipway-sandbox', workspace: 'ephemeral' as const };
    const pool = provider({ defaults: settings });
    expect(await pool.fillPool(NS, 'slipway-sandbox', settings, 4)).toBe(4);
    const handles = await Promise.all(Array.from({ length: 12 }, (_, i) => pool.create({ ...sandboxRequest(repo, `warm-${i}`, { group: 'kube-pool' }), warmPool: 4 })));
    const pods = await Promise.all(handles.map(record));
    expect(new Set(pods.map((r) => r.pod)).size).toBe(12);
    expect(handles.filter((h) => h.origin === 'pool')).toHaveLength(4);
    // Each sandbox is its own: its branch checked out, nothing of another's.
    for (const h of handles.slice(0, 3)) expect((await pool.exec(h, { command: 'git symbolic-ref --short HEAD', shell: true })).stdout.trim()).toBe(h.branch);
    const key = pool.poolKey(NS, 'slipway-sandbox', settings);
    const unclaimed = async () => (await core.listNamespacedPod({ namespace: NS, labelSelector: `${KUBE_LABELS.pool}=${key},${KUBE_LABELS.claimed}=false` })).items;
    expect(await waitFor(async () => (await unclaimed()).filter((p) => p.status?.phase === 'Running').length === 4, 120_000)).toBe(true);
    await Promise.all(handles.map((h) => pool.destroy({ repository: repo, root: h.root })));
    await core.deleteCollectionNamespacedPod({ namespace: NS, labelSelector: `${KUBE_LABELS.pool}=${key}` });
  }, 300_000);

  it('warm pool: a new image retires the unclaimed pods of the old one', async () => {
    const old = { namespace: NS, image: 'slipway-sandbox:old', workspace: 'ephemeral' as const };
    const next = { ...old, image: 'slipway-sandbox:new' };
    const pool = provider({ defaults: old });
    expect(await pool.fillPool(NS, old.image, old, 2)).toBe(2);
    const oldKey = pool.poolKey(NS, old.image, old);
    const podsOf = async (key: string) => (await core.listNamespacedPod({ namespace: NS, labelSelector: `${KUBE_LABELS.pool}=${key}` })).items.filter((p) => !p.metadata?.deletionTimestamp);
    expect(await podsOf(oldKey)).toHaveLength(2);
    expect(await pool.fillPool(NS, next.image, next, 1)).toBe(1);
    expect(await waitFor(async () => (await podsOf(oldKey)).length === 0, 60_000)).toBe(true);
    const newKey = pool.poolKey(NS, next.image, next);
    expect((await podsOf(newKey)).map((p) => p.spec?.containers[0].image)).toEqual(['slipway-sandbox:new']);
    await core.deleteCollectionNamespacedPod({ namespace: NS, labelSelector: `${KUBE_LABELS.pool}=${newKey}` });
  }, 180_000);

  it('the objective file takes provider: kubernetes with its section, and refuses what does not fit, naming the field', () => {
    const ok = SandboxConfigSchema.safeParse({ provider: 'kubernetes', kubernetes: { image: 'ghcr.io/acme/sandbox:1', namespace: 'ci', resources: { limits: { memory: '2Gi', cpu: '1' } }, tolerations: [{ key: 'pool', operator: 'Equal', value: 'sandbox', effect: 'NoSchedule' }] } });
    expect(ok.success, JSON.stringify(ok.error?.issues)).toBe(true);
    expect(SandboxConfigSchema.safeParse({ provider: 'kubernetes', warm_pool: 2, kubernetes: { image: 'x' } }).success).toBe(true);
    const issue = (input: unknown, at: string) => SandboxConfigSchema.safeParse(input).error?.issues.find((i) => i.path.join('.') === at)?.message;
    expect(issue({ provider: 'kubernetes' }, 'kubernetes.image')).toMatch(/required with provider: kubernetes/);
    expect(issue({ provider: 'kubernetes', kubernetes: { image: 'x', namespace: 'Bad_NS' } }, 'kubernetes.namespace')).toMatch(/DNS-1123/);
    expect(issue({ provider: 'kubernetes', kubernetes: { image: 'x', resources: { limits: { memory: 'lots' } } } }, 'kubernetes.resources.limits.memory')).toMatch(/quantity/);
    expect(issue({ provider: 'kubernetes', kubernetes: { image: 'x' }, limits: { memory_mb: 512 } }, 'limits')).toMatch(/kubernetes.resources/);
    expect(issue({ provider: 'podman', kubernetes: { image: 'x' } }, 'kubernetes')).toMatch(/provider: kubernetes only/);
  });
});

describe('kubernetes: infra/kubernetes/rbac.yaml is exactly what the provider needs', () => {
  const RBAC_NS = 'rbac-sandboxes';
  let parent: string;
  let repo: string;
  type Rule = { apiGroups: string[]; resources: string[]; verbs: string[] };
  let role: { apiVersion: string; kind: string; metadata: { name: string; namespace: string }; rules: Rule[] };
  let objects: KubernetesObjectApi;

  /** Server-side apply of the Role with these rules, as `kubectl apply --server-side` does. */
  const applyRole = async (rules: Rule[]) => {
    await objects.patch({ ...role, metadata: { ...role.metadata, namespace: RBAC_NS }, rules } as never, undefined, undefined, 'slipway-test', true, PatchStrategy.ServerSideApply);
  };

  /** Everything the provider does, with the slipway-provider token only; throws its first failure. */
  const flow = async (label: string) => {
    const p = new KubernetesSandboxProvider({ kubeConfig: cluster.config('slipway-provider'), defaults: { namespace: RBAC_NS, image: 'slipway-sandbox' }, retries: 0 });
    const w = p.watch();
    await waitFor(async () => w.stats.connected > 0 || w.stats.failures > 0, 30_000);
    if (w.stats.connected === 0) throw classifyKubeError(w.lastError, 'watching sandbox pods');
    await p.stopWatch();
    // From the warm pool (a label patch on the pod and its claim).
    await p.fillPool(RBAC_NS, 'slipway-sandbox', { namespace: RBAC_NS, image: 'slipway-sandbox' }, 1);
    const h = await p.create({ ...sandboxRequest(repo, label, { group: 'rbac' }), warmPool: 1 });
    expect(h.origin).toBe('pool');
    try {
      await p.writeFile(h, 'made.txt', 'x');
      const c = await p.exec(h, { command: 'git add made.txt && git -c user.name=t -c user.email=t@t commit -qm made && git rev-parse HEAD', shell: true });
      expect(c.exitCode, c.stderr).toBe(0);
      expect((await p.collect(h)).head).toBe(c.stdout.trim());
      expect((await p.list(repo)).map((s) => s.root)).toContain(h.root);
      expect(await p.probe(h)).toEqual({ alive: true });
      await p.suspend(h);
      await p.restore(h);
      expect((await p.readFile(h, 'made.txt')).toString()).toBe('x');
    } finally {
      await p.destroy({ repository: repo, root: h.root });
    }
  };

  beforeAll(async () => {
    parent = tempDir('kube-rbac');
    ({ repo } = makeRepo(parent));
    objects = KubernetesObjectApi.makeApiClient(admin);
    const docs = parseAllDocuments(await fs.readFile(path.join(__dirname, '..', '..', 'infra', 'kubernetes', 'rbac.yaml'), 'utf8')).map((d) => d.toJS());
    role = docs.find((d) => d.kind === 'Role');
    expect(role?.rules?.length).toBeGreaterThan(0);
    await core.createNamespace({ body: { metadata: { name: RBAC_NS } } });
    expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: RBAC_NS, name: 'default' }).catch(() => undefined)), 60_000)).toBe(true);
    // The file's binding names the workers' ServiceAccount; here the token user gets the same Role.
    const binding = docs.find((d) => d.kind === 'RoleBinding');
    await applyRole(role.rules);
    await objects.patch({ ...binding, metadata: { ...binding.metadata, namespace: RBAC_NS }, subjects: [{ kind: 'User', name: 'slipway-provider', apiGroup: 'rbac.authorization.k8s.io' }] } as never, undefined, undefined, 'slipway-test', true, PatchStrategy.ServerSideApply);
  }, 120_000);
  afterAll(async () => {
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('create, exec, files, collect, list, probe, suspend, restore, destroy and the pod watch all work with the Role alone', async () => {
    await flow('full');
  });

  it('without any one verb of the Role the provider fails, naming the missing permission', async () => {
    const missing: string[] = [];
    for (const [i, rule] of role.rules.entries()) {
      for (const verb of rule.verbs) {
        const rules = role.rules.map((r, j) => (j === i ? { ...r, verbs: r.verbs.filter((v) => v !== verb) } : r)).filter((r) => r.verbs.length > 0);
        await applyRole(rules);
        // RBAC changes reach the authorizer through its informer: wait until the refusal shows.
        let err: unknown;
        const resource = rule.resources[0];
        const needle = resource === 'pods/exec' ? 'pods/exec' : `${verb} ${resource}`;
        let attempt = 0;
        await waitFor(async () => {
          err = await flow(`drop-${verb}-${resource.replace('/', '-')}-${attempt++}`).then(() => undefined, (e: unknown) => e);
          return !!err && (err as Error).message.includes(needle);
        }, 60_000);
        expect(err, `${verb} ${resource}: ${(err as Error)?.message}`).toBeInstanceOf(KubernetesProviderError);
        expect((err as Error).message).toContain('missing RBAC permission');
        expect((err as Error).message).toContain(needle);
        missing.push(`${verb} ${resource}`);
      }
    }
    await applyRole(role.rules);
    await core.deleteCollectionNamespacedPod({ namespace: RBAC_NS, labelSelector: KUBE_LABELS.pool });
    expect(missing.length).toBe(role.rules.reduce((n, r) => n + r.verbs.length, 0));
  }, 600_000);
});

// Last in the file: it restarts the API server and loses the node.
describe('kubernetes: the pod watcher (list+watch, 410 re-list, reconnect) reports deaths with the reason and the finish time', () => {
  let parent: string;
  let repo: string;
  let p: KubernetesSandboxProvider;
  const exits: PodExit[] = [];
  const podOf = async (h: SandboxHandle) => (JSON.parse(await fs.readFile(`${h.root}.json`, 'utf8')) as { pod: string }).pod;
  const exitFor = async (pod: string) => {
    expect(await waitFor(async () => exits.some((e) => e.pod === pod), 60_000), `an exit for ${pod}; seen ${JSON.stringify(exits)}`).toBe(true);
    return exits.filter((e) => e.pod === pod);
  };

  beforeAll(async () => {
    parent = tempDir('kube-watch');
    ({ repo } = makeRepo(parent));
    p = provider();
    await p.watch((e) => exits.push(e)).synced;
  }, 60_000);
  afterAll(async () => {
    await p?.stopWatch();
    if (parent) await fs.rm(parent, { recursive: true, force: true });
  });

  it('a pod deleted behind Slipway\'s back is reported once, reason deleted; Slipway\'s own destroy is not', async () => {
    const a = await p.create(sandboxRequest(repo, 'deleted-outside', { group: 'watch' }));
    const b = await p.create(sandboxRequest(repo, 'destroyed-by-slipway', { group: 'watch' }));
    const pod = await podOf(a);
    const started = Date.now();
    await core.deleteNamespacedPod({ namespace: NS, name: pod, gracePeriodSeconds: 0 });
    const seen = await exitFor(pod);
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ reason: 'deleted', sandboxId: a.sandboxId });
    expect(seen[0].endedAtMs).toBeGreaterThanOrEqual(started - 1_000);
    expect(await p.probe(a)).toMatchObject({ alive: false, reason: 'deleted' });
    const bPod = await podOf(b);
    await p.destroy({ repository: repo, root: b.root });
    expect(await waitFor(async () => !(await core.readNamespacedPod({ namespace: NS, name: bPod }).catch(() => undefined)), 60_000)).toBe(true);
    expect(exits.filter((e) => e.pod === bPod)).toEqual([]);
    await p.destroy({ repository: repo, root: a.root });
  });

  it('eviction is reported with reason evicted and the container\'s finish time', async () => {
    const h = await p.create(sandboxRequest(repo, 'evicted', { group: 'watch' }));
    const pod = await podOf(h);
    await node.evict(NS, pod);
    const [e] = await exitFor(pod);
    expect(e.reason).toBe('evicted');
    expect(e.detail).toMatch(/evicted/);
    const live = await core.readNamespacedPod({ namespace: NS, name: pod });
    const finished = live.status?.containerStatuses?.[0].state?.terminated?.finishedAt;
    if (finished) expect(e.endedAtMs).toBe(new Date(finished).getTime());
    await p.destroy({ repository: repo, root: h.root });
  });

  it('survives an API server restart: a deletion after it is still reported', async () => {
    const h = await p.create(sandboxRequest(repo, 'after-restart', { group: 'watch' }));
    const watches = p.watch().stats.watches;
    await cluster.restart();
    const pod = await podOf(h);
    // Deleted while the watch may still be reconnecting: the re-list or the new watch sees it.
    await core.deleteNamespacedPod({ namespace: NS, name: pod, gracePeriodSeconds: 0 });
    expect((await exitFor(pod))[0].reason).toBe('deleted');
    expect(p.watch().stats.watches).toBeGreaterThan(watches);
    await p.destroy({ repository: repo, root: h.root });
  });

  it('a watch from a resourceVersion the API server no longer has gets 410 Gone, re-lists, and goes on', async () => {
    const h = await p.create(sandboxRequest(repo, 'gone', { group: 'watch' }));
    const pod = await podOf(h);
    const mine: PodExit[] = [];
    const stale = new SandboxPodWatch(admin, { namespace: NS, labelSelector: `${KUBE_LABELS.managed}=true`, onExit: (e) => mine.push(e), resourceVersion: '1' });
    try {
      expect(await waitFor(async () => stale.stats.gone > 0 && stale.stats.lists > 0, 60_000), JSON.stringify(stale.stats)).toBe(true);
      await core.deleteNamespacedPod({ namespace: NS, name: pod, gracePeriodSeconds: 0 });
      expect(await waitFor(async () => mine.some((e) => e.pod === pod && e.reason === 'deleted'), 60_000)).toBe(true);
    } finally {
      await stale.stop();
    }
    await p.destroy({ repository: repo, root: h.root });
  });

  it('one informer per namespace per worker: providers share it, it starts only while a worker holds the watchers, and its exits reach every listener', async () => {
    const watchers = new PodWatchers();
    const a = provider({ watchers });
    const b = provider({ watchers });
    const h = await a.create(sandboxRequest(repo, 'shared-informer', { group: 'watch' }));
    // No worker holds them: a create starts nothing.
    expect(watchers.ensure(admin, NS)).toBeUndefined();
    const release = watchers.hold();
    try {
      expect(await b.probe(h)).toEqual({ alive: true });
      const w = watchers.ensure(admin, NS)!;
      expect(w).toBeDefined();
      expect(a.watch()).toBe(w);
      expect(b.watch()).toBe(w);
      await w.synced;
      const seen: PodExit[] = [];
      const off = watchers.onExit((e) => seen.push(e));
      const pod = await podOf(h);
      await core.deleteNamespacedPod({ namespace: NS, name: pod });
      expect(await waitFor(async () => seen.some((e) => e.pod === pod), 60_000)).toBe(true);
      expect(seen.filter((e) => e.pod === pod)).toMatchObject([{ reason: 'deleted', group: 'watch', name: 'shared-informer' }]);
      off();
      expect(w.stats.lists).toBe(1);
    } finally {
      await release();
    }
    expect(watchers.ensure(admin, NS)).toBeUndefined();
    await a.destroy({ repository: repo, root: h.root });
  });

  it('a lost node is reported as node_lost for its pods', async () => {
    const h = await p.create(sandboxRequest(repo, 'node-lost', { group: 'watch' }));
    const pod = await podOf(h);
    await node.lose();
    const [e] = await exitFor(pod);
    expect(e.reason).toBe('node_lost');
    expect(await p.probe(h)).toMatchObject({ alive: false, reason: 'node_lost' });
  });
});
