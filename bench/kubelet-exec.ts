/**
 * Exec round trip of `true` through the real kube-apiserver to the test node's kubelet stand-in
 * (test/helpers/kubelet-exec.ts, started by the test node), side by side in one run with `podman exec` of the same
 * command in the same container (what the stand-in itself runs): the difference is what the
 * API server's path costs (WebSocket, authn/authz, SPDY to the kubelet, TLS both ways).
 *   npx tsx bench/kubelet-exec.ts [--quick]
 */
import { execFileSync } from 'node:child_process';
import { Writable } from 'node:stream';
import { CoreV1Api, Exec, type V1Status } from '@kubernetes/client-node';
import { defaultSandboxImage, engineEnv, execWrapper, newExecId } from '../activities/sandbox/container';
import { startKubeCluster } from '../test/helpers/kube-cluster';
import { startTestNode } from '../test/helpers/kube-node';
import { waitFor } from '../test/sandbox/helpers';

const n = process.argv.includes('--quick') ? 5 : 30;
const podman = (...args: string[]) => execFileSync('podman', args, { env: engineEnv(), encoding: 'utf8' }).trim();
const devNull = () => new Writable({ write: (_c, _e, cb) => cb() });

(async () => {
  const image = defaultSandboxImage();
  if (!image) throw new Error('no sandbox image: bash scripts/setup.sh builds it');
  const cluster = await startKubeCluster();
  const node = await startTestNode(cluster, { images: { sandbox: image } });
  try {
    const kc = cluster.config('admin');
    const core = kc.makeApiClient(CoreV1Api);
    // The namespace's ServiceAccount comes from the harness's controller.
    if (!(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: 'default', name: 'default' }).catch(() => undefined)), 60_000))) throw new Error('no default ServiceAccount');
    await core.createNamespacedPod({ namespace: 'default', body: { metadata: { name: 'bench' }, spec: { containers: [{ name: 'main', image: 'sandbox', command: ['sleep', 'infinity'] }] } } });
    if (!(await waitFor(async () => (await core.readNamespacedPod({ namespace: 'default', name: 'bench' })).status?.phase === 'Running', 120_000))) throw new Error('the bench pod never ran');
    const container = node.containerName('default', 'bench', 'main');
    if (!container) throw new Error('the node runs no container for the bench pod');
    const exec = new Exec(kc);
    const viaApi = () =>
      new Promise<void>((resolve, reject) => {
        void exec.exec('default', 'bench', 'main', ['true'], devNull(), devNull(), null, false, (s: V1Status) => (s.status === 'Success' ? resolve() : reject(new Error(JSON.stringify(s))))).catch(reject);
      });
    const direct = () => podman('exec', container, ...execWrapper(newExecId(), ['true']));
    const time = async (f: () => unknown) => {
      await f();
      const t0 = performance.now();
      for (let i = 0; i < n; i++) await f();
      return (performance.now() - t0) / n;
    };
    // Interleaved, twice, so load on the machine falls on both alike.
    const a1 = await time(direct);
    const b1 = await time(viaApi);
    const a2 = await time(direct);
    const b2 = await time(viaApi);
    const a = (a1 + a2) / 2;
    const b = (b1 + b2) / 2;
    console.log(`podman exec (the stand-in's own work): ${a.toFixed(1)} ms per exec of true`);
    console.log(`through kube-apiserver (client-node Exec, WebSocket -> SPDY/3.1 -> podman exec): ${b.toFixed(1)} ms per exec of true`);
    console.log(`API server path: +${(b - a).toFixed(1)} ms (${(b / a).toFixed(2)}x), ${n} runs x 2`);
  } finally {
    await node.stop();
    await cluster.stop();
  }
})().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
