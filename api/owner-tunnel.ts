/**
 * The API's end of owner tunnels (docs/adr/0028, activities/service/tunnel.ts): it waits for the
 * owner of a sandbox on another host to dial in with the tunnel's proof, accepts each tunnel id
 * once, and turns the WebSocket into what the direct path has: a `SandboxSession` (WebSocket
 * sessions, SSH) or a byte stream to a port (previews).
 */
import type { IncomingMessage } from 'node:http';
import { Duplex, PassThrough, Writable } from 'node:stream';
import WebSocket, { WebSocketServer } from 'ws';
import { FRAME, frame, proofMatches, TUNNEL_PATH, type TunnelEnd } from '../activities/service/tunnel';
import type { SandboxSession, SessionExit } from '../activities/sandbox/provider';

interface Pending {
  resolve: (ws: WebSocket) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout;
}

export class TunnelBroker {
  private readonly pending = new Map<string, Pending>();
  private readonly wss = new WebSocketServer({ noServer: true, perMessageDeflate: false, maxPayload: 4 * 1024 * 1024 });

  /** `url`: where owners reach this process (`--tunnel-url`, else the API's own listen address). */
  constructor(
    private readonly key: Buffer,
    public url?: string,
  ) {}

  /** Waits for the owner to dial `tunnelId` (once); rejects after `timeoutMs`. */
  expect(tunnelId: string, timeoutMs: number): Promise<WebSocket> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(tunnelId);
        reject(new Error(`the owner did not open tunnel ${tunnelId} within ${Math.round(timeoutMs / 1000)} s`));
      }, timeoutMs);
      this.pending.set(tunnelId, { resolve, reject, timer });
    });
  }

  cancel(tunnelId: string): void {
    const p = this.pending.get(tunnelId);
    if (!p) return;
    clearTimeout(p.timer);
    this.pending.delete(tunnelId);
  }

  /**
   * Takes an upgrade on the tunnel path (true), answering anything else it refuses itself: an id
   * not awaited (unknown, already used, expired) 404, a wrong proof 401. Not its path: false.
   */
  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean {
    const url = (req.url ?? '').split('?')[0]!;
    if (!url.startsWith(TUNNEL_PATH)) return false;
    let tunnelId: string;
    try {
      tunnelId = decodeURIComponent(url.slice(TUNNEL_PATH.length));
    } catch {
      tunnelId = '';
    }
    const refuse = (status: string) => {
      socket.on('error', () => undefined);
      socket.end(`HTTP/1.1 ${status}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
    };
    const p = this.pending.get(tunnelId);
    if (!p) return refuse('404 Not Found'), true;
    const auth = req.headers.authorization;
    if (!proofMatches(this.key, tunnelId, auth?.startsWith('Bearer ') ? auth.slice(7) : undefined)) return refuse('401 Unauthorized'), true;
    // Single use: the id is gone before the handshake completes.
    this.cancel(tunnelId);
    this.wss.handleUpgrade(req, socket, head, (ws) => p.resolve(ws));
    return true;
  }
}

/** A session whose command runs on the owner: frames in, frames out. */
export class TunnelSession implements SandboxSession {
  readonly pid = undefined;
  readonly stdout = new PassThrough();
  readonly stderr = new PassThrough();
  readonly stdin: Writable;
  readonly exit: Promise<SessionExit>;

  constructor(
    private readonly ws: WebSocket,
    readonly pty: boolean,
    /** Told why the tunnel closed without an exit frame (the owner gone mid-session, ...). */
    whyClosed: () => Promise<string>,
  ) {
    this.stdin = new Writable({
      write: (chunk: Buffer, _e, cb) => this.send(FRAME.data, chunk, cb),
      final: (cb) => this.send(FRAME.end, undefined, cb),
    });
    let end: TunnelEnd | undefined;
    const out = (s: PassThrough, data: Buffer) => {
      // A slow client: stop reading the tunnel, so the owner's output waits there (and the command with it).
      if (!s.write(data)) {
        ws.pause();
        s.once('drain', () => ws.resume());
      }
    };
    ws.on('message', (d: Buffer) => {
      if (d[0] === FRAME.stdout) out(this.stdout, d.subarray(1));
      else if (d[0] === FRAME.stderr) out(this.stderr, d.subarray(1));
      else if (d[0] === FRAME.exit) end = JSON.parse(d.subarray(1).toString()) as TunnelEnd;
    });
    ws.on('error', () => undefined);
    this.exit = new Promise<SessionExit>((resolve) => {
      ws.once('close', () => {
        void (async () => {
          if (!end) this.stderr.write(`\nslipway: ${await whyClosed()}\n`);
          this.stdout.end();
          this.stderr.end();
          resolve(end ? { exitCode: end.exitCode, signal: end.signal as NodeJS.Signals | null } : { exitCode: null, signal: null });
        })();
      });
    });
  }

  private send(type: number, body: Buffer | undefined, cb: (e?: Error | null) => void = () => undefined): void {
    if (this.ws.readyState !== WebSocket.OPEN) return cb();
    this.ws.send(frame(type, body), (e) => cb(e ?? null));
  }

  resize(cols: number, rows: number): void {
    this.send(FRAME.resize, Buffer.from(JSON.stringify({ cols, rows })));
  }

  signal(sig: NodeJS.Signals): void {
    this.send(FRAME.signal, Buffer.from(sig));
  }

  kill(): void {
    this.send(FRAME.kill, undefined);
    // The owner kills the command once the tunnel closes, whether or not the frame arrived.
    setTimeout(() => this.ws.terminate(), 2_000).unref();
  }
}

/** A connection to a port inside a sandbox on the owner, as the stream `connectPort` gives directly. */
export function tunnelStream(ws: WebSocket): Duplex {
  const stream = new Duplex({
    read: () => ws.resume(),
    write: (chunk: Buffer, _e, cb) => (ws.readyState === WebSocket.OPEN ? ws.send(frame(FRAME.data, chunk), (e) => cb(e ?? null)) : cb(new Error('the tunnel closed'))),
    final: (cb) => (ws.readyState === WebSocket.OPEN ? ws.send(frame(FRAME.end), (e) => cb(e ?? null)) : cb()),
    destroy: (err, cb) => {
      ws.terminate();
      cb(err);
    },
  });
  ws.on('message', (d: Buffer) => {
    if (d[0] === FRAME.data && !stream.push(d.subarray(1))) ws.pause();
    else if (d[0] === FRAME.end) stream.push(null);
  });
  ws.on('error', (e) => stream.destroy(e));
  ws.once('close', () => {
    // What arrived stays readable; nothing more can be written.
    stream.push(null);
    stream.end();
  });
  return stream;
}
