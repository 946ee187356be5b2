/**
 * The janitor and Kubernetes (ADR 0020, 0029): pods and claims carrying Slipway's labels that no
 * record names are deleted by a janitor run; a recorded sandbox's stay; an ended objective's pods
 * go by label, one whose record a crash lost included. Against the real kube-apiserver with the
 * test node, and the real Temporal test server (the objectives' liveness is asked of it).
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { CoreV1Api, type KubeConfig } from '@kubernetes/client-node';
import { afterAll, beforeAll, expect, inject, it } from 'vitest';
import { createJanitorActivities, temporalHomeOf } from '../../activities/sandbox/janitor';
import { KUBERNETES_DIR, KubernetesSandboxProvider } from '../../activities/sandbox/kubernetes';
import { registerObjective, updateRegistry } from '../../activities/sandbox/registry';
import { defaultSandboxImage } from '../../activities/sandbox/container';
import { startKubeCluster, type KubeCluster } from '../helpers/kube-cluster';
import { startTestNode, type TestNode } from '../helpers/kube-node';
import { makeRepo, sandboxRequest, tempDir, waitFor } from './helpers';

const NS = 'janitor';
let cluster: KubeCluster;
let node: TestNode;
let admin: KubeConfig;
let core: CoreV1Api;
let connection: Connection;
let parent: string;

beforeAll(async () => {
  if (!defaultSandboxImage()) throw new Error('no sandbox image: bash scripts/setup.sh builds it');
  cluster = await startKubeCluster();
  node = await startTestNode(cluster);
  admin = cluster.config('admin');
  core = admin.makeApiClient(CoreV1Api);
  await core.createNamespace({ body: { metadata: { name: NS } } });
  expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 60_000)).toBe(true);
  connection = await Connection.connect({ address: inject('temporalAddress') });
  parent = tempDir('kube-janitor');
}, 240_000);

afterAll(async () => {
  await connection?.close();
  await node?.stop();
  await cluster?.stop();
  if (parent) await fs.rm(parent, { recursive: true, force: true });
});

const recordOf = async (root: string) => JSON.parse(await fs.readFile(`${root}.json`, 'utf8')) as { pod: string; claim: string };
const podGone = (name: string) => waitFor(async () => !(await core.readNamespacedPod({ namespace: NS, name }).catch(() => undefined)), 60_000);
const claimGone = (name: string) => waitFor(async () => !(await core.readNamespacedPersistentVolumeClaim({ namespace: NS, name }).catch(() => undefined)), 60_000);
const podThere = async (name: string) => !!(await core.readNamespacedPod({ namespace: NS, name }).catch(() => undefined));

it('a janitor run deletes pods and claims with Slipway\'s labels that no record names; a recorded sandbox survives; an ended objective\'s pods go by label', async () => {
  const { repo } = makeRepo(parent);
  const registry = path.join(parent, 'repositories.json');
  const client = new Client({ connection });
  const home = await temporalHomeOf(client)();
  const provider = new KubernetesSandboxProvider({ kubeConfig: admin, defaults: { namespace: NS, image: 'slipway-sandbox' } });

  // An orphan: its pod and claim were made with Slipway's labels, then a crash lost its record.
  const orphan = await provider.create(sandboxRequest(repo, 'orphan', { group: 'running-obj' }));
  const lost = await recordOf(orphan.root);
  await fs.rm(`${orphan.root}.json`);
  // A sandbox with its record: kept, whatever its objective (not registered here: not this janitor's to end).
  const kept = await provider.create(sandboxRequest(repo, 'kept', { group: 'running-obj' }));
  const keptRecord = await recordOf(kept.root);
  // An ended objective (no Temporal server runs it), registered long enough ago to be swept.
  const gone = 'ended-kube-obj';
  await registerObjective(repo, gone, undefined, registry, home);
  await updateRegistry((r) => {
    r.repositories[repo]!.objectives[gone]!.addedAt = new Date(Date.now() - 10 * 60_000).toISOString();
  }, registry);
  const ended = await provider.create(sandboxRequest(repo, 'stream', { group: gone }));
  const endedRecord = await recordOf(ended.root);

  // Young orphans are left alone (a create in flight records its pod before it makes it); the ended objective's sandbox goes, record and all.
  const first = await createJanitorActivities({ client, kubernetes: provider }).janitorSweepRepository({ repository: repo, registry });
  expect(first.errors).toEqual([]);
  expect(first.kubernetesOrphans).toEqual([]);
  expect(await podThere(lost.pod)).toBe(true);
  expect(first.objectives.find((o) => o.id === gone)?.removedWorktrees).toEqual([ended.root]);
  expect(await podGone(endedRecord.pod)).toBe(true);
  expect(await claimGone(endedRecord.claim)).toBe(true);
  expect(existsSync(path.join(repo, KUBERNETES_DIR, gone))).toBe(false);

  const sweep = await createJanitorActivities({ client, kubernetes: provider, kubernetesOrphanGraceMs: 0 }).janitorSweepRepository({ repository: repo, registry });
  expect(sweep.errors).toEqual([]);
  expect(sweep.kubernetesOrphans?.sort()).toEqual([`${NS}/persistentvolumeclaims/${lost.claim}`, `${NS}/pods/${lost.pod}`]);
  expect(await podGone(lost.pod)).toBe(true);
  expect(await claimGone(lost.claim)).toBe(true);
  // The recorded one is untouched and still works.
  expect(await podThere(keptRecord.pod)).toBe(true);
  expect((await provider.exec(kept, { command: 'true' })).exitCode).toBe(0);
  await provider.destroy({ repository: repo, root: kept.root });
}, 300_000);
