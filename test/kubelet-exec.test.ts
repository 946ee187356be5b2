/**
 * The kubelet's exec endpoint stand-in (test/helpers/kubelet-exec.ts) through the real path:
 * a real kube-apiserver (test/helpers/kube-cluster.ts) proxies `pods/exec` from real clients
 * (@kubernetes/client-node's Exec over WebSocket v5, and kubectl over WebSocket and SPDY) to the
 * test node's endpoint (test/helpers/kube-node.ts starts it) over SPDY/3.1, which runs the command
 * in the podman container the node runs for the pod. Fails, never skips, when a binary is missing.
 */
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { PassThrough, Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CoreV1Api, Exec, type KubeConfig, type V1Pod, type V1Status } from '@kubernetes/client-node';
import { defaultSandboxImage, engineEnv } from '../activities/sandbox/container';
import { startKubeCluster, type KubeCluster } from './helpers/kube-cluster';
import { kubeletTestPki } from './helpers/kubelet-exec';
import { startTestNode, type TestNode } from './helpers/kube-node';
import { waitFor } from './sandbox/helpers';

const NS = 'kx';
const POD = 'exec-pod';
const podman = (...args: string[]) => execFileSync('podman', args, { env: engineEnv(), encoding: 'utf8' }).trim();

let cluster: KubeCluster;
let node: TestNode;
let admin: KubeConfig;
let core: CoreV1Api;
/** The podman container the node runs for the pod's `main`. */
let container: string;

async function podUntil(name: string, check: (p: V1Pod) => boolean): Promise<V1Pod> {
  let last: V1Pod | undefined;
  const ok = await waitFor(async () => {
    last = await core.readNamespacedPod({ namespace: NS, name }).catch(() => undefined);
    return !!last && check(last);
  }, 120_000);
  if (!ok) throw new Error(`pod ${NS}/${name} never got there; last status: ${JSON.stringify(last?.status)}`);
  return last!;
}

beforeAll(async () => {
  const image = defaultSandboxImage();
  if (!image) throw new Error('no sandbox image: bash scripts/setup.sh builds it');
  cluster = await startKubeCluster();
  // The test node (kube-node.ts) starts the exec endpoint and registers its port as the node's kubelet endpoint.
  node = await startTestNode(cluster, { images: { sandbox: image } });
  admin = cluster.config('admin');
  core = admin.makeApiClient(CoreV1Api);
  await core.createNamespace({ body: { metadata: { name: NS } } });
  expect(await waitFor(async () => !!(await core.readNamespacedServiceAccount({ namespace: NS, name: 'default' }).catch(() => undefined)), 60_000)).toBe(true);
  await core.createNamespacedPod({ namespace: NS, body: { metadata: { name: POD }, spec: { containers: [{ name: 'main', image: 'sandbox', command: ['sleep', 'infinity'] }] } } });
  await podUntil(POD, (p) => p.status?.phase === 'Running');
  const c = node.containerName(NS, POD, 'main');
  if (!c) throw new Error('the node runs no container for the pod');
  container = c;
}, 240_000);

afterAll(async () => {
  await node?.stop();
  await cluster?.stop();
});

interface ExecResult {
  stdout: Buffer;
  stderr: Buffer;
  status: V1Status;
}

function sink(into: Buffer[]): Writable {
  return new Writable({
    write(chunk: Buffer, _enc, cb) {
      into.push(Buffer.from(chunk));
      cb();
    },
  });
}

/** One command through the API server with client-node's Exec (WebSocket); resolves on its status. */
async function kexec(command: string[], opts: { stdin?: Buffer | string; user?: string; container?: string } = {}): Promise<ExecResult> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  const stdin = opts.stdin === undefined ? null : new PassThrough();
  const kc = opts.user ? cluster.config(opts.user) : admin;
  const status = await new Promise<V1Status>((resolve, reject) => {
    new Exec(kc)
      .exec(NS, POD, opts.container ?? 'main', command, sink(out), sink(err), stdin, false, resolve)
      .then((ws) => {
        ws.on('close', () => setImmediate(() => reject(new Error(`connection closed without a status; stderr: ${Buffer.concat(err).toString()}`))));
        stdin?.end(opts.stdin);
      }, reject);
  });
  return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), status };
}

/** Whether a process whose command line starts with `prefix` runs in the container. */
function runningInContainer(prefix: string): boolean {
  const out = podman('exec', container, '/bin/sh', '-c', 'for d in /proc/[0-9]*; do tr "\\000" " " < $d/cmdline 2>/dev/null; echo; done');
  return out.split('\n').some((l) => l.startsWith(prefix));
}

describe('kubelet exec through the real kube-apiserver (client-node Exec, WebSocket v5 -> SPDY/3.1)', () => {
  it('separates stdout and stderr and reports exit code 0 as Success', async () => {
    const r = await kexec(['sh', '-c', 'echo out; echo err >&2; echo more']);
    expect(r.stdout.toString()).toBe('out\nmore\n');
    expect(r.stderr.toString()).toBe('err\n');
    expect(r.status.status).toBe('Success');
  });

  it('reports a non-zero exit code as NonZeroExitCode with the code in details.causes', async () => {
    const r = await kexec(['sh', '-c', 'echo partial; exit 7']);
    expect(r.stdout.toString()).toBe('partial\n');
    expect(r.status).toMatchObject({ status: 'Failure', reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '7' }] } });
  });

  it('round-trips stdin through cat (and its end reaches the command)', async () => {
    const input = Buffer.concat([Buffer.from('line one\n'), randomBytes(100_000), Buffer.from('\nlast')]);
    const r = await kexec(['cat'], { stdin: input });
    expect(r.status.status).toBe('Success');
    expect(r.stdout.equals(input)).toBe(true);
  });

  it('carries 1 MiB of binary output intact', async () => {
    const r = await kexec(['sh', '-c', 'head -c 1048576 /dev/urandom | tee /tmp/blob | sha256sum >&2; ']);
    expect(r.status.status).toBe('Success');
    expect(r.stdout.length).toBe(0);
    const expected = r.stderr.toString().split(' ')[0];
    const blob = await kexec(['cat', '/tmp/blob']);
    expect(blob.stdout.length).toBe(1048576);
    const { createHash } = await import('node:crypto');
    expect(createHash('sha256').update(blob.stdout).digest('hex')).toBe(expected);
  });

  it('a client that goes away ends the command inside the container, children included', async () => {
    const marker = `${4000 + Math.floor(Math.random() * 1000)}.${randomBytes(3).readUIntBE(0, 3)}`;
    const out: Buffer[] = [];
    const ws = await new Exec(admin).exec(NS, POD, 'main', ['sh', '-c', `sleep ${marker} & echo started; wait`], sink(out), sink([]), null, false);
    expect(await waitFor(async () => Buffer.concat(out).toString().includes('started'), 60_000)).toBe(true);
    // The sleep itself (not only the shell whose argv names it).
    expect(await waitFor(async () => runningInContainer(`sleep ${marker} `), 30_000)).toBe(true);
    ws.terminate();
    expect(await waitFor(async () => !runningInContainer(`sleep ${marker} `) && !runningInContainer(`sh -c sleep ${marker} `), 60_000)).toBe(true);
  });

  it('gives a tty when asked, follows the client\'s resizes, and passes the exit code through', async () => {
    const out: Buffer[] = [];
    // client-node sends a resize for a stdout that has rows and columns (a terminal), and on its 'resize'.
    const terminal = Object.assign(sink(out), { columns: 100, rows: 40 });
    const stdin = new PassThrough();
    const status = new Promise<V1Status>((resolve, reject) => {
      void new Exec(admin).exec(NS, POD, 'main', ['sh'], terminal, null, stdin, true, resolve).then((ws) => ws.on('close', () => setImmediate(() => reject(new Error('closed without a status')))), reject);
    });
    // One probe at a time: each waits for its own end marker before the next is typed, so a slow
    // machine never floods the terminal's input queue (a full canonical-mode queue drops input).
    let probes = 0;
    const sizeIs = async (size: string) => {
      const deadline = Date.now() + 50_000;
      while (Date.now() < deadline) {
        const marker = `probe-end-${++probes}`;
        const from = Buffer.concat(out).length;
        stdin.write(`stty size; tty; echo ${marker.replace('-end', '""-end')}\n`);
        if (!(await waitFor(async () => Buffer.concat(out).subarray(from).toString().includes(marker), 40_000))) continue;
        if (Buffer.concat(out).subarray(from).toString().includes(size)) return true;
      }
      return false;
    };
    expect(await sizeIs('40 100')).toBe(true);
    expect(Buffer.concat(out).toString()).toMatch(/\/dev\/pts\/\d+/);
    terminal.columns = 120;
    terminal.rows = 50;
    terminal.emit('resize');
    expect(await sizeIs('50 120')).toBe(true);
    stdin.write('exit 5\n');
    expect(await status).toMatchObject({ status: 'Failure', reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '5' }] } });
  });

  it('the API server trusts only kubelets whose serving certificate comes from --kubelet-certificate-authority', async () => {
    // An impostor node: same protocol port, a self-signed certificate the API server was not told about.
    const dir = path.join(cluster.dir, 'impostor');
    execFileSync('mkdir', ['-p', dir]);
    execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1', '-keyout', 'k.pem', '-out', 'c.pem', '-subj', '/CN=impostor', '-addext', 'subjectAltName=IP:127.0.0.1'], { cwd: dir, stdio: 'ignore' });
    let requests = 0;
    const impostor = https.createServer({ key: readFileSync(path.join(dir, 'k.pem')), cert: readFileSync(path.join(dir, 'c.pem')) }, (_req, res) => {
      requests++;
      res.end();
    });
    impostor.on('upgrade', (_req, socket) => {
      requests++;
      socket.destroy();
    });
    await new Promise<void>((r) => impostor.listen(0, '127.0.0.1', () => r()));
    try {
      const core = admin.makeApiClient(CoreV1Api);
      await core.createNode({ body: { metadata: { name: 'kx-impostor' } } });
      await core.replaceNodeStatus({
        name: 'kx-impostor',
        body: { metadata: { name: 'kx-impostor' }, status: { addresses: [{ type: 'InternalIP', address: '127.0.0.1' }], daemonEndpoints: { kubeletEndpoint: { Port: (impostor.address() as { port: number }).port } } } },
      });
      await core.createNamespacedPod({ namespace: NS, body: { metadata: { name: 'on-impostor' }, spec: { nodeName: 'kx-impostor', containers: [{ name: 'main', image: 'sandbox' }] } } });
      const outcome = await new Promise<unknown>((resolve) => {
        void new Exec(admin).exec(NS, 'on-impostor', 'main', ['true'], sink([]), sink([]), null, false, resolve).then((ws) => ws.on('close', () => setImmediate(() => resolve('closed'))), resolve);
      });
      // Refused in the TLS handshake: no request ever reached the impostor, and the client is told why.
      expect(requests).toBe(0);
      expect(JSON.stringify(outcome)).toMatch(/certificate/);
    } finally {
      impostor.close();
    }
  });

  it("RBAC is the API server's: 'nobody' is refused with 403 before anything runs", async () => {
    const marker = `/tmp/nobody-${randomBytes(4).toString('hex')}`;
    await expect(kexec(['touch', marker], { user: 'nobody' })).rejects.toThrow(/403/);
    const check = await kexec(['sh', '-c', `test -e ${marker} && echo present || echo absent`]);
    expect(check.stdout.toString()).toBe('absent\n');
  });

  it('a container the node does not run is refused by the kubelet (404 before any upgrade), and the client is told', async () => {
    // Pending: the second container's image is not on the node, so the node never made it.
    await core.createNamespacedPod({
      namespace: NS,
      body: { metadata: { name: 'half' }, spec: { containers: [{ name: 'main', image: 'sandbox', command: ['sleep', 'infinity'] }, { name: 'ghost', image: 'not-on-this-node' }] } },
    });
    await podUntil('half', (p) => p.status?.containerStatuses?.some((c) => c.state?.waiting?.reason === 'ErrImagePull') ?? false);
    const outcome = await new Promise<string>((resolve) => {
      void new Exec(admin).exec(NS, 'half', 'ghost', ['true'], sink([]), sink([]), null, false, (s) => resolve(JSON.stringify(s))).catch((e: unknown) => resolve(String(e)));
    });
    expect(outcome).toContain('unable to upgrade connection: container \\"ghost\\" of pod kx/half is not running on this node');
  });
});

describe('kubectl exec (a second real client)', () => {
  const kubectl = (args: string[], input?: string, env: Record<string, string> = {}) =>
    new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve, reject) => {
      const child = spawn('kubectl', ['--kubeconfig', cluster.kubeconfig('admin'), '-n', NS, ...args], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.on('error', (e) => reject(new Error(`kubectl is not on PATH (it is a test requirement here): ${e.message}`)));
      child.on('close', (code) => resolve({ code, stdout, stderr }));
      child.stdin.end(input);
    });

  it('runs a command with stdin and passes its exit code through', async () => {
    const ok = await kubectl(['exec', '-i', POD, '-c', 'main', '--', 'sh', '-c', 'tr a-z A-Z; echo to-stderr >&2'], 'hello kubectl\n');
    expect(ok).toMatchObject({ code: 0, stdout: 'HELLO KUBECTL\n' });
    expect(ok.stderr).toContain('to-stderr');
    const failed = await kubectl(['exec', POD, '-c', 'main', '--', 'sh', '-c', 'exit 3']);
    expect(failed.code).toBe(3);
  });

  it('over SPDY end to end too (kubectl without WebSockets: the API server proxies its SPDY upgrade as is)', async () => {
    const spdy = { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'false' };
    const ok = await kubectl(['exec', '-i', '-v=7', POD, '-c', 'main', '--', 'sh', '-c', 'cat; echo err >&2; exit 4'], 'through spdy\n', spdy);
    expect(ok.stdout).toBe('through spdy\n');
    expect(ok.stderr).toContain('err');
    expect(ok.code).toBe(4);
    // -v=7 logs the requests: a WebSocket exec logs its Sec-Websocket-Protocol; this one was a plain POST upgrade.
    expect(ok.stderr).toMatch(/POST https:\/\/127\.0\.0\.1:\d+\/api\/v1\/namespaces\/kx\/pods\/exec-pod\/exec/);
    expect(ok.stderr).not.toMatch(/websocket/i);
  });

  it('a killed kubectl ends the command in the container', async () => {
    const marker = `${5000 + Math.floor(Math.random() * 1000)}.${randomBytes(3).readUIntBE(0, 3)}`;
    const child = spawn('kubectl', ['--kubeconfig', cluster.kubeconfig('admin'), '-n', NS, 'exec', POD, '-c', 'main', '--', 'sh', '-c', `sleep ${marker} & echo started; wait`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const closed = new Promise((r) => child.on('close', r));
    expect(await waitFor(async () => out.includes('started'), 60_000)).toBe(true);
    expect(await waitFor(async () => runningInContainer(`sleep ${marker} `), 30_000)).toBe(true);
    child.kill('SIGKILL');
    await closed;
    expect(await waitFor(async () => !runningInContainer(`sleep ${marker} `), 60_000)).toBe(true);
  });
});

describe('the endpoint itself', () => {
  let kubeletPort = 0;
  const request = (opts: https.RequestOptions) =>
    new Promise<{ status?: number; error?: string }>((resolve) => {
      const req = https.request({ host: '127.0.0.1', port: kubeletPort, path: `/exec/${NS}/${POD}/main?command=true&output=1`, method: 'POST', ...opts }, (res) => {
        res.resume();
        resolve({ status: res.statusCode });
      });
      req.on('error', (e) => resolve({ error: e.message }));
      req.end();
    });

  it('refuses callers without a client certificate from the API server\'s CA (only the API server may exec)', async () => {
    // The port the node registered, which is what the API server dials.
    kubeletPort = (await core.readNode({ name: node.name })).status?.daemonEndpoints?.kubeletEndpoint?.Port ?? 0;
    expect(kubeletPort).toBeGreaterThan(0);
    const pki = kubeletTestPki();
    const anonymous = await request({ ca: pki.ca });
    expect(anonymous.status).toBeUndefined();
    expect(anonymous.error).toBeTruthy();
    // A certificate from another CA (this module's own) is refused as well.
    const stranger = await request({ ca: pki.ca, cert: pki.clientCert, key: pki.clientKey });
    expect(stranger.status).toBeUndefined();
    expect(stranger.error).toBeTruthy();
    // The API server's own client certificate passes TLS; the handshake is then checked: a
    // protocol without exit codes is refused, naming what is served.
    const read = (f: string) => readFileSync(path.join(cluster.dir, 'pki', f), 'utf8');
    const apiserver = await request({
      ca: pki.ca,
      cert: read('kubelet-client.crt'),
      key: read('kubelet-client.key'),
      headers: { Connection: 'Upgrade', Upgrade: 'SPDY/3.1', 'X-Stream-Protocol-Version': 'v1.channel.k8s.io' },
    });
    expect(apiserver.status).toBe(403);
  });
});
