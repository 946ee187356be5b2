/**
 * A real Kubernetes control plane for tests (ADR 0021): etcd (Debian's etcd-server) and the
 * kube-apiserver that scripts/kube-apiserver.sh builds, on random ports in a temp dir.
 *
 * Real: etcd, kube-apiserver with its default admission plugins (ServiceAccount, ResourceQuota,
 * LimitRanger, ...), static-token authentication, RBAC, watch, and `pods/exec` proxying to the
 * node's kubelet port. There is no controller-manager; the harness plays the two controllers
 * every namespace needs before a pod can be admitted: the ServiceAccount controller (a
 * `default` ServiceAccount in each namespace) and the root-CA publisher (`kube-root-ca.crt`).
 * Nodes, the scheduler, the kubelet and the PV/quota controllers are test/helpers/kube-node.ts.
 *
 * Certificates: one CA made with openssl signs the API server's serving certificate and its
 * kubelet client certificate (CN kube-apiserver-kubelet-client, group system:masters), so a
 * kubelet stand-in can check that it is the API server dialing (`clientCaFile`).
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync, openSync, closeSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { CoreV1Api, KubeConfig, Watch, type V1Namespace } from '@kubernetes/client-node';
import { testPort } from './ports';
import { killProcessGroup } from '../../activities/process';
import { apiserverFlags } from './kubelet-exec';

export const KUBE_VERSION = '1.34.4';
const REPO = path.resolve(__dirname, '..', '..');
/** Where scripts/kube-apiserver.sh puts the binary (KUBE_APISERVER overrides). */
export const KUBE_APISERVER = process.env.KUBE_APISERVER ?? path.join(REPO, '.tools', 'kube', KUBE_VERSION, 'kube-apiserver');
export const ETCD = process.env.ETCD ?? '/usr/bin/etcd';

/** The token users: every one is also in system:authenticated. */
const USERS: Record<string, string[]> = {
  admin: ['system:masters'],
  'slipway-provider': [],
  'slipway-worker': [],
  nobody: [],
};

export interface KubeCluster {
  /** https://127.0.0.1:<port> */
  server: string;
  /** PEM file of the CA that signed the API server's certificate. */
  caFile: string;
  /** That CA, base64 of the PEM (what a kubeconfig's certificate-authority-data and client-node's Cluster.caData hold). */
  caData: string;
  /** PEM file of the CA that signed the API server's kubelet client certificate (the same CA). */
  clientCaFile: string;
  adminToken: string;
  /** Path of a kubeconfig file for a token user (default admin). */
  kubeconfig(user?: string): string;
  /** Static token of a user in the token file: admin (system:masters), slipway-provider, slipway-worker, nobody. */
  token(user: string): string;
  /** A KubeConfig for a token user, loaded from kubeconfig(user). */
  config(user?: string): KubeConfig;
  /** The temp dir (certificates, etcd data, logs). */
  dir: string;
  /** Restarts kube-apiserver only (same etcd, same port); resolves when /readyz answers ok. */
  restart(): Promise<void>;
  stop(): Promise<void>;
}

/** Throws naming the missing binary and how to get it: tests that need the cluster fail, never skip. */
export function assertKubeBinaries(): void {
  if (!existsSync(KUBE_APISERVER)) {
    throw new Error(`kube-apiserver is missing: ${KUBE_APISERVER} (build it with: bash scripts/kube-apiserver.sh, needs Go on PATH; or set KUBE_APISERVER)`);
  }
  if (!existsSync(ETCD)) throw new Error(`etcd is missing: ${ETCD} (apt-get install etcd-server, or bash scripts/setup.sh; or set ETCD)`);
}

function openssl(cwd: string, ...args: string[]): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

function makeCertificates(dir: string): void {
  mkdirSync(dir, { recursive: true });
  openssl(dir, 'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=slipway-test-ca');
  const sign = (name: string, subject: string, ext: string) => {
    writeFileSync(path.join(dir, `${name}.ext`), ext);
    openssl(dir, 'req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', subject);
    openssl(dir, 'x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${name}.crt`, '-days', '2', '-extfile', `${name}.ext`);
  };
  sign('apiserver', '/CN=kube-apiserver', 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n');
  sign('kubelet-client', '/O=system:masters/CN=kube-apiserver-kubelet-client', 'extendedKeyUsage=clientAuth\n');
  // The service-account token signing key (kube-apiserver signs, and verifies with the public half).
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
  writeFileSync(path.join(dir, 'sa.key'), privateKey.export({ type: 'pkcs8', format: 'pem' }));
  writeFileSync(path.join(dir, 'sa.pub'), publicKey.export({ type: 'spki', format: 'pem' }));
}

interface Proc {
  child: ChildProcess;
  exited: Promise<void>;
}

function startProcess(bin: string, args: string[], logFile: string): Proc {
  const fd = openSync(logFile, 'a');
  // Own process group, so stop() kills it and whatever it started.
  const child = spawn(bin, args, { detached: true, stdio: ['ignore', fd, fd] });
  closeSync(fd);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.once('error', () => undefined);
  return { child, exited };
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '';
  }
}

/** GET a path; resolves with the status code and body, or undefined when nothing answers. */
function get(url: string, opts: { ca?: Buffer; token?: string } = {}): Promise<{ status: number; body: string } | undefined> {
  return new Promise((resolve) => {
    const u = new URL(url);
    const options = { ca: opts.ca, headers: opts.token ? { authorization: `Bearer ${opts.token}` } : {}, timeout: 5_000 };
    const onResponse = (res: http.IncomingMessage) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    };
    const req = u.protocol === 'https:' ? https.get(url, options, onResponse) : http.get(url, options, onResponse);
    req.on('error', () => resolve(undefined));
    req.on('timeout', () => req.destroy());
  });
}

/** Polls until `check` passes, the process exits (error with its log) or the deadline passes. */
async function until(what: string, proc: Proc, logFile: string, check: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  let dead = false;
  void proc.exited.then(() => (dead = true));
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (dead) throw new Error(`${what} exited before it was ready; end of ${logFile}:\n${tail(logFile)}`);
    if (Date.now() > deadline) throw new Error(`${what} not ready after ${timeoutMs} ms; end of ${logFile}:\n${tail(logFile)}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function stopProcess(proc: Proc | undefined): Promise<void> {
  if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null) return;
  killProcessGroup(proc.child.pid, 'SIGKILL');
  await proc.exited;
}

export interface Informer<T> {
  /** The objects seen last, by namespace/name. */
  list(): T[];
  stop(): void;
}

type KubeObject = { metadata?: { name?: string; namespace?: string; resourceVersion?: string } };

/**
 * List, then watch from the list's resourceVersion; a watch that ends (API server restart,
 * 410 Gone, timeout) re-lists, and objects gone meanwhile are reported deleted. Ours rather than
 * client-node's ListWatch, which leaves a rejected promise unhandled when the re-watch cannot
 * connect (an API server restart in the middle of a test).
 */
export function informer<T extends KubeObject>(
  kc: KubeConfig,
  path: string,
  listFn: () => Promise<{ items: T[]; metadata?: { resourceVersion?: string } }>,
  onEvent: (type: 'ADDED' | 'MODIFIED' | 'DELETED', obj: T) => void,
  query: Record<string, string> = {},
): Informer<T> {
  const key = (o: T) => `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}`;
  const cache = new Map<string, T>();
  let stopped = false;
  let abort: AbortController | undefined;
  const emit = (type: 'ADDED' | 'MODIFIED' | 'DELETED', obj: T) => {
    try {
      onEvent(type, obj);
    } catch {
      /* a handler's error is its own */
    }
  };
  const loop = async () => {
    while (!stopped) {
      try {
        const list = await listFn();
        const seen = new Set<string>();
        for (const obj of list.items) {
          seen.add(key(obj));
          const had = cache.has(key(obj));
          cache.set(key(obj), obj);
          emit(had ? 'MODIFIED' : 'ADDED', obj);
        }
        for (const [k, obj] of [...cache]) {
          if (!seen.has(k)) {
            cache.delete(k);
            emit('DELETED', obj);
          }
        }
        let resourceVersion = list.metadata?.resourceVersion;
        await new Promise<void>((resolve) => {
          if (stopped) return resolve();
          new Watch(kc)
            .watch(
              path,
              { ...query, resourceVersion, allowWatchBookmarks: true },
              (type: string, obj: T) => {
                if (obj?.metadata?.resourceVersion) resourceVersion = obj.metadata.resourceVersion;
                if (type === 'ADDED' || type === 'MODIFIED') {
                  cache.set(key(obj), obj);
                  emit(type, obj);
                } else if (type === 'DELETED') {
                  cache.delete(key(obj));
                  emit(type, obj);
                }
              },
              () => resolve(),
            )
            .then(
              (req) => {
                abort = req;
                if (stopped) req.abort();
              },
              () => resolve(),
            );
        });
      } catch {
        /* API server away (restart): list again */
      }
      if (!stopped) await new Promise((r) => setTimeout(r, 200));
    }
  };
  void loop();
  return {
    list: () => [...cache.values()],
    stop() {
      stopped = true;
      abort?.abort();
    },
  };
}

/**
 * Plays the controller-manager's ServiceAccount controller and root-CA publisher: every namespace
 * gets a `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap. Without them the
 * ServiceAccount admission plugin refuses pods ("serviceaccount default not found").
 */
function playNamespaceControllers(kc: KubeConfig, caPem: string): Informer<V1Namespace> {
  const core = kc.makeApiClient(CoreV1Api);
  const ignoreConflict = (e: unknown) => {
    if ((e as { code?: number }).code !== 409) throw e;
  };
  const ensure = async (ns: V1Namespace) => {
    const namespace = ns.metadata?.name;
    if (!namespace || ns.status?.phase === 'Terminating') return;
    await core.createNamespacedServiceAccount({ namespace, body: { metadata: { name: 'default' } } }).catch(ignoreConflict);
    await core.createNamespacedConfigMap({ namespace, body: { metadata: { name: 'kube-root-ca.crt' }, data: { 'ca.crt': caPem } } }).catch(ignoreConflict);
  };
  return informer<V1Namespace>(kc, '/api/v1/namespaces', () => core.listNamespace(), (type, ns) => {
    if (type !== 'DELETED') void ensure(ns).catch(() => undefined);
  });
}

export async function startKubeCluster(opts: { dir?: string } = {}): Promise<KubeCluster> {
  assertKubeBinaries();
  const ownDir = !opts.dir;
  const dir = opts.dir ?? mkdtempSync(path.join(os.tmpdir(), 'slipway-kube-'));
  mkdirSync(dir, { recursive: true });
  const pki = path.join(dir, 'pki');
  makeCertificates(pki);
  const tokens: Record<string, string> = {};
  const tokenLines = Object.entries(USERS).map(([user, groups], i) => {
    tokens[user] = `${user}-${randomBytes(16).toString('hex')}`;
    return `${tokens[user]},${user},uid-${i}${groups.length ? `,"${groups.join(',')}"` : ''}`;
  });
  const tokenFile = path.join(pki, 'tokens.csv');
  writeFileSync(tokenFile, tokenLines.join('\n') + '\n', { mode: 0o600 });
  const caFile = path.join(pki, 'ca.crt');
  const caPem = readFileSync(caFile, 'utf8');
  const caData = Buffer.from(caPem).toString('base64');

  const [clientPort, peerPort, securePort] = await Promise.all([testPort(), testPort(), testPort()]);
  const etcdLog = path.join(dir, 'etcd.log');
  const etcdUrl = `http://127.0.0.1:${clientPort}`;
  const peerUrl = `http://127.0.0.1:${peerPort}`;
  const etcd = startProcess(
    ETCD,
    [
      '--name=default',
      `--data-dir=${path.join(dir, 'etcd')}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=${peerUrl}`,
      `--initial-advertise-peer-urls=${peerUrl}`,
      `--initial-cluster=default=${peerUrl}`,
      '--log-level=warn',
      '--logger=zap',
    ],
    etcdLog,
  );
  let apiserver: Proc | undefined;
  let controllers: Informer<V1Namespace> | undefined;
  const server = `https://127.0.0.1:${securePort}`;
  const apiLog = path.join(dir, 'kube-apiserver.log');
  const ca = Buffer.from(caPem);

  const startApiserver = async () => {
    apiserver = startProcess(
      KUBE_APISERVER,
      [
        `--etcd-servers=${etcdUrl}`,
        '--bind-address=127.0.0.1',
        '--advertise-address=127.0.0.1',
        `--secure-port=${securePort}`,
        `--cert-dir=${path.join(dir, 'apiserver-certs')}`,
        `--tls-cert-file=${path.join(pki, 'apiserver.crt')}`,
        `--tls-private-key-file=${path.join(pki, 'apiserver.key')}`,
        `--client-ca-file=${caFile}`,
        `--token-auth-file=${tokenFile}`,
        '--authorization-mode=RBAC',
        `--service-account-key-file=${path.join(pki, 'sa.pub')}`,
        `--service-account-signing-key-file=${path.join(pki, 'sa.key')}`,
        '--service-account-issuer=https://kubernetes.default.svc',
        '--service-cluster-ip-range=10.96.0.0/16',
        // The API server dials the node's kubelet port for pods/exec, logs, port-forward.
        `--kubelet-client-certificate=${path.join(pki, 'kubelet-client.crt')}`,
        `--kubelet-client-key=${path.join(pki, 'kubelet-client.key')}`,
        '--kubelet-preferred-address-types=InternalIP',
        // The kubelet stand-ins' serving certificates all come from one CA per test process.
        ...apiserverFlags(path.join(pki, 'kubelet-ca.crt')),
        '--allow-privileged=false',
        '--profiling=false',
        '--v=1',
      ],
      apiLog,
    );
    const proc = apiserver;
    await until('kube-apiserver', proc, apiLog, async () => {
      const res = await get(`${server}/readyz`, { ca, token: tokens.admin });
      return res?.status === 200;
    }, 120_000);
  };

  const kubeconfigs = new Map<string, string>();
  const kubeconfig = (user = 'admin') => {
    if (!tokens[user]) throw new Error(`kube-cluster: no token user '${user}' (known: ${Object.keys(tokens).join(', ')})`);
    let file = kubeconfigs.get(user);
    if (!file) {
      file = path.join(dir, `kubeconfig-${user}.yaml`);
      const doc = {
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'test', cluster: { server, 'certificate-authority-data': caData } }],
        users: [{ name: user, user: { token: tokens[user] } }],
        contexts: [{ name: user, context: { cluster: 'test', user, namespace: 'default' } }],
        'current-context': user,
      };
      // JSON is YAML: any kubeconfig reader takes it.
      writeFileSync(file, JSON.stringify(doc, null, 2), { mode: 0o600 });
      kubeconfigs.set(user, file);
    }
    return file;
  };
  const config = (user = 'admin') => {
    const kc = new KubeConfig();
    kc.loadFromFile(kubeconfig(user));
    return kc;
  };

  try {
    await until('etcd', etcd, etcdLog, async () => (await get(`${etcdUrl}/health`))?.body.includes('"true"') ?? false, 60_000);
    await startApiserver();
    controllers = playNamespaceControllers(config('admin'), caPem);
  } catch (e) {
    await stopProcess(apiserver);
    await stopProcess(etcd);
    throw e;
  }

  return {
    server,
    caFile,
    caData,
    clientCaFile: caFile,
    adminToken: tokens.admin,
    dir,
    kubeconfig,
    token(user: string) {
      const t = tokens[user];
      if (!t) throw new Error(`kube-cluster: no token user '${user}' (known: ${Object.keys(tokens).join(', ')})`);
      return t;
    },
    config,
    async restart() {
      await stopProcess(apiserver);
      await startApiserver();
    },
    async stop() {
      controllers?.stop();
      await stopProcess(apiserver);
      await stopProcess(etcd);
      if (ownDir) rmSync(dir, { recursive: true, force: true });
    },
  };
}
