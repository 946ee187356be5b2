/**
 * infra/kubernetes/ is known to be valid: every manifest is server-side applied, with strict
 * field validation, to the real test kube-apiserver (no node needed: objects are stored, not run),
 * and read back. The commands the manifests run use flags the CLI has, the SLIPWAY_* variables
 * they set are ones Slipway reads, and the sample profile section passes the profile schema.
 */
import { readdirSync, readFileSync } from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { parseProfileKubernetes } from '../core/kubernetes';
import { slipway } from './helpers/cli';
import { startKubeCluster, type KubeCluster } from './helpers/kube-cluster';

const REPO = path.join(__dirname, '..');
const INFRA = path.join(REPO, 'infra', 'kubernetes');

interface Manifest {
  file: string;
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  [key: string]: unknown;
}

/** Where each kind lives in the API; a kind not listed fails the test by name (add it here). */
const RESOURCES: Record<string, { base: string; plural: string; namespaced: boolean }> = {
  Namespace: { base: '/api/v1', plural: 'namespaces', namespaced: false },
  ServiceAccount: { base: '/api/v1', plural: 'serviceaccounts', namespaced: true },
  ResourceQuota: { base: '/api/v1', plural: 'resourcequotas', namespaced: true },
  Service: { base: '/api/v1', plural: 'services', namespaced: true },
  Role: { base: '/apis/rbac.authorization.k8s.io/v1', plural: 'roles', namespaced: true },
  RoleBinding: { base: '/apis/rbac.authorization.k8s.io/v1', plural: 'rolebindings', namespaced: true },
  Deployment: { base: '/apis/apps/v1', plural: 'deployments', namespaced: true },
  StatefulSet: { base: '/apis/apps/v1', plural: 'statefulsets', namespaced: true },
};
/** Namespaces first, then what others refer to: the order `kubectl apply` needs no retry in. */
const ORDER = ['Namespace', 'ServiceAccount', 'ResourceQuota', 'Role', 'RoleBinding', 'Service', 'Deployment', 'StatefulSet'];

function manifests(): Manifest[] {
  const out: Manifest[] = [];
  for (const file of readdirSync(INFRA).filter((f) => f.endsWith('.yaml')).sort()) {
    for (const doc of parseAllDocuments(readFileSync(path.join(INFRA, file), 'utf8'))) {
      expect(doc.errors, file).toEqual([]);
      const value = doc.toJS() as Manifest | null;
      if (value) out.push({ ...value, file });
    }
  }
  return out.sort((a, b) => ORDER.indexOf(a.kind) - ORDER.indexOf(b.kind));
}

function objectPath(m: Pick<Manifest, 'kind' | 'metadata' | 'file'>): string {
  const r = RESOURCES[m.kind];
  if (!r) throw new Error(`${m.file}: kind ${m.kind} is not in this test's RESOURCES table`);
  if (r.namespaced && !m.metadata.namespace) throw new Error(`${m.file}: ${m.kind} ${m.metadata.name} names no namespace (it would land in whatever namespace kubectl defaults to)`);
  return r.namespaced ? `${r.base}/namespaces/${m.metadata.namespace}/${r.plural}/${m.metadata.name}` : `${r.base}/${r.plural}/${m.metadata.name}`;
}

let cluster: KubeCluster;

function request(method: string, urlPath: string, body?: string): Promise<{ status: number; body: string }> {
  const url = new URL(urlPath, cluster.server);
  return new Promise((resolve, reject) => {
    const req = https.request(
      url,
      {
        method,
        ca: readFileSync(cluster.caFile),
        headers: { authorization: `Bearer ${cluster.adminToken}`, ...(body ? { 'content-type': 'application/apply-patch+yaml' } : {}) },
      },
      (res) => {
        let text = '';
        res.on('data', (c) => (text += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

/** `kubectl apply --server-side --validate=strict`: unknown or duplicate fields are refused, not dropped. */
function apply(m: Manifest) {
  const { file: _file, ...object } = m;
  return request('PATCH', `${objectPath(m)}?fieldManager=slipway-infra-test&force=true&fieldValidation=Strict`, JSON.stringify(object));
}

beforeAll(async () => {
  cluster = await startKubeCluster();
}, 240_000);

afterAll(async () => {
  await cluster?.stop();
});

describe('infra/kubernetes', () => {
  it('every manifest applies (server-side, strict validation) to the real API server and reads back', async () => {
    const all = manifests();
    expect(all.map((m) => m.kind)).toEqual(expect.arrayContaining(['Namespace', 'Role', 'RoleBinding', 'Deployment', 'StatefulSet', 'Service']));
    for (const m of all) {
      const applied = await apply(m);
      expect([200, 201], `${m.file}: ${m.kind} ${m.metadata.name}: ${applied.body}`).toContain(applied.status);
      expect((await request('GET', objectPath(m))).status, `${m.file}: ${m.kind} ${m.metadata.name}`).toBe(200);
    }
  });

  it('strict validation is on: a misspelt field is refused naming it (so the test above could fail)', async () => {
    const deployment = manifests().find((m) => m.kind === 'Deployment')!;
    const broken = structuredClone(deployment) as Manifest & { spec: { template: { spec: { containers: Array<Record<string, unknown>> } } } };
    broken.spec.template.spec.containers[0]!.imagePulPolicy = 'Always';
    const refused = await apply(broken);
    // kube-apiserver 1.34 answers a server-side apply it cannot type with 500, naming the field.
    expect(refused.status, refused.body).toBeGreaterThanOrEqual(400);
    expect(refused.body).toMatch(/imagePulPolicy: field not declared in schema/);
  });

  it('the processes they run use flags the CLI has, and the SLIPWAY_* variables they set are ones Slipway reads', async () => {
    type Container = { command?: string[]; env?: Array<{ name: string }> };
    const containers = manifests().flatMap((m) => ((m as { spec?: { template?: { spec?: { containers?: Container[] } } } }).spec?.template?.spec?.containers ?? []).map((c) => ({ ...c, file: m.file })));
    expect(containers.length).toBeGreaterThanOrEqual(3);
    const source = ['cli', 'workers', 'activities', 'lib', 'api', 'config', 'core']
      .flatMap((dir) => readdirSync(path.join(REPO, dir), { recursive: true, encoding: 'utf8' }).filter((f) => f.endsWith('.ts')).map((f) => readFileSync(path.join(REPO, dir, f), 'utf8')))
      .join('\n');
    for (const c of containers) {
      const [node, bin, verb, ...args] = c.command ?? [];
      expect([node, bin], c.file).toEqual(['node', 'bin/slipway.cjs']);
      const help = await slipway([verb!, '--help']);
      expect(help.code, `${c.file}: slipway ${verb} --help: ${help.stderr}`).toBe(0);
      for (const flag of args.filter((a) => a.startsWith('--'))) expect(help.stdout, `${c.file}: slipway ${verb} ${flag}`).toContain(flag);
      for (const { name } of c.env ?? []) if (name.startsWith('SLIPWAY_')) expect(source.includes(name), `${c.file}: ${name} is read nowhere`).toBe(true);
    }
  }, 120_000);

  it('the sample profile section passes the profile schema and names the sandbox namespace the Role covers', () => {
    const profile = parseProfileKubernetes(JSON.parse(readFileSync(path.join(INFRA, 'profiles', 'sandbox-small.json'), 'utf8')));
    const role = manifests().find((m) => m.kind === 'Role')!;
    expect(profile.namespace).toBe(role.metadata.namespace);
    expect(profile.warm_pool).toBe(2);
    expect(() => parseProfileKubernetes({ ...profile, resources: { limits: { memory: 'four gigs' } } })).toThrow(/^kubernetes\.resources\.limits\.memory: /);
  });
});
