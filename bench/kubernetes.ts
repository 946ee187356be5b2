/**
 * Kubernetes sandboxes (ADR 0020) side by side with local and podman ones, in one run, on the
 * test control plane (real kube-apiserver, the test node: test/helpers/kube-node.ts):
 *   - create to ready: kubernetes cold (pod + claim scheduled, run by the node, bundle in),
 *     kubernetes from the warm pool (a label patch, bundle in), podman cold, local cold;
 *   - exec round trip of `true` through each provider's exec.
 * Ratios, never absolute goals (the machine is shared).
 *   npx tsx bench/kubernetes.ts [--quick]
 */
import { promises as fs } from 'node:fs';
import { CoreV1Api } from '@kubernetes/client-node';
import { ContainerSandboxProvider, defaultSandboxImage } from '../activities/sandbox/container';
import { KubernetesSandboxProvider } from '../activities/sandbox/kubernetes';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import type { SandboxHandle, SandboxProvider } from '../activities/sandbox/provider';
import { startKubeCluster } from '../test/helpers/kube-cluster';
import { startTestNode } from '../test/helpers/kube-node';
import { makeRepo, sandboxRequest, tempDir, waitFor } from '../test/sandbox/helpers';

const quick = process.argv.includes('--quick');
const creates = quick ? 2 : 5;
const execs = quick ? 5 : 20;
const NS = 'bench';

(async () => {
  if (!defaultSandboxImage()) throw new Error('no sandbox image: bash scripts/setup.sh builds it');
  const cluster = await startKubeCluster();
  const node = await startTestNode(cluster);
  const parent = tempDir('bench-kube');
  const { repo } = makeRepo(parent);
  const made: Array<[SandboxProvider, SandboxHandle]> = [];
  try {
    const kc = cluster.config('admin');
    const core = kc.makeApiClient(CoreV1Api);
    await core.createNamespace({ body: { metadata: { name: NS } } });
    if (!(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 60_000))) throw new Error('no default ServiceAccount');
    const settings = { namespace: NS, image: 'slipway-sandbox' };
    const kube = new KubernetesSandboxProvider({ kubeConfig: kc, defaults: settings });
    const podman = new ContainerSandboxProvider({ engine: 'podman' });
    const local = new LocalSandboxProvider();
    let i = 0;
    const create = async (p: SandboxProvider, extra: object = {}) => {
      const t0 = performance.now();
      const h = await p.create({ ...sandboxRequest(repo, `b${i++}`, { group: 'bench' }), ...extra });
      made.push([p, h]);
      return { ms: performance.now() - t0, h };
    };
    const rows: Record<string, number[]> = { 'kubernetes cold': [], 'kubernetes warm pool': [], 'podman cold': [], 'local cold': [] };
    // Interleaved rounds, so the machine's load falls on all alike.
    for (let r = 0; r < creates; r++) {
      rows['kubernetes cold'].push((await create(kube)).ms);
      await kube.fillPool(NS, 'slipway-sandbox', settings, 1);
      const warm = await create(kube, { warmPool: 1 });
      if (warm.h.origin !== 'pool') throw new Error('the warm create did not come from the pool');
      rows['kubernetes warm pool'].push(warm.ms);
      rows['podman cold'].push((await create(podman, { provider: 'podman' })).ms);
      rows['local cold'].push((await create(local)).ms);
    }
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const base = median(rows['local cold']);
    console.log(`create to ready (median of ${creates}, ms; ratio to local):`);
    for (const [k, v] of Object.entries(rows)) console.log(`  ${k.padEnd(22)} ${median(v).toFixed(0).padStart(6)}  ${(median(v) / base).toFixed(1)}x`);

    const pick = (p: SandboxProvider) => made.find(([q]) => q === p)![1];
    const ex: Record<string, number[]> = { kubernetes: [], podman: [], local: [] };
    for (let r = 0; r < execs; r++) {
      for (const [k, p] of [['kubernetes', kube], ['podman', podman], ['local', local]] as const) {
        const t0 = performance.now();
        const res = await p.exec(pick(p), { command: 'true' });
        if (res.exitCode !== 0) throw new Error(`${k}: exec of true failed: ${res.stderr}`);
        ex[k].push(performance.now() - t0);
      }
    }
    const exBase = median(ex.local);
    console.log(`exec round trip of true (median of ${execs}, ms; ratio to local):`);
    for (const [k, v] of Object.entries(ex)) console.log(`  ${k.padEnd(22)} ${median(v).toFixed(0).padStart(6)}  ${(median(v) / exBase).toFixed(1)}x`);
  } finally {
    for (const [p, h] of made) await p.destroy({ repository: repo, root: h.root }).catch(() => undefined);
    await node.stop();
    await cluster.stop();
    await fs.rm(parent, { recursive: true, force: true });
  }
})().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
