/**
 * Objectives end to end with Kubernetes sandboxes (`sandbox: { provider: kubernetes }`, ADR 0020):
 * every stream builds, runs its gates and is reviewed in a pod of the test cluster (real
 * kube-apiserver, the test node: docs/kubernetes-test-node.md), started from a git bundle; its
 * work comes back as a bundle and the merge queue merges it. Real Temporal, real git, real
 * API server, podman under the test node. The worker finds the cluster through KUBECONFIG.
 */
import { CoreV1Api, type V1Pod } from '@kubernetes/client-node';
import { KUBE_LABELS } from '../core/kubernetes';
import { informer, startKubeCluster, type Informer, type KubeCluster } from './helpers/kube-cluster';
import { startTestNode, type TestNode } from './helpers/kube-node';
import { waitFor } from './sandbox/helpers';
import { describeProviderObjective } from './sandbox/provider-suites';

const NS = 'objectives';
let cluster: KubeCluster;
let node: TestNode;
let pods: Informer<V1Pod>;

describeProviderObjective('kubernetes', {
  sandbox: { provider: 'kubernetes', kubernetes: { image: 'slipway-sandbox', namespace: NS } },
  noun: 'pods',
  // The stream pods of an objective, as the API server has them (labelled with its id), not being deleted.
  sandboxesOf: (objectiveId) => pods.list().filter((p) => p.metadata?.labels?.[KUBE_LABELS.group] === objectiveId && !p.metadata?.deletionTimestamp).map((p) => p.metadata!.name!),
  before: async () => {
    cluster = await startKubeCluster();
    node = await startTestNode(cluster);
    const admin = cluster.config('admin');
    const core = admin.makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: NS } } });
    if (!(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 60_000))) throw new Error('no default ServiceAccount');
    pods = informer<V1Pod>(admin, `/api/v1/namespaces/${NS}/pods`, () => core.listNamespacedPod({ namespace: NS }), () => undefined);
    return { KUBECONFIG: cluster.kubeconfig('admin') };
  },
  after: async () => {
    pods?.stop();
    await node?.stop();
    await cluster?.stop();
  },
});
