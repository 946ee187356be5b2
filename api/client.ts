/**
 * A small HTTP client of the sandbox API (fetch, keep-alive): what the CLI's sandbox verbs and
 * the stdio MCP server use. The token comes from the caller (SLIPWAY_API_TOKEN), never argv.
 */
import type { z } from 'zod';
import WebSocket from 'ws';
import type { CreateSandboxBody, ExecBody, ExecResult, FileList, MintSshTokenBody, OpenPortBody, PreviewPortView, SandboxView, SessionServerFrame, SshTokenView, StreamExecBody } from './schemas';

export type CreateSandboxInput = z.input<typeof CreateSandboxBody>;
export type ExecInput = z.input<typeof ExecBody>;
export type ExecOutput = z.infer<typeof ExecResult>;
export type StreamExecInput = Omit<z.input<typeof StreamExecBody>, 'stream'>;
export type ExitFrame = Extract<SessionServerFrame, { type: 'exit' }>;

/** What both the in-process service and this HTTP client offer (the MCP tools sit on it). */
export interface SandboxOps {
  create(body: CreateSandboxInput): Promise<SandboxView>;
  get(id: string, waitReadySeconds?: number): Promise<SandboxView>;
  list(opts?: { status?: string; limit?: number }): Promise<SandboxView[]>;
  destroy(id: string): Promise<SandboxView>;
  exec(id: string, body: ExecInput): Promise<ExecOutput>;
  /** Exec with the output handed to `onOutput` as it comes (awaited: a slow consumer slows the command). */
  execStream(id: string, body: StreamExecInput, onOutput: (stream: 'stdout' | 'stderr', data: string) => Promise<void> | void): Promise<ExitFrame>;
  readFile(id: string, path: string): Promise<Buffer>;
  writeFile(id: string, path: string, content: Buffer): Promise<void>;
  deleteFile(id: string, path: string): Promise<void>;
  listFiles(id: string, path?: string): Promise<FileList>;
  openPort(id: string, body: z.input<typeof OpenPortBody>): Promise<PreviewPortView>;
  closePort(id: string, port: number): Promise<void>;
}

export class ApiClientError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ApiClientError';
  }
}

export const DEFAULT_API_URL = 'http://127.0.0.1:8787';

/**
 * Encodes a sandbox-relative path for /files/* as one segment (slashes too): URL parsers fold
 * "..", "%2e%2e" and friends away before sending, so the server would never see, and judge,
 * the path the caller meant.
 */
const filePath = (p: string) => encodeURIComponent(p);

export class SandboxApiClient implements SandboxOps {
  constructor(
    private readonly baseUrl: string,
    private readonly token: string,
  ) {}

  private async request(method: string, path: string, body?: unknown, raw?: Buffer): Promise<Response> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.token}` };
    let payload: Uint8Array | string | undefined;
    if (raw) {
      headers['content-type'] = 'application/octet-stream';
      payload = new Uint8Array(raw);
    } else if (body !== undefined) {
      headers['content-type'] = 'application/json';
      payload = JSON.stringify(body);
    }
    const res = await fetch(new URL(path, this.baseUrl), { method, headers, body: payload });
    if (!res.ok) {
      let code = 'http_error';
      let message = `${method} ${path}: HTTP ${res.status}`;
      try {
        const err = (await res.json()) as { error?: { code: string; message: string } };
        if (err.error) ({ code, message } = err.error);
      } catch {
        /* not JSON */
      }
      throw new ApiClientError(res.status, code, message);
    }
    return res;
  }

  private async json<T>(method: string, path: string, body?: unknown): Promise<T> {
    return (await (await this.request(method, path, body)).json()) as T;
  }

  create(body: CreateSandboxInput) {
    return this.json<SandboxView>('POST', '/api/v1/sandboxes', body);
  }
  get(id: string, waitReadySeconds?: number) {
    return this.json<SandboxView>('GET', `/api/v1/sandboxes/${encodeURIComponent(id)}${waitReadySeconds ? `?wait_ready_seconds=${waitReadySeconds}` : ''}`);
  }
  async list(opts: { status?: string; limit?: number } = {}) {
    const q = new URLSearchParams();
    if (opts.status) q.set('status', opts.status);
    if (opts.limit) q.set('limit', String(opts.limit));
    return (await this.json<{ sandboxes: SandboxView[] }>('GET', `/api/v1/sandboxes${q.size ? `?${q}` : ''}`)).sandboxes;
  }
  destroy(id: string) {
    return this.json<SandboxView>('DELETE', `/api/v1/sandboxes/${encodeURIComponent(id)}`);
  }
  exec(id: string, body: ExecInput) {
    return this.json<ExecOutput>('POST', `/api/v1/sandboxes/${encodeURIComponent(id)}/exec`, body);
  }
  async execStream(id: string, body: StreamExecInput, onOutput: (stream: 'stdout' | 'stderr', data: string) => Promise<void> | void): Promise<ExitFrame> {
    const res = await this.request('POST', `/api/v1/sandboxes/${encodeURIComponent(id)}/exec`, { ...body, stream: true });
    let pending = '';
    let exit: ExitFrame | undefined;
    const decoder = new TextDecoder();
    // Read one chunk at a time: the server sends no faster than this loop takes it.
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      pending += decoder.decode(chunk, { stream: true });
      const lines = pending.split('\n');
      pending = lines.pop()!;
      for (const line of lines.filter(Boolean)) {
        const frame = JSON.parse(line) as SessionServerFrame;
        if (frame.type === 'stdout' || frame.type === 'stderr') await onOutput(frame.type, frame.data);
        else if (frame.type === 'exit') exit = frame;
        else if (frame.type === 'error') throw new ApiClientError(500, frame.code, frame.message);
      }
    }
    if (!exit) throw new ApiClientError(502, 'stream_cut', 'the exec stream ended before the command did');
    return exit;
  }
  /** The exec WebSocket (ADR 0014), authenticated; send a start frame once it is open. */
  sessionSocket(id: string): WebSocket {
    const url = new URL(`/api/v1/sandboxes/${encodeURIComponent(id)}/exec/ws`, this.baseUrl);
    url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
    return new WebSocket(url, { headers: { authorization: `Bearer ${this.token}` } });
  }
  async readFile(id: string, path: string) {
    return Buffer.from(await (await this.request('GET', `/api/v1/sandboxes/${encodeURIComponent(id)}/files/${filePath(path)}`)).arrayBuffer());
  }
  async writeFile(id: string, path: string, content: Buffer) {
    await this.request('PUT', `/api/v1/sandboxes/${encodeURIComponent(id)}/files/${filePath(path)}`, undefined, content);
  }
  async deleteFile(id: string, path: string) {
    await this.request('DELETE', `/api/v1/sandboxes/${encodeURIComponent(id)}/files/${filePath(path)}`);
  }
  listFiles(id: string, path = '.') {
    return this.json<FileList>('GET', `/api/v1/sandboxes/${encodeURIComponent(id)}/files?path=${encodeURIComponent(path)}`);
  }
  openPort(id: string, body: z.input<typeof OpenPortBody>) {
    return this.json<PreviewPortView>('POST', `/api/v1/sandboxes/${encodeURIComponent(id)}/ports`, body);
  }
  async listPorts(id: string) {
    return (await this.json<{ ports: PreviewPortView[] }>('GET', `/api/v1/sandboxes/${encodeURIComponent(id)}/ports`)).ports;
  }
  async closePort(id: string, port: number) {
    await this.request('DELETE', `/api/v1/sandboxes/${encodeURIComponent(id)}/ports/${port}`);
  }
  mintSshToken(id: string, body: z.input<typeof MintSshTokenBody> = {}) {
    return this.json<SshTokenView>('POST', `/api/v1/sandboxes/${encodeURIComponent(id)}/ssh_tokens`, body);
  }
  async revokeSshToken(id: string, tokenId: string) {
    await this.request('DELETE', `/api/v1/sandboxes/${encodeURIComponent(id)}/ssh_tokens/${encodeURIComponent(tokenId)}`);
  }
}
