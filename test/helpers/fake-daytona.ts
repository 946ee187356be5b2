/**
 * A local fake of Daytona's HTTP API, written from the routes and shapes the SDK's generated
 * clients use (@daytona/api-client: /sandbox..., @daytona/toolbox-api-client: /process/session...,
 * /files/bulk-upload, /files/bulk-download, DELETE /files). The real SDK talks to it over HTTP
 * on 127.0.0.1, so the SDK's own code path runs.
 *
 * It keeps state (sandboxes, their states, labels, files) and runs commands as real processes
 * in a temporary directory per sandbox, which stands for the sandbox's home directory. It is a
 * test fake of a remote VM: its commands are NOT confined beyond that working directory (they
 * run on this host as this user). Failures can be injected per route (quota, 429 with a reset,
 * 404, 5xx).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, promises as fs, realpathSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import busboy from 'busboy';
import { WebSocketServer, type WebSocket } from 'ws';
import { CONTROL_FD, CONTROLLER, terminalCommandLine } from '../../activities/sandbox/session';

/** Daytona's log stream marks each chunk with these (SDK Process.STDOUT_PREFIX_BYTES / STDERR_PREFIX_BYTES). */
const STDOUT_PREFIX = Buffer.from([1, 1, 1]);
const STDERR_PREFIX = Buffer.from([2, 2, 2]);
/** The subprotocol the SDK offers for PTY exit reports (Process.PTY_EXIT_CONTROL_SUBPROTOCOL). */
const PTY_EXIT_CONTROL = 'X-Daytona-Pty-Exit-Control';
const PTY_ENVS = 'X-Daytona-Pty-Envs~';

export type FakeState = 'started' | 'stopped' | 'archived' | 'destroyed' | 'error' | 'snapshotting';

/** Daytona's SnapshotState values the fake goes through (OpenAPI SnapshotDto.state). */
export type FakeSnapshotState = 'pending' | 'building' | 'active' | 'error';

export interface FakeSnapshot {
  id: string;
  name: string;
  state: FakeSnapshotState;
  errorReason: string | null;
  /** The sandbox it was taken from (POST /sandbox/{id}/snapshot). */
  sourceSandboxId: string | null;
  /** A copy of that sandbox's home directory: sandboxes created from the snapshot start with it. */
  dir: string;
  createdAt: string;
}

interface FakeCommand {
  id: string;
  command: string;
  child: ChildProcess;
  stdout: string;
  stderr: string;
  exitCode?: number;
}

interface FakePty {
  id: string;
  child: ChildProcess;
  cols: number;
  rows: number;
}

export interface FakeSandbox {
  id: string;
  name: string;
  state: FakeState;
  labels: Record<string, string>;
  snapshot?: string;
  /** What the create asked for (Daytona's networkBlockAll): the sandbox has no outbound network. */
  networkBlockAll: boolean;
  env: Record<string, string>;
  autoStopInterval?: number;
  autoDeleteInterval?: number;
  target: string;
  /** The sandbox's home directory on this host. */
  home: string;
  sessions: Map<string, Map<string, FakeCommand>>;
  ptys: Map<string, FakePty>;
  createdAt: string;
}

export interface InjectedFailure {
  method?: string;
  /** Matched against the request path (after /api or /toolbox/<id>). */
  path: RegExp;
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
  /** How many requests it fails (default 1). */
  times?: number;
}

export class FakeDaytona {
  readonly apiKey = `fake-${randomBytes(8).toString('hex')}`;
  readonly sandboxes = new Map<string, FakeSandbox>();
  /** Snapshots taken from sandboxes, by name. A create naming a snapshot not here is taken as one of Daytona's own (an empty home). */
  readonly snapshots = new Map<string, FakeSnapshot>();
  /** Set: the next snapshot build ends in `error` with this reason (Daytona's errorReason). */
  failNextSnapshot?: string;
  /** How long each snapshot state (pending, building) lasts, so callers see them go by. */
  snapshotStepMs = 150;
  /** Called after GET /files/info answered (a test changes the file between a stat and its download). */
  afterFileInfo?: (file: string) => Promise<void>;
  /** Every request as `METHOD path` (for assertions on what the provider called). */
  readonly requests: string[] = [];
  private failures: InjectedFailure[] = [];
  private server?: http.Server;
  private readonly dir = realpathSync(mkdtempSync(path.join(os.tmpdir(), 'slipway-fake-daytona-')));
  url = '';

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      this.handle(req, res).catch((e: Error) => send(res, 500, { statusCode: 500, message: `fake daytona: ${e.message}` }));
    });
    // The toolbox's WebSocket routes: PTY create-connect and the followed command logs.
    const wss = new WebSocketServer({ noServer: true, handleProtocols: (offered) => (offered.has(PTY_EXIT_CONTROL) ? PTY_EXIT_CONTROL : false) });
    this.server.on('upgrade', (req, socket, head) => {
      // An upgraded socket has no error handler of node's: a client's reset after a refusal
      // (ECONNRESET) would be an uncaught exception in the test process.
      socket.on('error', () => socket.destroy());
      const url = new URL(req.url ?? '/', 'http://x');
      this.requests.push(`WS ${url.pathname}`);
      const refuse = (status: number, message: string) => {
        socket.end(`HTTP/1.1 ${status} ${message}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`);
      };
      if (req.headers.authorization !== `Bearer ${this.apiKey}`) return refuse(401, 'Unauthorized');
      const tb = /^\/toolbox\/([^/]+)(\/.*)$/.exec(url.pathname);
      const s = tb ? this.sandboxes.get(tb[1]) : undefined;
      if (!tb || !s) return refuse(404, 'Not Found');
      if (s.state !== 'started') return refuse(409, 'Conflict');
      const logs = /^\/process\/session\/([^/]+)\/command\/([^/]+)\/logs$/.exec(tb[2]);
      const c = logs ? s.sessions.get(logs[1])?.get(logs[2]) : undefined;
      if (tb[2] === '/process/pty/create-connect') {
        wss.handleUpgrade(req, socket, head, (ws) => this.ptyConnect(s, url, req.headers['sec-websocket-protocol'] ?? '', ws));
      } else if (c) {
        wss.handleUpgrade(req, socket, head, (ws) => followLogs(c, ws));
      } else refuse(404, 'Not Found');
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    const { port } = this.server.address() as { port: number };
    this.url = `http://127.0.0.1:${port}/api`;
    return this;
  }

  async stop(): Promise<void> {
    for (const s of this.sandboxes.values()) killAll(s);
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
    this.server?.closeAllConnections();
    await fs.rm(this.dir, { recursive: true, force: true });
  }

  /** The environment a worker needs to reach this fake. */
  env(): Record<string, string> {
    return { DAYTONA_API_KEY: this.apiKey, DAYTONA_API_URL: this.url, DAYTONA_TARGET: 'fake' };
  }

  clearFailures(): void {
    this.failures = [];
  }

  inject(failure: InjectedFailure): void {
    this.failures.push({ times: 1, ...failure });
  }

  /** Changes a sandbox's state as Daytona would on its own (auto-stop, archive, a delete elsewhere). */
  setState(id: string, state: FakeState): void {
    const s = this.sandboxes.get(id);
    if (!s) throw new Error(`no fake sandbox ${id}`);
    if (state !== 'started') killAll(s);
    if (state === 'destroyed') this.sandboxes.delete(id);
    s.state = state;
  }

  private find(idOrName: string): FakeSandbox | undefined {
    return this.sandboxes.get(idOrName) ?? [...this.sandboxes.values()].find((s) => s.name === idOrName);
  }

  private snapshotDto(n: FakeSnapshot) {
    const at = n.createdAt;
    return {
      id: n.id,
      organizationId: 'fake-org',
      general: false,
      name: n.name,
      imageName: `fake/${n.name}`,
      state: n.state,
      size: null,
      entrypoint: null,
      cpu: 1,
      gpu: 0,
      mem: 1,
      disk: 3,
      errorReason: n.errorReason,
      createdAt: at,
      updatedAt: new Date().toISOString(),
      lastUsedAt: null,
      sourceSandboxId: n.sourceSandboxId,
    };
  }

  private findSnapshot(idOrName: string): FakeSnapshot | undefined {
    return this.snapshots.get(idOrName) ?? [...this.snapshots.values()].find((n) => n.id === idOrName);
  }

  /** Daytona's snapshot of a running sandbox: the sandbox is `snapshotting` while its files are copied; the snapshot goes pending, building, then active (or error). */
  private async takeSnapshot(s: FakeSandbox, name: string): Promise<FakeSnapshot> {
    const n: FakeSnapshot = { id: randomUUID(), name, state: 'pending', errorReason: null, sourceSandboxId: s.id, dir: path.join(this.dir, 'snapshots', randomUUID()), createdAt: new Date().toISOString() };
    this.snapshots.set(name, n);
    s.state = 'snapshotting';
    const fail = this.failNextSnapshot;
    this.failNextSnapshot = undefined;
    const step = () => new Promise((r) => setTimeout(r, this.snapshotStepMs));
    void (async () => {
      await step();
      n.state = 'building';
      await fs.mkdir(path.dirname(n.dir), { recursive: true });
      await fs.cp(s.home, n.dir, { recursive: true, verbatimSymlinks: true });
      await step();
      if (s.state === 'snapshotting') s.state = 'started';
      if (fail) Object.assign(n, { state: 'error', errorReason: fail });
      else n.state = 'active';
    })().catch((e: Error) => Object.assign(n, { state: 'error', errorReason: `fake daytona: ${e.message}` }));
    return n;
  }

  private dto(s: FakeSandbox) {
    return {
      id: s.id,
      organizationId: 'fake-org',
      name: s.name,
      snapshot: s.snapshot,
      user: 'daytona',
      env: s.env,
      labels: s.labels,
      public: false,
      networkBlockAll: s.networkBlockAll,
      target: s.target,
      cpu: 1,
      gpu: 0,
      memory: 1,
      disk: 3,
      state: s.state,
      desiredState: s.state,
      autoStopInterval: s.autoStopInterval,
      autoDeleteInterval: s.autoDeleteInterval,
      createdAt: s.createdAt,
      updatedAt: new Date().toISOString(),
      toolboxProxyUrl: this.url.replace(/\/api$/, '/toolbox'),
    };
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const method = req.method ?? 'GET';
    this.requests.push(`${method} ${url.pathname}`);
    if (req.headers.authorization !== `Bearer ${this.apiKey}`) return send(res, 401, { statusCode: 401, message: 'Unauthorized' });
    const injected = this.failures.find((f) => (!f.method || f.method === method) && f.path.test(url.pathname));
    if (injected) {
      if (--injected.times! <= 0) this.failures.splice(this.failures.indexOf(injected), 1);
      return send(res, injected.status, injected.body ?? { statusCode: injected.status, message: `injected ${injected.status}` }, injected.headers);
    }
    const api = /^\/api(\/.*)$/.exec(url.pathname);
    if (api) return this.control(method, api[1], url, req, res);
    const tb = /^\/toolbox\/([^/]+)(\/.*)$/.exec(url.pathname);
    if (tb) {
      const s = this.sandboxes.get(tb[1]);
      if (!s) return send(res, 404, { statusCode: 404, message: `sandbox ${tb[1]} not found` });
      if (s.state !== 'started') return send(res, 409, { statusCode: 409, message: `sandbox ${s.id} is ${s.state}` });
      return this.toolbox(s, method, tb[2], url, req, res);
    }
    send(res, 404, { statusCode: 404, message: `no route ${method} ${url.pathname}` });
  }

  private async control(method: string, route: string, url: URL, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (method === 'POST' && route === '/sandbox') {
      const body = JSON.parse(await readBody(req)) as { name?: string; snapshot?: string; labels?: Record<string, string>; env?: Record<string, string>; autoStopInterval?: number; autoDeleteInterval?: number; target?: string; networkBlockAll?: boolean };
      const from = body.snapshot ? this.snapshots.get(body.snapshot) : undefined;
      if (from && from.state !== 'active') return send(res, 400, { statusCode: 400, message: `Snapshot ${from.name} is ${from.state}`, error: 'Bad Request' });
      const id = randomUUID();
      const home = path.join(this.dir, id);
      if (from) await fs.cp(from.dir, home, { recursive: true, verbatimSymlinks: true });
      await fs.mkdir(home, { recursive: true });
      const s: FakeSandbox = {
        id,
        name: body.name ?? id,
        state: 'started',
        labels: body.labels ?? {},
        snapshot: body.snapshot,
        networkBlockAll: body.networkBlockAll === true,
        env: body.env ?? {},
        autoStopInterval: body.autoStopInterval,
        autoDeleteInterval: body.autoDeleteInterval,
        target: body.target ?? 'us',
        home,
        sessions: new Map(),
        ptys: new Map(),
        createdAt: new Date().toISOString(),
      };
      this.sandboxes.set(id, s);
      return send(res, 200, this.dto(s));
    }
    if (method === 'GET' && route === '/sandbox') {
      const labels = url.searchParams.get('labels');
      const want = labels ? (JSON.parse(labels) as Record<string, string>) : {};
      const items = [...this.sandboxes.values()].filter((s) => Object.entries(want).every(([k, v]) => s.labels[k] === v)).map((s) => this.dto(s));
      return send(res, 200, { items, total: items.length, page: 1, totalPages: 1, nextCursor: null });
    }
    if (method === 'GET' && route === '/snapshots') {
      const items = [...this.snapshots.values()].map((n) => this.snapshotDto(n));
      return send(res, 200, { items, total: items.length, page: 1, totalPages: 1 });
    }
    const snap = /^\/snapshots\/([^/]+)$/.exec(route);
    if (snap) {
      const n = this.findSnapshot(decodeURIComponent(snap[1]));
      if (!n) return send(res, 404, { statusCode: 404, message: `Snapshot ${snap[1]} not found`, error: 'Not Found' });
      if (method === 'GET') return send(res, 200, this.snapshotDto(n));
      if (method === 'DELETE') {
        this.snapshots.delete(n.name);
        await fs.rm(n.dir, { recursive: true, force: true });
        return send(res, 200, {});
      }
    }
    const one = /^\/sandbox\/([^/]+)(\/[a-z-]+)?$/.exec(route);
    const s = one ? this.find(decodeURIComponent(one[1])) : undefined;
    if (one && !s) return send(res, 404, { statusCode: 404, message: `Sandbox with ID or name ${one[1]} not found`, error: 'Not Found' });
    if (s && one) {
      const action = one[2];
      if (method === 'GET' && !action) return send(res, 200, this.dto(s));
      if (method === 'GET' && action === '/toolbox-proxy-url') return send(res, 200, { url: this.url.replace(/\/api$/, '/toolbox') });
      if (method === 'DELETE' && !action) {
        killAll(s);
        this.sandboxes.delete(s.id);
        s.state = 'destroyed';
        await fs.rm(s.home, { recursive: true, force: true });
        return send(res, 200, this.dto(s));
      }
      if (method === 'POST' && action === '/stop') {
        killAll(s);
        s.state = 'stopped';
        return send(res, 200, this.dto(s));
      }
      if (method === 'POST' && action === '/snapshot') {
        const { name } = JSON.parse(await readBody(req)) as { name?: string };
        if (!name) return send(res, 400, { statusCode: 400, message: 'name must be a string', error: 'Bad Request' });
        if (this.snapshots.has(name)) return send(res, 409, { statusCode: 409, message: `Snapshot with name ${name} already exists`, error: 'Conflict' });
        if (s.state !== 'started') return send(res, 400, { statusCode: 400, message: `Sandbox ${s.id} is ${s.state}`, error: 'Bad Request' });
        await this.takeSnapshot(s, name);
        return send(res, 200, this.dto(s));
      }
      if (method === 'POST' && action === '/start') {
        s.state = 'started';
        return send(res, 200, this.dto(s));
      }
    }
    send(res, 404, { statusCode: 404, message: `no route ${method} /api${route}` });
  }

  private async toolbox(s: FakeSandbox, method: string, route: string, url: URL, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (method === 'POST' && route === '/process/execute') {
      const body = JSON.parse(await readBody(req)) as { command: string; cwd?: string };
      const c = this.run(s, body.command, body.cwd);
      await new Promise((r) => c.child.on('close', r));
      return send(res, 200, { exitCode: c.exitCode, result: c.stdout + c.stderr });
    }
    if (method === 'POST' && route === '/process/session') {
      const { sessionId } = JSON.parse(await readBody(req)) as { sessionId: string };
      s.sessions.set(sessionId, new Map());
      return send(res, 201, {});
    }
    const pty = /^\/process\/pty\/([^/]+)(\/resize)?$/.exec(route);
    if (pty) {
      const p = s.ptys.get(pty[1]);
      if (!p) return send(res, 404, { statusCode: 404, message: `PTY session ${pty[1]} not found` });
      if (method === 'POST' && pty[2]) {
        const { cols, rows } = JSON.parse(await readBody(req)) as { cols: number; rows: number };
        Object.assign(p, { cols, rows });
        (p.child.stdio as unknown as Array<NodeJS.WritableStream | null>)[CONTROL_FD]?.write(`${rows} ${cols}\n`);
        return send(res, 200, ptyInfo(p));
      }
      if (method === 'GET' && !pty[2]) return send(res, 200, ptyInfo(p));
      if (method === 'DELETE' && !pty[2]) {
        killGroup(p.child);
        s.ptys.delete(p.id);
        return send(res, 200, {});
      }
    }
    const input = /^\/process\/session\/([^/]+)\/command\/([^/]+)\/input$/.exec(route);
    if (input && method === 'POST') {
      const c = s.sessions.get(input[1])?.get(input[2]);
      if (!c) return send(res, 404, { statusCode: 404, message: `command ${input[2]} not found` });
      const { data } = JSON.parse(await readBody(req)) as { data: string };
      if (c.exitCode !== undefined) return send(res, 400, { statusCode: 400, message: 'command has already exited' });
      c.child.stdin?.write(data);
      return send(res, 200, {});
    }
    const sess = /^\/process\/session\/([^/]+)(?:\/(exec|command\/([^/]+)(\/logs)?))?$/.exec(route);
    if (sess) {
      const session = s.sessions.get(sess[1]);
      if (!session) return send(res, 404, { statusCode: 404, message: `session ${sess[1]} not found` });
      if (method === 'DELETE' && !sess[2]) {
        for (const c of session.values()) killGroup(c.child);
        s.sessions.delete(sess[1]);
        return send(res, 204, undefined);
      }
      if (method === 'POST' && sess[2] === 'exec') {
        const body = JSON.parse(await readBody(req)) as { command: string; runAsync?: boolean; async?: boolean };
        const c = this.run(s, body.command, undefined, true);
        session.set(c.id, c);
        if (body.runAsync || body.async) return send(res, 202, { cmdId: c.id });
        await new Promise((r) => c.child.on('close', r));
        return send(res, 200, { cmdId: c.id, output: c.stdout + c.stderr, stdout: c.stdout, stderr: c.stderr, exitCode: c.exitCode });
      }
      const c = sess[3] ? session.get(sess[3]) : undefined;
      if (!c) return send(res, 404, { statusCode: 404, message: `command ${sess[3]} not found` });
      if (method === 'GET' && !sess[4]) return send(res, 200, { id: c.id, command: c.command, exitCode: c.exitCode });
      if (method === 'GET' && sess[4]) return send(res, 200, { output: c.stdout + c.stderr, stdout: c.stdout, stderr: c.stderr });
    }
    if (method === 'GET' && (route === '/files/info' || route === '/files')) {
      // Daytona's toolbox: getFileInfo stats the path (links followed), listFiles its folder's entries (not followed).
      const p = this.resolve(s, url.searchParams.get('path') ?? '.');
      const notFound = (e: NodeJS.ErrnoException) => send(res, e.code === 'ENOENT' ? 404 : 400, { statusCode: e.code === 'ENOENT' ? 404 : 400, message: `${e.code === 'ENOENT' ? 'no such file or directory' : e.message}: ${p}` });
      if (route === '/files/info') {
        const st = await fs.stat(p).catch((e: NodeJS.ErrnoException) => e);
        if (st instanceof Error) return notFound(st);
        const info = fileInfo(path.basename(p), p, st);
        await this.afterFileInfo?.(p);
        return send(res, 200, info);
      }
      const names = await fs.readdir(p).catch((e: NodeJS.ErrnoException) => e);
      if (names instanceof Error) return notFound(names);
      const items = [];
      for (const name of names) {
        const st = await fs.lstat(path.join(p, name)).catch(() => undefined);
        if (st) items.push(fileInfo(name, path.join(p, name), st));
      }
      return send(res, 200, items);
    }
    if (method === 'POST' && route === '/files/bulk-upload') return this.upload(s, req, res);
    if (method === 'POST' && route === '/files/bulk-download') {
      const { paths } = JSON.parse(await readBody(req)) as { paths: string[] };
      const boundary = `fake${randomBytes(8).toString('hex')}`;
      const parts: Buffer[] = [];
      for (const p of paths) {
        const file = this.resolve(s, p);
        const content = await fs.readFile(file).catch((e: NodeJS.ErrnoException) => e);
        const [field, type, data] = content instanceof Error
          ? ['error', 'application/json', Buffer.from(JSON.stringify({ message: content.code === 'ENOENT' ? `no such file or directory: ${p}` : content.message, statusCode: content.code === 'ENOENT' ? 404 : 500 }))]
          : ['file', 'application/octet-stream', content];
        parts.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${field}"; filename="${p}"\r\nContent-Type: ${type}\r\n\r\n`), data, Buffer.from('\r\n'));
      }
      parts.push(Buffer.from(`--${boundary}--\r\n`));
      res.writeHead(200, { 'content-type': `multipart/form-data; boundary=${boundary}` });
      return void res.end(Buffer.concat(parts));
    }
    if (method === 'DELETE' && route === '/files') {
      const p = url.searchParams.get('path') ?? '';
      await fs.rm(this.resolve(s, p), { recursive: url.searchParams.get('recursive') === 'true', force: false }).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'ENOENT') throw e;
        throw Object.assign(new Error(`no such file or directory: ${p}`), { status: 404 });
      }).then(
        () => send(res, 204, undefined),
        (e: Error & { status?: number }) => send(res, e.status ?? 400, { statusCode: e.status ?? 400, message: e.message }),
      );
      return;
    }
    send(res, 404, { statusCode: 404, message: `no route ${method} ${route}` });
  }

  /** Relative paths are relative to the sandbox's home, as Daytona's are to its working directory. */
  private resolve(s: FakeSandbox, p: string): string {
    return path.isAbsolute(p) ? p : path.join(s.home, p);
  }

  /**
   * A sandbox created with networkBlockAll runs its commands in a network namespace of their own
   * (`unshare --net`: only a loopback device, down), so outbound connections fail as they would
   * on Daytona. unshare execs without forking: the pid and process group stay the command's.
   */
  private confine(s: FakeSandbox, argv: string[]): string[] {
    if (!s.networkBlockAll) return argv;
    if (!canUnshareNet()) throw new Error('fake daytona: networkBlockAll needs `unshare --net` (util-linux, user namespaces), which does not work here');
    return ['unshare', '--net', '--map-current-user', ...argv];
  }

  private shellEnv(s: FakeSandbox): Record<string, string> {
    return { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: s.home, LANG: 'C.UTF-8', ...s.env };
  }

  /** A command; a session command keeps its stdin open for the input route (Daytona's interactive commands). */
  private run(s: FakeSandbox, command: string, cwd?: string, input = false): FakeCommand {
    const [file, ...args] = this.confine(s, ['/bin/sh', '-c', command]);
    const child = spawn(file, args, {
      cwd: cwd ? this.resolve(s, cwd) : s.home,
      env: this.shellEnv(s),
      detached: true,
      stdio: [input ? 'pipe' : 'ignore', 'pipe', 'pipe'],
    });
    child.stdin?.on('error', () => undefined);
    const c: FakeCommand = { id: randomUUID(), command, child, stdout: '', stderr: '' };
    child.stdout!.on('data', (d: Buffer) => (c.stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (c.stderr += d.toString()));
    child.on('close', (code, signal) => (c.exitCode = code ?? (signal ? 128 + (os.constants.signals[signal] ?? 9) : -1)));
    return c;
  }

  /**
   * Daytona's create-connect: a terminal running the sandbox's shell (a real PTY, from script(1)
   * as local sessions make it), its output as binary frames, input frames typed into it, a
   * `connected` control message first and `exited` with the exit code last.
   */
  private ptyConnect(s: FakeSandbox, url: URL, protocols: string, ws: WebSocket): void {
    const id = url.searchParams.get('id') ?? randomUUID();
    const cols = Number(url.searchParams.get('cols') ?? 80);
    const rows = Number(url.searchParams.get('rows') ?? 24);
    const token = protocols.split(',').map((p) => p.trim()).find((p) => p.startsWith(PTY_ENVS));
    const envs = token ? (JSON.parse(Buffer.from(token.slice(PTY_ENVS.length), 'base64url').toString()) as Record<string, string>) : {};
    const stdio: Array<'pipe' | 'ignore'> = ['pipe', 'pipe', 'pipe'];
    while (stdio.length < CONTROL_FD) stdio.push('ignore');
    stdio.push('pipe');
    const cwd = url.searchParams.get('cwd');
    const [file, ...args] = this.confine(s, ['/bin/sh', '-c', CONTROLLER, 'fake-daytona-pty', terminalCommandLine(['/bin/sh', '-i'], { cols, rows })]);
    const child = spawn(file, args, {
      cwd: cwd ? this.resolve(s, cwd) : s.home,
      env: { ...this.shellEnv(s), TERM: 'xterm-256color', ...envs },
      detached: true,
      stdio,
    });
    child.stdin!.on('error', () => undefined);
    const p: FakePty = { id, child, cols, rows };
    s.ptys.set(id, p);
    const out = (d: Buffer) => ws.readyState === ws.OPEN && ws.send(d);
    child.stdout!.on('data', out);
    child.stderr!.on('data', out);
    ws.on('message', (d: Buffer) => child.stdin!.write(d));
    ws.on('close', () => undefined);
    child.on('close', (code, signal) => {
      s.ptys.delete(id);
      if (ws.readyState !== ws.OPEN) return;
      ws.send(JSON.stringify({ type: 'control', status: 'exited', exitCode: code ?? (signal ? 128 + (os.constants.signals[signal] ?? 9) : -1) }));
      ws.close(1000);
    });
    ws.send(JSON.stringify({ type: 'control', status: 'connected' }));
  }

  private upload(s: FakeSandbox, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    return new Promise((resolve) => {
      const bb = busboy({ headers: req.headers });
      const paths = new Map<string, string>();
      const writes: Array<Promise<void>> = [];
      bb.on('field', (name, value) => paths.set(name.replace(/\.path$/, ''), value));
      bb.on('file', (name, stream, info) => {
        const chunks: Buffer[] = [];
        stream.on('data', (d: Buffer) => chunks.push(d));
        stream.on('end', () => {
          const target = this.resolve(s, paths.get(name.replace(/\.file$/, '')) ?? info.filename);
          writes.push(fs.mkdir(path.dirname(target), { recursive: true }).then(() => fs.writeFile(target, Buffer.concat(chunks))));
        });
      });
      bb.on('close', () => {
        Promise.all(writes).then(
          () => resolve(send(res, 200, {})),
          (e: Error) => resolve(send(res, 400, { statusCode: 400, message: e.message })),
        );
      });
      req.pipe(bb);
    });
  }
}

let unshareWorks: boolean | undefined;
export function canUnshareNet(): boolean {
  unshareWorks ??= spawnSync('unshare', ['--net', '--map-current-user', 'true']).status === 0;
  return unshareWorks;
}

function killGroup(child: ChildProcess): void {
  if (child.pid && child.exitCode === null) {
    try {
      process.kill(-child.pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}

function killAll(s: FakeSandbox): void {
  for (const session of s.sessions.values()) for (const c of session.values()) killGroup(c.child);
  s.sessions.clear();
  for (const p of s.ptys.values()) killGroup(p.child);
  s.ptys.clear();
}

/** Daytona's FileInfo (toolbox-api-client), its `mode` as Go's FileMode.String() writes it. */
function fileInfo(name: string, full: string, st: import('node:fs').Stats) {
  const type = st.isSymbolicLink() ? 'L' : st.isDirectory() ? 'd' : st.isFIFO() ? 'p' : st.isSocket() ? 'S' : st.isCharacterDevice() ? 'Dc' : st.isBlockDevice() ? 'D' : '-';
  const bits = 'rwxrwxrwx'.split('').map((c, i) => (st.mode & (1 << (8 - i)) ? c : '-')).join('');
  return { name, path: full, isDir: st.isDirectory(), size: st.size, mode: `${type}${bits}`, permissions: `0${(st.mode & 0o777).toString(8)}`, owner: String(st.uid), group: String(st.gid), modTime: st.mtime.toString(), modifiedAt: st.mtime.toISOString() };
}

function ptyInfo(p: FakePty) {
  return { id: p.id, cwd: '', envs: {}, cols: p.cols, rows: p.rows, createdAt: new Date().toISOString(), active: p.child.exitCode === null, lazyStart: false };
}

/** Daytona's followed logs: what the command wrote so far, then each chunk as it comes, each marked with its stream; closed when the command ends. */
function followLogs(c: FakeCommand, ws: WebSocket): void {
  const send = (prefix: Buffer, d: Buffer) => ws.readyState === ws.OPEN && d.length > 0 && ws.send(Buffer.concat([prefix, d]));
  send(STDOUT_PREFIX, Buffer.from(c.stdout));
  send(STDERR_PREFIX, Buffer.from(c.stderr));
  if (c.exitCode !== undefined) return void ws.close(1000);
  const onOut = (d: Buffer) => send(STDOUT_PREFIX, d);
  const onErr = (d: Buffer) => send(STDERR_PREFIX, d);
  c.child.stdout!.on('data', onOut);
  c.child.stderr!.on('data', onErr);
  c.child.once('close', () => ws.readyState === ws.OPEN && ws.close(1000));
  ws.on('close', () => {
    c.child.stdout!.off('data', onOut);
    c.child.stderr!.off('data', onErr);
  });
}

function send(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (body === undefined) {
    res.writeHead(status, headers);
    res.end();
    return;
  }
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
}

function readBody(req: http.IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8') || '{}'));
    req.on('error', reject);
  });
}
