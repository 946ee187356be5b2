/**
 * The kubelet's exec endpoint, played by the test node (docs/kubernetes-test-node.md): what the
 * real kube-apiserver dials for `pods/exec`. It speaks the kubelet's wire protocol for real:
 * HTTPS with a serving certificate the apiserver verifies (--kubelet-certificate-authority, from
 * apiserverFlags) and a client certificate it demands of the apiserver (--kubelet-client-certificate), the
 * `X-Stream-Protocol-Version` handshake, an upgrade to SPDY/3.1, one SPDY stream per
 * `streamType` (error, stdin, stdout, stderr, resize), and the v4 metav1.Status on the error
 * stream at the end. The command runs in the pod's podman container through `podman exec`,
 * in its own process group there (the podman provider's wrapper), so a client that goes away
 * ends it inside the container, not only the podman client.
 *
 * SPDY framing is our own (below, about 150 lines) rather than spdy-transport's: Kubernetes'
 * SPDY streams (moby/spdystream) open with only their own headers (`streamtype`), and
 * spdy-transport's parser refuses a SYN_STREAM without `:method` and `:path` ("Missing `:method`
 * and/or `:path` header"), so it cannot serve this peer. Only its SPDY/3 header dictionary is
 * used. Like spdystream, no flow control is enforced: spdystream never sends WINDOW_UPDATE.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { PassThrough, type Duplex, type Readable, type Writable } from 'node:stream';
import zlib from 'node:zlib';
import { engineEnv, execWrapper, killExecInContainer, newExecId } from '../../activities/sandbox/container';
import { killProcessGroup } from '../../activities/process';
import { checkSize, CONTROL_FD, CONTROLLER, terminalCommandLine } from '../../activities/sandbox/session';

const SPDY3_DICTIONARY = (createRequire(__filename)('spdy-transport/lib/spdy-transport/protocol/spdy/dictionary') as Record<number, Buffer>)[3];

/** What the kubelet answers to (kubelet remotecommand: v5 is v4 on SPDY; v1-v3 carry no exit code). */
const PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io'];
/** As the kubelet's streamCreationTimeout: a client that never opens its streams is dropped. */
const STREAM_CREATION_TIMEOUT_MS = 30_000;

// ---------------------------------------------------------------------------------------------
// PKI: one CA per test process, made with openssl; the serving and client certificates hang off it.

interface Pki {
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}
let pki: Pki | undefined;

function testPki(): Pki {
  if (pki) return pki;
  const dir = mkdtempSync(path.join(tmpdir(), 'slipway-kubelet-pki-'));
  try {
    const openssl = (...args: string[]) => {
      try {
        execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
      } catch (e) {
        throw new Error(`kubelet-exec: openssl ${args[0]} failed (is openssl installed?): ${(e as { stderr?: Buffer }).stderr?.toString() ?? e}`);
      }
    };
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '7', '-config', '/dev/null'];
    openssl('req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.crt', '-subj', '/CN=slipway-test-kubelet-ca',
      '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
    const leaf = (name: string, subject: string, usage: string, extra: string[]) =>
      openssl('req', '-x509', ...ec, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-keyout', `${name}.key`, '-out', `${name}.crt`, '-subj', subject,
        '-addext', 'basicConstraints=critical,CA:FALSE', '-addext', 'keyUsage=critical,digitalSignature', '-addext', `extendedKeyUsage=${usage}`, ...extra);
    leaf('server', '/CN=slipway-test-node', 'serverAuth', ['-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost']);
    leaf('client', '/O=system:masters/CN=kube-apiserver-kubelet-client', 'clientAuth', []);
    const read = (f: string) => readFileSync(path.join(dir, f), 'utf8');
    pki = { ca: read('ca.crt'), serverCert: read('server.crt'), serverKey: read('server.key'), clientCert: read('client.crt'), clientKey: read('client.key') };
    return pki;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The kube-apiserver flag that makes it verify the serving certificate of every kubelet-exec
 * server this process starts (all hang off one CA, made once per process, so servers started
 * after the API server are still trusted). Writes that CA to caFile.
 */
export function apiserverFlags(caFile: string): string[] {
  writeFileSync(caFile, testPki().ca);
  return [`--kubelet-certificate-authority=${caFile}`];
}

/** The CA the kubelet's serving certificates come from, and a client certificate from it (tests that speak to the server directly). */
export function kubeletTestPki(): { ca: string; clientCert: string; clientKey: string } {
  const p = testPki();
  return { ca: p.ca, clientCert: p.clientCert, clientKey: p.clientKey };
}

// ---------------------------------------------------------------------------------------------
// SPDY/3.1, server side, as much of it as Kubernetes' streams use.

const SYN_STREAM = 1;
const SYN_REPLY = 2;
const RST_STREAM = 3;
const PING = 6;
const GOAWAY = 7;
const HEADERS = 8;
const FLAG_FIN = 0x01;
const MAX_DATA = 32 * 1024;

interface SpdyStream {
  id: number;
  headers: Record<string, string>;
  /** What the client sends on it; ends on its FIN. */
  incoming: PassThrough;
}

/** One zlib stream per direction for the connection's life, as SPDY's header compression is. */
class HeaderZ {
  constructor(private readonly z: zlib.Inflate | zlib.Deflate) {}
  run(block: Buffer): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      this.z.once('error', reject);
      this.z.write(block);
      this.z.flush(zlib.constants.Z_SYNC_FLUSH, () => {
        this.z.off('error', reject);
        const out: Buffer[] = [];
        for (let c: Buffer | null; (c = this.z.read() as Buffer | null) !== null; ) out.push(c);
        resolve(Buffer.concat(out));
      });
    });
  }
}

function parseHeaderBlock(b: Buffer): Record<string, string> {
  const out: Record<string, string> = {};
  let off = 4;
  const str = () => {
    const n = b.readUInt32BE(off);
    const s = b.subarray(off + 4, off + 4 + n).toString('utf8');
    off += 4 + n;
    return s;
  };
  for (let i = b.readUInt32BE(0); i > 0; i--) {
    const k = str().toLowerCase();
    out[k] = str().split('\0')[0];
  }
  return out;
}

function controlFrame(type: number, flags: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(8);
  h.writeUInt16BE(0x8000 | 3, 0);
  h.writeUInt16BE(type, 2);
  h.writeUInt32BE(payload.length, 4);
  h[4] = flags;
  return Buffer.concat([h, payload]);
}

/** Emits 'stream' (SpdyStream), 'reset' (stream id), 'close'. */
class SpdyServerSession extends EventEmitter {
  private buf: Buffer = Buffer.alloc(0);
  private queue: Promise<void> = Promise.resolve();
  private readonly inflate = new HeaderZ(zlib.createInflate({ dictionary: SPDY3_DICTIONARY }));
  private readonly deflate = new HeaderZ(zlib.createDeflate({ dictionary: SPDY3_DICTIONARY }));
  private deflating: Promise<unknown> = Promise.resolve();
  private readonly streams = new Map<number, SpdyStream>();
  private lastStreamId = 0;
  closed = false;

  constructor(readonly socket: Duplex, head: Buffer) {
    super();
    socket.on('data', (c: Buffer) => this.receive(c));
    socket.on('error', () => socket.destroy());
    socket.on('close', () => {
      this.closed = true;
      for (const s of this.streams.values()) s.incoming.end();
      this.emit('close');
    });
    if (head.length) this.receive(head);
  }

  private receive(chunk: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    while (this.buf.length >= 8) {
      const len = this.buf.readUIntBE(5, 3);
      if (this.buf.length < 8 + len) break;
      const frame = this.buf.subarray(0, 8 + len);
      this.buf = this.buf.subarray(8 + len);
      this.queue = this.queue.then(() => this.handle(frame)).catch((e: Error) => {
        this.emit('protocolError', e);
        this.socket.destroy();
      });
    }
  }

  private async handle(frame: Buffer): Promise<void> {
    const flags = frame[4];
    const payload = frame.subarray(8);
    if ((frame[0] & 0x80) === 0) {
      const s = this.streams.get(frame.readUInt32BE(0) & 0x7fffffff);
      if (!s) return;
      if (payload.length) s.incoming.write(Buffer.from(payload));
      if (flags & FLAG_FIN) s.incoming.end();
      return;
    }
    const version = frame.readUInt16BE(0) & 0x7fff;
    if (version !== 3) throw new Error(`SPDY version ${version} (only 3.1 is served)`);
    switch (frame.readUInt16BE(2)) {
      case SYN_STREAM: {
        const id = payload.readUInt32BE(0) & 0x7fffffff;
        const headers = parseHeaderBlock(await this.inflate.run(payload.subarray(10)));
        const s: SpdyStream = { id, headers, incoming: new PassThrough() };
        this.lastStreamId = id;
        this.streams.set(id, s);
        if (flags & FLAG_FIN) s.incoming.end();
        this.emit('stream', s);
        return;
      }
      // Their header blocks still pass through the inflater: the zlib context is the connection's.
      case SYN_REPLY:
        await this.inflate.run(payload.subarray(4));
        return;
      case HEADERS:
        await this.inflate.run(payload.subarray(4));
        return;
      case RST_STREAM: {
        const id = payload.readUInt32BE(0) & 0x7fffffff;
        this.streams.get(id)?.incoming.end();
        this.emit('reset', id);
        return;
      }
      case PING:
        this.socket.write(frame);
        return;
      case GOAWAY:
        this.emit('goaway');
        return;
      default:
        // SETTINGS, WINDOW_UPDATE: nothing to do for a peer that does no flow control.
        return;
    }
  }

  /** SYN_REPLY with no headers; replies go out in the order their header blocks were compressed. */
  reply(s: SpdyStream): Promise<void> {
    const p = this.deflating.then(async () => {
      const block = await this.deflate.run(Buffer.alloc(4));
      const id = Buffer.alloc(4);
      id.writeUInt32BE(s.id);
      this.socket.write(controlFrame(SYN_REPLY, 0, Buffer.concat([id, block])));
    });
    this.deflating = p.catch(() => undefined);
    return p;
  }

  /** Writes data on a stream; false when the socket wants a 'drain' first. */
  data(s: SpdyStream, bytes: Buffer, fin = false): boolean {
    if (this.closed) return true;
    let ok = true;
    let off = 0;
    do {
      const part = bytes.subarray(off, off + MAX_DATA);
      off += part.length;
      const h = Buffer.alloc(8);
      h.writeUInt32BE(s.id & 0x7fffffff, 0);
      h.writeUInt32BE(part.length, 4);
      h[4] = fin && off >= bytes.length ? FLAG_FIN : 0;
      ok = this.socket.write(Buffer.concat([h, part])) && ok;
    } while (off < bytes.length);
    return ok;
  }

  goAway(): void {
    if (this.closed) return;
    const p = Buffer.alloc(8);
    p.writeUInt32BE(this.lastStreamId, 0);
    this.socket.write(controlFrame(GOAWAY, 0, p));
  }
}

// ---------------------------------------------------------------------------------------------
// The exec endpoint.

export interface KubeletExecOptions {
  /** The podman container that runs a pod's container (undefined: no such pod or container here). */
  resolve: (namespace: string, pod: string, container: string) => string | undefined;
  /**
   * PEM of the CA whose client certificates may call (the API server's --kubelet-client-certificate
   * comes from KubeCluster.clientCaFile); default: this module's own CA (kubeletTestPki's client).
   */
  clientCa?: string;
}

export interface KubeletExec {
  port: number;
  /** The CA of the serving certificate, base64 of its PEM (kubeconfig's certificate-authority-data form). */
  caData: string;
  stop(): Promise<void>;
}

interface ExecRequestLine {
  namespace: string;
  pod: string;
  container: string;
  command: string[];
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(message);
  }
}

const STATUS_TEXT: Record<number, string> = { 400: 'Bad Request', 403: 'Forbidden', 404: 'Not Found', 405: 'Method Not Allowed' };

/** The kubelet's /exec/{namespace}/{pod}[/{uid}]/{container}?command=..&input=1&output=1&error=1&tty=1 */
function parseExecRequest(req: IncomingMessage): ExecRequestLine {
  const url = new URL(req.url ?? '/', 'https://kubelet');
  const parts = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
  if (parts[0] !== 'exec' || (parts.length !== 4 && parts.length !== 5)) throw new HttpError(404, `not found: ${url.pathname}`);
  if (req.method !== 'POST' && req.method !== 'GET') throw new HttpError(405, `method ${req.method} not allowed`);
  const [, namespace, pod] = parts;
  const container = parts[parts.length - 1];
  const command = url.searchParams.getAll('command');
  if (command.length === 0 || command[0] === '') throw new HttpError(400, 'command: at least one command argument is required');
  const flag = (k: string) => url.searchParams.get(k) === '1';
  const tty = flag('tty');
  const opts = { stdin: flag('input'), stdout: flag('output'), stderr: flag('error') && !tty, tty };
  if (!opts.stdin && !opts.stdout && !opts.stderr) throw new HttpError(400, 'you must specify at least 1 of stdin, stdout, stderr');
  return { namespace, pod, container, command, ...opts };
}

function negotiate(req: IncomingMessage): string {
  const offered = (req.headers['x-stream-protocol-version'] as string | string[] | undefined) ?? [];
  const client = (Array.isArray(offered) ? offered : [offered]).flatMap((v) => v.split(',')).map((v) => v.trim()).filter(Boolean);
  const chosen = client.find((p) => PROTOCOLS.includes(p));
  if (!chosen) {
    throw new HttpError(403, `unable to upgrade: unable to negotiate protocol: client supports ${JSON.stringify(client)}, server supports ${JSON.stringify(PROTOCOLS)}`, {
      'X-Accepted-Stream-Protocol-Versions': PROTOCOLS.join(', '),
    });
  }
  return chosen;
}

function writeHttpError(socket: Duplex, e: HttpError): void {
  const body = `${e.message}\n`;
  const extra = Object.entries(e.headers).map(([k, v]) => `${k}: ${v}\r\n`).join('');
  socket.end(`HTTP/1.1 ${e.status} ${STATUS_TEXT[e.status] ?? 'Error'}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n${extra}Connection: close\r\n\r\n${body}`);
}

/** The v4 status the kubelet writes on the error stream (kubelet remotecommand/exec.go). */
export function execStatus(exitCode: number | null, command: string[], signal?: string | null): object {
  if (exitCode === 0) return { metadata: {}, status: 'Success' };
  if (exitCode === null) {
    return { metadata: {}, status: 'Failure', message: `Internal error occurred: error executing command in container: killed by ${signal ?? 'a signal'}`, reason: 'InternalError', code: 500 };
  }
  return {
    metadata: {},
    status: 'Failure',
    message: `command terminated with non-zero exit code: error executing command ${JSON.stringify(command)}, exit code ${exitCode}`,
    reason: 'NonZeroExitCode',
    details: { causes: [{ reason: 'ExitCode', message: String(exitCode) }] },
  };
}

/** Starts the exec endpoint on 127.0.0.1 (a random port). */
export async function startKubeletExec(opts: KubeletExecOptions): Promise<KubeletExec> {
  const p = testPki();
  const sockets = new Set<Duplex>();
  const running = new Set<() => Promise<void>>();
  const server = https.createServer({ key: p.serverKey, cert: p.serverCert, ca: opts.clientCa ?? p.ca, requestCert: true, rejectUnauthorized: true }, (req, res) => {
    // Exec is an upgrade; anything else the kubelet serves is not played here.
    res.writeHead(req.url?.startsWith('/exec/') ? 400 : 404, { 'Content-Type': 'text/plain' });
    res.end(req.url?.startsWith('/exec/') ? 'Upgrade request required\n' : 'not found\n');
  });
  server.on('connection', (s: Duplex) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    let line: ExecRequestLine;
    let protocol: string;
    let container: string;
    try {
      line = parseExecRequest(req);
      if (!/\bupgrade\b/i.test(String(req.headers.connection ?? '')) || String(req.headers.upgrade ?? '').toLowerCase() !== 'spdy/3.1') {
        throw new HttpError(400, 'unable to upgrade: missing upgrade headers in request');
      }
      protocol = negotiate(req);
      const found = opts.resolve(line.namespace, line.pod, line.container);
      if (!found) throw new HttpError(404, `container ${JSON.stringify(line.container)} of pod ${line.namespace}/${line.pod} is not running on this node`);
      container = found;
    } catch (e) {
      writeHttpError(socket, e instanceof HttpError ? e : new HttpError(400, String(e)));
      return;
    }
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${protocol}\r\n\r\n`);
    const session = new SpdyServerSession(socket, head);
    const abort = serveExec(session, line, container);
    running.add(abort);
    session.on('close', () => running.delete(abort));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as { port: number }).port;
  return {
    port,
    caData: Buffer.from(p.ca).toString('base64'),
    async stop() {
      await Promise.all([...running].map((a) => a()));
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** Waits for the client's streams, runs the command, streams it; returns what ends it early. */
function serveExec(session: SpdyServerSession, line: ExecRequestLine, container: string): () => Promise<void> {
  const streams = new Map<string, SpdyStream>();
  const expected = 1 + Number(line.stdin) + Number(line.stdout) + Number(line.stderr) + Number(line.tty);
  let child: ChildProcess | undefined;
  let finished = false;
  const id = newExecId();
  let aborting: Promise<void> | undefined;
  const abort = (): Promise<void> => {
    if (finished) return Promise.resolve();
    aborting ??= (async () => {
      if (child) {
        // Killing the podman client would leave the command running in the container.
        await killExecInContainer('podman', container, id, 'KILL');
        killProcessGroup(child.pid);
      }
      session.socket.destroy();
    })();
    return aborting;
  };

  const timer = setTimeout(() => session.socket.destroy(), STREAM_CREATION_TIMEOUT_MS);
  session.on('stream', (s: SpdyStream) => {
    const type = s.headers.streamtype;
    if (!['error', 'stdin', 'stdout', 'stderr', 'resize'].includes(type) || streams.has(type)) {
      session.socket.destroy();
      return;
    }
    streams.set(type, s);
    void session.reply(s).then(() => {
      if (streams.size === expected && !child) {
        clearTimeout(timer);
        start();
      }
    });
  });
  session.on('reset', () => void abort());
  session.on('close', () => {
    clearTimeout(timer);
    void abort();
  });

  const start = () => {
    const tty = line.tty ? { cols: 80, rows: 24 } : undefined;
    // Under a tty, script(1) makes the terminal inside the container and resizes arrive on fd 3
    // (the podman provider's session wrapper, activities/sandbox/session.ts).
    const inner = tty ? ['/bin/sh', '-c', `exec ${CONTROL_FD}<&3 3<&-\n${CONTROLLER}`, 'slipway-session', terminalCommandLine(line.command, tty)] : line.command;
    const args = [
      'exec', ...(line.stdin || tty ? ['-i'] : []), ...(tty ? ['--preserve-fds', '1', '--env', 'TERM=xterm-256color'] : []),
      container, ...execWrapper(id, inner),
    ];
    const c = spawn('podman', args, {
      env: engineEnv(),
      detached: true,
      stdio: [line.stdin || tty ? 'pipe' : 'ignore', line.stdout ? 'pipe' : 'ignore', line.stderr ? 'pipe' : 'ignore', ...(tty ? ['pipe' as const] : [])],
    });
    child = c;
    const stdin = streams.get('stdin');
    if (c.stdin) {
      c.stdin.on('error', () => undefined);
      if (stdin) stdin.incoming.pipe(c.stdin);
      else c.stdin.end();
    }
    const resize = streams.get('resize');
    const control = tty ? ((c.stdio as unknown as Array<Writable | null>)[3] ?? undefined) : undefined;
    if (resize && control) {
      control.on('error', () => undefined);
      let pending = '';
      resize.incoming.on('data', (d: Buffer) => {
        // Go's json.Encoder: one {"Width":..,"Height":..} object per line.
        pending += d.toString('utf8');
        const lines = pending.split('\n');
        pending = lines.pop() ?? '';
        for (const l of lines) {
          if (!l.trim()) continue;
          try {
            // Go's decoder matches field names case-insensitively; so does this.
            const o = JSON.parse(l) as Record<string, unknown>;
            const size = checkSize(o.Width ?? o.width, o.Height ?? o.height, 'resize');
            control.write(`${size.rows} ${size.cols}\n`);
          } catch {
            // A malformed resize is dropped, as the kubelet's decoder stops on it.
          }
        }
      });
    }
    const pipeOut = (from: Readable | null, to: SpdyStream | undefined) =>
      new Promise<void>((resolve) => {
        if (!from || !to) return resolve();
        from.on('data', (d: Buffer) => {
          if (!session.data(to, d)) {
            from.pause();
            session.socket.once('drain', () => from.resume());
          }
        });
        from.on('end', () => {
          session.data(to, Buffer.alloc(0), true);
          resolve();
        });
        from.on('error', () => resolve());
      });
    const outputs = Promise.all([pipeOut(c.stdout, streams.get('stdout')), pipeOut(c.stderr, streams.get('stderr'))]);
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
      c.once('exit', (code, signal) => resolve({ code, signal }));
      c.once('error', () => resolve({ code: null, signal: null }));
    });
    void Promise.all([exited, outputs]).then(([{ code, signal }]) => {
      if (aborting || session.closed) return;
      finished = true;
      const err = streams.get('error');
      if (err) session.data(err, Buffer.from(JSON.stringify(execStatus(code, line.command, signal))), true);
      // The client closes the connection once it has read the status (closing first could
      // drop frames it has not handled yet: spdystream drains its queues on EOF).
      session.goAway();
    });
  };
  return abort;
}
