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
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, promises as fs, realpathSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import busboy from 'busboy';

export type FakeState = 'started' | 'stopped' | 'archived' | 'destroyed' | 'error';

interface FakeCommand {
  id: string;
  command: string;
  child: ChildProcess;
  stdout: string;
  stderr: string;
  exitCode?: number;
}

export interface FakeSandbox {
  id: string;
  name: string;
  state: FakeState;
  labels: Record<string, string>;
  snapshot?: string;
  env: Record<string, string>;
  autoStopInterval?: number;
  autoDeleteInterval?: number;
  target: string;
  /** The sandbox's home directory on this host. */
  home: string;
  sessions: Map<string, Map<string, FakeCommand>>;
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
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    const { port } = this.server.address() as { port: number };
    this.url = `http://127.0.0.1:${port}/api`;
    return this;
  }

  async stop(): Promise<void> {
    for (const s of this.sandboxes.values()) killAll(s);
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
      networkBlockAll: false,
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
      const body = JSON.parse(await readBody(req)) as { name?: string; snapshot?: string; labels?: Record<string, string>; env?: Record<string, string>; autoStopInterval?: number; autoDeleteInterval?: number; target?: string };
      const id = randomUUID();
      const home = path.join(this.dir, id);
      await fs.mkdir(home, { recursive: true });
      const s: FakeSandbox = {
        id,
        name: body.name ?? id,
        state: 'started',
        labels: body.labels ?? {},
        snapshot: body.snapshot,
        env: body.env ?? {},
        autoStopInterval: body.autoStopInterval,
        autoDeleteInterval: body.autoDeleteInterval,
        target: body.target ?? 'us',
        home,
        sessions: new Map(),
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
        const c = this.run(s, body.command);
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

  private run(s: FakeSandbox, command: string, cwd?: string): FakeCommand {
    const child = spawn('/bin/sh', ['-c', command], {
      cwd: cwd ? this.resolve(s, cwd) : s.home,
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: s.home, LANG: 'C.UTF-8', ...s.env },
      detached: true,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const c: FakeCommand = { id: randomUUID(), command, child, stdout: '', stderr: '' };
    child.stdout!.on('data', (d: Buffer) => (c.stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (c.stderr += d.toString()));
    child.on('close', (code, signal) => (c.exitCode = code ?? (signal ? 128 + (os.constants.signals[signal] ?? 9) : -1)));
    return c;
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
