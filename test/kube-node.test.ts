/**
 * The test node (test/helpers/kube-node.ts, ADR 0021) against the real API server: pods are
 * scheduled, run with podman, report their status, are deleted and evicted as on a real node.
 */
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Writable } from 'node:stream';
import { CoreV1Api, Exec, type V1Pod, type V1Status } from '@kubernetes/client-node';
import { engineEnv } from '../activities/sandbox/container';
import { startKubeCluster, type KubeCluster } from './helpers/kube-cluster';
import { scalar, startTestNode, unschedulableMessage, type TestNode } from './helpers/kube-node';
import { waitFor } from './sandbox/helpers';

let cluster: KubeCluster;
let node: TestNode;
let core: CoreV1Api;
const NS = 'kn';

beforeAll(async () => {
  cluster = await startKubeCluster();
  node = await startTestNode(cluster, { labels: { pool: 'sandboxes' } });
  core = cluster.config('admin').makeApiClient(CoreV1Api);
  await core.createNamespace({ body: { metadata: { name: NS } } });
  await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 30_000);
});

afterAll(async () => {
  await node?.stop();
  await cluster?.stop();
});

async function podUntil(name: string, check: (p: V1Pod) => boolean, timeoutMs = 90_000, namespace = NS): Promise<V1Pod> {
  let last: V1Pod | undefined;
  const ok = await waitFor(async () => {
    last = await core.readNamespacedPod({ namespace, name }).catch(() => undefined);
    return !!last && check(last);
  }, timeoutMs);
  if (!ok) throw new Error(`pod ${namespace}/${name} never got there; last status: ${JSON.stringify(last?.status)}`);
  return last!;
}

const containerExists = (container: string) => {
  try {
    execFileSync('podman', ['container', 'exists', container], { env: engineEnv() });
    return true;
  } catch {
    return false;
  }
};

function pod(name: string, spec: Partial<NonNullable<V1Pod['spec']>> & { command?: string[]; env?: Array<{ name: string; value: string }>; limits?: Record<string, string> }): V1Pod {
  const { command, env, limits, ...rest } = spec;
  return {
    metadata: { name },
    spec: {
      restartPolicy: 'Never',
      containers: [{ name: 'main', image: 'slipway-sandbox', command, env, resources: limits ? { limits, requests: limits } : undefined }],
      ...rest,
    },
  };
}

describe('kube-node', () => {
  it('parses resource quantities', () => {
    expect(scalar('500m')).toBe(0.5);
    expect(scalar('64Mi')).toBe(64 * 2 ** 20);
    expect(scalar('2')).toBe(2);
    expect(() => scalar('12parsecs')).toThrow(/not a resource quantity/);
    expect(unschedulableMessage([])).toBe('no nodes available to schedule pods');
  });

  it('registers a Ready node with its labels, InternalIP 127.0.0.1 and a heartbeat', async () => {
    const n = await core.readNode({ name: node.name });
    expect(n.metadata?.labels).toMatchObject({ pool: 'sandboxes', 'kubernetes.io/hostname': node.name });
    expect(n.status?.addresses).toContainEqual({ type: 'InternalIP', address: '127.0.0.1' });
    expect(n.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
  });

  it('a pod runs its command (env, workingDir, service-account token mounted) and ends Succeeded; a failing one ends Failed with its exit code', async () => {
    await core.createNamespacedPod({
      namespace: NS,
      body: pod('ok', {
        command: ['sh', '-c', 'test "$FOO" = bar && test "$(pwd)" = /tmp && test -s /var/run/secrets/kubernetes.io/serviceaccount/token && test "$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)" = kn'],
        env: [{ name: 'FOO', value: 'bar' }],
        nodeSelector: { pool: 'sandboxes' },
        containers: [
          {
            name: 'main',
            image: 'slipway-sandbox',
            command: ['sh', '-c', 'test "$FOO" = bar && test "$(pwd)" = /tmp && test -s /var/run/secrets/kubernetes.io/serviceaccount/token && test "$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)" = kn'],
            env: [{ name: 'FOO', value: 'bar' }],
            workingDir: '/tmp',
          },
        ],
      }),
    });
    const ok = await podUntil('ok', (p) => p.status?.phase === 'Succeeded' || p.status?.phase === 'Failed');
    expect(ok.spec?.nodeName).toBe(node.name);
    expect(ok.status?.phase).toBe('Succeeded');
    expect(ok.status?.containerStatuses?.[0].state?.terminated).toMatchObject({ exitCode: 0, reason: 'Completed' });
    expect(ok.status?.podIP).toMatch(/^\d+\.\d+\.\d+\.\d+$/);

    await core.createNamespacedPod({ namespace: NS, body: pod('bad', { command: ['sh', '-c', 'exit 3'] }) });
    const bad = await podUntil('bad', (p) => p.status?.phase === 'Failed' || p.status?.phase === 'Succeeded');
    expect(bad.status?.phase).toBe('Failed');
    expect(bad.status?.containerStatuses?.[0].state?.terminated).toMatchObject({ exitCode: 3, reason: 'Error' });
  });

  it('a running pod is Ready; a pod over its memory limit ends OOMKilled', async () => {
    await core.createNamespacedPod({ namespace: NS, body: pod('sleeper', { command: ['sleep', 'infinity'] }) });
    const running = await podUntil('sleeper', (p) => p.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True');
    expect(running.status?.phase).toBe('Running');
    expect(running.status?.containerStatuses?.[0]).toMatchObject({ ready: true, started: true, state: { running: {} } });

    // tail holds /dev/zero's one endless line in memory.
    await core.createNamespacedPod({ namespace: NS, body: pod('oom', { command: ['tail', '/dev/zero'], limits: { memory: '32Mi', cpu: '1' } }) });
    const oom = await podUntil('oom', (p) => p.status?.phase === 'Failed' || p.status?.phase === 'Succeeded');
    expect(oom.status?.phase).toBe('Failed');
    expect(oom.status?.containerStatuses?.[0].state?.terminated).toMatchObject({ reason: 'OOMKilled', exitCode: 137 });
  });

  it('a pod whose nodeSelector no node matches, or whose taints it does not tolerate, is Unschedulable with the scheduler message', async () => {
    await core.createNamespacedPod({ namespace: NS, body: pod('nowhere', { command: ['true'], nodeSelector: { pool: 'gpus' } }) });
    const p = await podUntil('nowhere', (x) => x.status?.conditions?.some((c) => c.type === 'PodScheduled' && c.status === 'False') ?? false);
    expect(p.spec?.nodeName).toBeUndefined();
    expect(p.status?.conditions?.find((c) => c.type === 'PodScheduled')).toMatchObject({
      reason: 'Unschedulable',
      message: "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.",
    });

    const tainted = await startTestNode(cluster, { labels: { pool: 'tainted' }, taints: [{ key: 'slipway.dev/sandbox', value: 'true', effect: 'NoSchedule' }] });
    try {
      await core.createNamespacedPod({ namespace: NS, body: pod('untolerated', { command: ['true'], nodeSelector: { pool: 'tainted' } }) });
      const u = await podUntil('untolerated', (x) => x.status?.conditions?.some((c) => c.type === 'PodScheduled' && c.status === 'False') ?? false);
      expect(u.status?.conditions?.find((c) => c.type === 'PodScheduled')?.message).toMatch(
        /^0\/2 nodes are available: 1 node\(s\) didn't match Pod's node affinity\/selector, 1 node\(s\) had untolerated taint \{slipway\.dev\/sandbox: true\}\./,
      );
      await core.createNamespacedPod({
        namespace: NS,
        body: pod('tolerated', { command: ['true'], nodeSelector: { pool: 'tainted' }, tolerations: [{ key: 'slipway.dev/sandbox', operator: 'Equal', value: 'true', effect: 'NoSchedule' }] }),
      });
      const t = await podUntil('tolerated', (x) => x.status?.phase === 'Succeeded');
      expect(t.spec?.nodeName).toBe(tainted.name);
    } finally {
      await tainted.stop();
    }
  });

  it("pods/exec reaches the pod's container through the API server and the node's kubelet endpoint", async () => {
    await core.createNamespacedPod({ namespace: NS, body: pod('execd', { command: ['sleep', 'infinity'] }) });
    await podUntil('execd', (p) => p.status?.phase === 'Running');
    const out: Buffer[] = [];
    const sink = new Writable({ write: (chunk, _e, cb) => (out.push(Buffer.from(chunk)), cb()) });
    const status = await new Promise<V1Status>((resolve, reject) => {
      void new Exec(cluster.config('admin')).exec(NS, 'execd', 'main', ['sh', '-c', 'uname -n; exit 4'], sink, sink, null, false, resolve).catch(reject);
    });
    expect(Buffer.concat(out).toString('utf8')).toBe('execd\n');
    expect(status).toMatchObject({ status: 'Failure', reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '4' }] } });
  });

  it('deleting a pod kills its container, then the pod is gone', async () => {
    await core.createNamespacedPod({ namespace: NS, body: pod('doomed', { command: ['sleep', 'infinity'] }) });
    await podUntil('doomed', (p) => p.status?.phase === 'Running');
    const container = node.containerName(NS, 'doomed', 'main');
    expect(container).toBeTruthy();
    expect(containerExists(container!)).toBe(true);
    await core.deleteNamespacedPod({ namespace: NS, name: 'doomed', gracePeriodSeconds: 1 });
    expect(await waitFor(async () => (await core.readNamespacedPod({ namespace: NS, name: 'doomed' }).catch((e) => e.code)) === 404, 60_000)).toBe(true);
    // The kubelet deletes the pod object only after its containers are gone.
    expect(containerExists(container!)).toBe(false);
  });

  it("a claim is Bound; its data outlives the pod that wrote it and reaches the next pod", async () => {
    await core.createNamespacedPersistentVolumeClaim({
      namespace: NS,
      body: { metadata: { name: 'work' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } },
    });
    expect(await waitFor(async () => (await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: 'work' })).status?.phase === 'Bound', 30_000)).toBe(true);
    const withClaim = (name: string, script: string): V1Pod => ({
      metadata: { name },
      spec: {
        restartPolicy: 'Never',
        volumes: [{ name: 'w', persistentVolumeClaim: { claimName: 'work' } }],
        containers: [{ name: 'main', image: 'slipway-sandbox', command: ['sh', '-c', script], volumeMounts: [{ name: 'w', mountPath: '/work' }] }],
      },
    });
    await core.createNamespacedPod({ namespace: NS, body: withClaim('writer', 'echo kept > /work/f') });
    expect((await podUntil('writer', (p) => p.status?.phase === 'Succeeded' || p.status?.phase === 'Failed')).status?.phase).toBe('Succeeded');
    await core.deleteNamespacedPod({ namespace: NS, name: 'writer', gracePeriodSeconds: 0 });
    expect(await waitFor(async () => (await core.readNamespacedPod({ namespace: NS, name: 'writer' }).catch((e) => e.code)) === 404, 60_000)).toBe(true);
    await core.createNamespacedPod({ namespace: NS, body: withClaim('reader', 'test "$(cat /work/f)" = kept') });
    expect((await podUntil('reader', (p) => p.status?.phase === 'Succeeded' || p.status?.phase === 'Failed')).status?.phase).toBe('Succeeded');
    // Deleted once no pod uses it: the claim goes (pvc-protection released), and its volume after it.
    await core.deleteNamespacedPod({ namespace: NS, name: 'reader', gracePeriodSeconds: 0 });
    const pv = (await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: 'work' })).spec!.volumeName!;
    await core.deleteNamespacedPersistentVolumeClaim({ namespace: NS, name: 'work' });
    expect(await waitFor(async () => (await core.readPersistentVolume({ name: pv }).catch((e) => e.code)) === 404, 60_000)).toBe(true);
  });

  it('evict() fails the pod with reason Evicted and kills its container', async () => {
    await core.createNamespacedPod({ namespace: NS, body: pod('evictee', { command: ['sleep', 'infinity'] }) });
    await podUntil('evictee', (p) => p.status?.phase === 'Running');
    const container = node.containerName(NS, 'evictee', 'main')!;
    await node.evict(NS, 'evictee');
    const p = await core.readNamespacedPod({ namespace: NS, name: 'evictee' });
    expect(p.status).toMatchObject({ phase: 'Failed', reason: 'Evicted' });
    expect(p.status?.conditions?.find((c) => c.type === 'DisruptionTarget')).toMatchObject({ status: 'True', reason: 'TerminationByKubelet' });
    expect(containerExists(container)).toBe(false);
  });

  it('a ResourceQuota gets its status; a pod over it is refused by the API server, and fits again once the first is gone', async () => {
    await core.createNamespace({ body: { metadata: { name: 'kn-quota' } } });
    await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: 'kn-quota', name: 'default' }).catch(() => undefined)), 30_000);
    await core.createNamespacedResourceQuota({ namespace: 'kn-quota', body: { metadata: { name: 'q' }, spec: { hard: { pods: '1' } } } });
    expect(await waitFor(async () => (await core.readNamespacedResourceQuota({ namespace: 'kn-quota', name: 'q' })).status?.used?.pods === '0', 30_000)).toBe(true);
    await core.createNamespacedPod({ namespace: 'kn-quota', body: pod('one', { command: ['sleep', 'infinity'] }) });
    await expect(core.createNamespacedPod({ namespace: 'kn-quota', body: pod('two', { command: ['true'] }) })).rejects.toMatchObject({
      code: 403,
      body: expect.stringContaining('exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1'),
    });
    await core.deleteNamespacedPod({ namespace: 'kn-quota', name: 'one', gracePeriodSeconds: 0 });
    expect(
      await waitFor(async () => !!(await core.createNamespacedPod({ namespace: 'kn-quota', body: pod('two', { command: ['true'] }) }).catch(() => undefined)), 60_000),
    ).toBe(true);
  });

  it('lose(): the node goes Ready=Unknown with the unreachable taints, its pods Ready=False with reason NodeLost', async () => {
    const doomed = await startTestNode(cluster, { labels: { pool: 'lost' } });
    try {
      await core.createNamespacedPod({ namespace: NS, body: pod('on-lost', { command: ['sleep', 'infinity'], nodeSelector: { pool: 'lost' } }) });
      await podUntil('on-lost', (p) => p.status?.phase === 'Running');
      await doomed.lose();
      const p = await core.readNamespacedPod({ namespace: NS, name: 'on-lost' });
      expect(p.status?.reason).toBe('NodeLost');
      expect(p.status?.conditions?.find((c) => c.type === 'Ready')).toMatchObject({ status: 'False', reason: 'NodeLost' });
      const n = await core.readNode({ name: doomed.name });
      expect(n.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('Unknown');
      expect(n.spec?.taints?.map((t) => `${t.key}:${t.effect}`)).toEqual(expect.arrayContaining(['node.kubernetes.io/unreachable:NoSchedule', 'node.kubernetes.io/unreachable:NoExecute']));
    } finally {
      await doomed.stop();
    }
  });

  it('stop() while a pod is being started leaves no podman pod or container of the node behind', async () => {
    // The podman pod of a starting pod is held until stop() has listed the node's pods: the
    // order in which a listing-only stop() left it behind.
    let listed!: () => void;
    const afterListing = new Promise<void>((r) => (listed = r));
    let creating!: () => void;
    const startCreating = new Promise<void>((r) => (creating = r));
    const racing = await startTestNode(cluster, {
      labels: { pool: 'racing' },
      interceptPodman: async (args, run) => {
        if (args[0] === 'pod' && args[1] === 'create') {
          creating();
          await afterListing;
          return run();
        }
        const r = await run();
        if (args[0] === 'pod' && args[1] === 'ps') listed();
        return r;
      },
    });
    let stopped = false;
    try {
      await core.createNamespacedPod({ namespace: NS, body: pod('mid-start', { command: ['sleep', 'infinity'], nodeSelector: { pool: 'racing' } }) });
      await startCreating;
      await racing.stop();
      stopped = true;
      const left = (what: string[]) => execFileSync('podman', [...what, '--filter', `label=slipway-test-node=${racing.name}`], { env: engineEnv(), encoding: 'utf8' }).trim();
      expect(left(['pod', 'ps', '-q'])).toBe('');
      expect(left(['ps', '-aq'])).toBe('');
    } finally {
      listed();
      if (!stopped) await racing.stop();
      await core.deleteNamespacedPod({ namespace: NS, name: 'mid-start', gracePeriodSeconds: 0 }).catch(() => undefined);
    }
  });
});
