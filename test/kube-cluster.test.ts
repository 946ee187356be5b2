/**
 * The test control plane itself (test/helpers/kube-cluster.ts, ADR 0021): a real etcd and
 * kube-apiserver with static tokens and RBAC. Fails (never skips) when a binary is missing.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CoreV1Api } from '@kubernetes/client-node';
import { startKubeCluster, type KubeCluster } from './helpers/kube-cluster';
import { waitFor } from './sandbox/helpers';

let cluster: KubeCluster;

beforeAll(async () => {
  cluster = await startKubeCluster();
});

afterAll(async () => {
  await cluster?.stop();
});

describe('kube-cluster', () => {
  it('serves the API over TLS with the CA it reports; admin (system:masters) lists namespaces', async () => {
    expect(cluster.server).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
    const core = cluster.config('admin').makeApiClient(CoreV1Api);
    const names = (await core.listNamespace()).items.map((n) => n.metadata?.name);
    expect(names).toEqual(expect.arrayContaining(['default', 'kube-system']));
  });

  it("RBAC is on: 'nobody' is authenticated but forbidden, a wrong token is unauthorized", async () => {
    const nobody = cluster.config('nobody').makeApiClient(CoreV1Api);
    await expect(nobody.listNamespace()).rejects.toMatchObject({ code: 403 });
    const provider = cluster.config('slipway-provider').makeApiClient(CoreV1Api);
    await expect(provider.listNamespacedPod({ namespace: 'default' })).rejects.toMatchObject({ code: 403 });
    const kc = cluster.config('nobody');
    kc.users[0] = { ...kc.users[0], token: 'not-a-token' } as (typeof kc.users)[0];
    await expect(kc.makeApiClient(CoreV1Api).listNamespace()).rejects.toMatchObject({ code: 401 });
    expect(() => cluster.token('nobody-else')).toThrow(/no token user 'nobody-else'/);
  });

  it("a new namespace gets its 'default' ServiceAccount and kube-root-ca.crt (the controllers the harness plays)", async () => {
    const core = cluster.config('admin').makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: 'kc-sa' } } });
    expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: 'kc-sa', name: 'default' }).catch(() => undefined)), 30_000)).toBe(true);
    // The harness's controller makes the ConfigMap just after the ServiceAccount: wait for it too.
    expect(await waitFor(async () => !!(await core.readNamespacedConfigMap({ namespace: 'kc-sa', name: 'kube-root-ca.crt' }).catch(() => undefined)), 30_000)).toBe(true);
    const ca = await core.readNamespacedConfigMap({ namespace: 'kc-sa', name: 'kube-root-ca.crt' });
    expect(ca.data?.['ca.crt']).toBe(Buffer.from(cluster.caData, 'base64').toString('utf8'));
    // The ServiceAccount admission plugin is real: a pod naming a missing account is refused.
    await expect(
      core.createNamespacedPod({ namespace: 'kc-sa', body: { metadata: { name: 'p' }, spec: { serviceAccountName: 'missing', containers: [{ name: 'c', image: 'x' }] } } }),
    ).rejects.toMatchObject({ code: 403, body: expect.stringContaining('error looking up service account kc-sa/missing') });
  });

  it('restart() restarts the API server only: data in etcd survives, and namespaces made after it still get their ServiceAccount', async () => {
    const core = cluster.config('admin').makeApiClient(CoreV1Api);
    await core.createNamespacedConfigMap({ namespace: 'default', body: { metadata: { name: 'kept' }, data: { a: '1' } } });
    await cluster.restart();
    const after = cluster.config('admin').makeApiClient(CoreV1Api);
    expect((await after.readNamespacedConfigMap({ namespace: 'default', name: 'kept' })).data).toEqual({ a: '1' });
    await after.createNamespace({ body: { metadata: { name: 'kc-after-restart' } } });
    expect(await waitFor(async () => !!(await after.readNamespacedServiceAccount({ namespace: 'kc-after-restart', name: 'default' }).catch(() => undefined)), 30_000)).toBe(true);
  });
});
