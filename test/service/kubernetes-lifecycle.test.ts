/**
 * The sandbox service on Kubernetes (`provider: kubernetes` profiles, ADR 0020): the lifecycle
 * every provider passes (provider-suites.ts): create, exec and files, idle suspend (the pod
 * deleted, its claim kept), woken by exec on a new pod with its files, DELETE. Real Postgres,
 * real Temporal, real HTTP, a real kube-apiserver with the test node (docs/kubernetes-test-node.md).
 * The host's probe pass is off (watchIntervalMs 0): a pod's death reaches its sandbox only through
 * the worker's pod informer.
 */
import { promises as fs } from 'node:fs';
import { expect, it } from 'vitest';
import { CoreV1Api } from '@kubernetes/client-node';
import { defaultProviderFor } from '../../activities/service/providers';
import { createSandboxServiceActivities } from '../../activities/service';
import { serviceSandboxWorkflowId } from '../../core/sandbox-service';
import { KUBE_LABELS } from '../../core/kubernetes';
import { startKubeCluster, type KubeCluster } from '../helpers/kube-cluster';
import { startTestNode, type TestNode } from '../helpers/kube-node';
import { waitFor } from '../sandbox/helpers';
import { describeProviderLifecycle } from '../sandbox/provider-suites';

const NS = 'service';
let cluster: KubeCluster;
let node: TestNode;
let core: CoreV1Api;

const recordOf = async (root: string) => JSON.parse(await fs.readFile(`${root}.json`, 'utf8').catch(() => 'null')) as { pod: string; claim?: string; state: string } | null;

describeProviderLifecycle('kubernetes', {
  provider: 'kubernetes',
  before: async () => {
    cluster = await startKubeCluster();
    node = await startTestNode(cluster);
    core = cluster.config('admin').makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: NS } } });
    if (!(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 60_000))) throw new Error('no default ServiceAccount');
  },
  after: async () => {
    await node?.stop();
    await cluster?.stop();
  },
  providerFor: () => defaultProviderFor({ kubernetes: { kubeConfig: cluster.config('admin'), defaults: { namespace: NS, image: 'slipway-sandbox' } } }),
  resources: { memory_mb: 256 },
  onReady: async (root) => {
    const r = (await recordOf(root))!;
    const pod = await core.readNamespacedPod({ namespace: NS, name: r.pod });
    expect(pod.metadata?.labels?.[KUBE_LABELS.managed]).toBe('true');
    expect(pod.spec?.containers[0].resources?.limits?.memory).toBe(String(256 * 1024 * 1024));
  },
  // Running: its pod runs; stopped: no pod, the claim kept; gone: neither, nor the record.
  state: async (root) => {
    const r = await recordOf(root);
    if (!r) return 'gone';
    const pod = await core.readNamespacedPod({ namespace: NS, name: r.pod }).catch(() => undefined);
    const claim = r.claim ? await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: r.claim }).catch(() => undefined) : undefined;
    if (pod?.status?.phase === 'Running' && !pod.metadata?.deletionTimestamp) return 'running';
    if (r.state === 'suspended' && claim) return 'stopped';
    throw new Error(`sandbox at ${root}: record ${r.state}, pod ${pod?.status?.phase ?? 'none'}, claim ${claim ? 'kept' : 'none'}`);
  },
  firstExec: { script: 'pwd; grep CapEff /proc/self/status', expected: '/workspace\nCapEff:\t0000000000000000\n' },
  harness: { watchIntervalMs: 0 },
  more: (harness, root) => {
    it("a pod deleted behind Slipway's back ends its sandbox with reason deleted, compute closed at the pod's deletion time, pushed by the pod informer (no probe pass runs)", async () => {
      const h = harness();
      const a = await h.account();
      await a.profile({ name: 'kube-watched', provider: 'kubernetes', idleTimeoutSeconds: 3600, resources: { memory_mb: 256 } });
      const { id } = await a.api.create({ profile: 'kube-watched' });
      expect(await a.api.get(id, 60)).toMatchObject({ status: 'ready' });
      const r = (await recordOf(await root(id)))!;
      // The API server stamps deletions to the second: delete in a later second than compute opened, so the stamp is after it.
      const opened = new Date((await h.sessions(id)).find((s) => s.kind === 'compute')!.started_at).getTime();
      await waitFor(async () => Date.now() > opened + 1_100, 10_000);
      // As `kubectl delete pod` does: a graceful deletion (the pod's 5 s), stamped by the API server.
      const deleted = await core.deleteNamespacedPod({ namespace: NS, name: r.pod });
      const deletedAtMs = new Date(deleted.metadata!.deletionTimestamp!).getTime() - (deleted.metadata!.deletionGracePeriodSeconds ?? 0) * 1000;
      const done = await h.waitFor(a.api, id, ['terminated'], 60_000);
      expect(done.end_reason).toBe('deleted');
      const sessions = await h.sessions(id);
      const compute = sessions.filter((s) => s.kind === 'compute');
      expect(compute).toHaveLength(1);
      expect(compute[0].end_reason).toBe('deleted');
      expect(new Date(compute[0].ended_at!).getTime()).toBe(deletedAtMs);
      expect(sessions.every((s) => s.ended_at !== null)).toBe(true);
      // The claim and record go with the sandbox, as on any end.
      expect(await waitFor(async () => (await recordOf(await root(id))) === null, 60_000)).toBe(true);
    });

    it("a profile's kubernetes section places and sizes its pods (namespace, resources, storage, labels) over the worker's defaults; a bad section is refused naming the field", async () => {
      const h = harness();
      const a = await h.account();
      const other = 'service-own';
      await core.createNamespace({ body: { metadata: { name: other } } });
      expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: other, name: 'default' }).catch(() => undefined)), 60_000)).toBe(true);
      await expect(a.profile({ name: 'kube-bad', provider: 'kubernetes', kubernetes: { namespace: 'Not_A_Namespace' } })).rejects.toThrow(/^kubernetes\.namespace: must be a DNS-1123 label/);
      await expect(a.profile({ name: 'pod-bad', provider: 'podman', kubernetes: { image: 'x' } })).rejects.toThrow(/^kubernetes: applies to provider: kubernetes only/);
      await a.profile({
        name: 'kube-own',
        provider: 'kubernetes',
        idleTimeoutSeconds: 3600,
        kubernetes: { namespace: other, resources: { requests: { memory: '200Mi' }, limits: { memory: '300Mi', cpu: '1' } }, storage: '2Gi', labels: { team: 'blue' } },
      });
      const { id } = await a.api.create({ profile: 'kube-own' });
      expect(await a.api.get(id, 60)).toMatchObject({ status: 'ready' });
      const r = (await recordOf(await root(id)))! as { pod: string; claim?: string; namespace?: string };
      expect(r.namespace).toBe(other);
      const pod = await core.readNamespacedPod({ namespace: other, name: r.pod });
      expect(JSON.parse(JSON.stringify(pod.spec?.containers[0].resources))).toEqual({ requests: { memory: '200Mi', cpu: '1' }, limits: { memory: '300Mi', cpu: '1' } }); // a missing request defaults to its limit (the API server)
      expect(pod.metadata?.labels?.team).toBe('blue');
      // The worker's default image (no image in the section) made it.
      expect(pod.spec?.containers[0].image).toBe('slipway-sandbox');
      const claim = await core.readNamespacedPersistentVolumeClaim({ namespace: other, name: r.claim! });
      expect(claim.spec?.resources?.requests?.storage).toBe('2Gi');
      expect((await a.api.exec(id, { command: 'sh', args: ['-c', 'pwd'] })).stdout).toBe('/workspace\n');
      await a.api.destroy(id);
      await h.waitFor(a.api, id, ['terminated'], 60_000);
      expect(await waitFor(async () => !(await core.readNamespacedPod({ namespace: other, name: r.pod }).catch(() => undefined)), 60_000)).toBe(true);
    });

    it('the reaper closes a sandbox whose workflow is gone and deletes its dead pod and its claim (found by label), in one tick', async () => {
      const h = harness();
      const a = await h.account();
      await a.profile({ name: 'kube-reaped', provider: 'kubernetes', idleTimeoutSeconds: 3600, resources: { memory_mb: 256 } });
      const { id } = await a.api.create({ profile: 'kube-reaped' });
      expect(await a.api.get(id, 60)).toMatchObject({ status: 'ready' });
      const dir = await root(id);
      const r = (await recordOf(dir))!;
      // The workflow dies without cleaning up: the pod, the claim and the open rows stay.
      await h.host.client.workflow.getHandle(serviceSandboxWorkflowId(id)).terminate('test: a workflow lost');
      // And its pod died meanwhile (evicted: Failed, still there), so no listing of live sandboxes finds it.
      await node.evict(NS, r.pod);
      const reaper = createSandboxServiceActivities({ db: h.database.db, providerFor: defaultProviderFor({ kubernetes: { kubeConfig: cluster.config('admin'), defaults: { namespace: NS, image: 'slipway-sandbox' } } }), client: h.host.client });
      const tick = await reaper.reapSandboxes({ orphanGraceMs: 0 });
      expect(tick.closedOrphans).toContain(id);
      expect(tick.removedLeftovers).toContain(dir);
      expect(await waitFor(async () => !(await core.readNamespacedPod({ namespace: NS, name: r.pod }).catch(() => undefined)), 60_000)).toBe(true);
      expect(await waitFor(async () => !(await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: r.claim! }).catch(() => undefined)), 60_000)).toBe(true);
      expect(await recordOf(dir)).toBeNull();
      expect((await h.sessions(id)).every((s) => s.ended_at !== null && s.end_reason === 'orphaned')).toBe(true);
    });
  },
});
