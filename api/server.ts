/**
 * The REST surface of the sandbox service (fastify): `/api/v1/sandboxes`, bearer-token auth,
 * zod-validated bodies with clear 4xx errors, the OpenAPI document, Prometheus metrics and
 * the MCP endpoint. Logs are pino JSON lines; the Authorization header is never logged.
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { z } from 'zod';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { handleMcpHttp } from './mcp';
import { buildOpenApiDocument } from './openapi';
import websocket from '@fastify/websocket';
import { CreateSandboxBody, ExecBody, GetQuery, ListFilesQuery, ListQuery, MintSshTokenBody, OpenPortBody, StreamExecBody, zodIssues } from './schemas';
import { abandonSession, relaySession, serveSessionSocket, writeInput } from './session-relay';
import { handlePreviewRequest, handlePreviewUpgrade, previewTarget, requestOrigin, type PreviewCounters } from './preview-proxy';
import { ApiError, idempotencyKeyOf, SandboxService, type Principal } from './service';

declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
  }
}

export interface ApiServerOptions {
  service: SandboxService;
  logger: Logger;
  /** Prometheus text for GET /metrics. */
  metrics?: () => Promise<{ contentType: string; body: string }>;
  /** Largest file accepted by PUT /files (bytes). */
  fileLimitBytes?: number;
}

export const bearer = (req: FastifyRequest): string | undefined => {
  const header = req.headers.authorization;
  if (!header) return undefined;
  const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return m?.[1];
};

function parse<T extends z.ZodType>(schema: T, value: unknown, what: string): z.infer<T> {
  const r = schema.safeParse(value ?? {});
  if (!r.success) {
    const issues = zodIssues(r.error);
    throw new ApiError(400, `invalid_${what}`, `invalid ${what}: ${issues.map((i) => `${i.path}: ${i.message}`).join('; ')}`, issues);
  }
  return r.data;
}

const errorBody = (e: ApiError) => ({ error: { code: e.code, message: e.message, ...(e.issues ? { issues: e.issues } : {}) } });

const sendError = (reply: FastifyReply, e: ApiError) => {
  if (e.retryAfterSeconds !== undefined) reply.header('retry-after', String(Math.max(1, Math.ceil(e.retryAfterSeconds))));
  return reply
    .status(e.status)
    .header(e.status === 401 ? 'www-authenticate' : 'x-slipway-error', e.status === 401 ? 'Bearer' : e.code)
    .send(errorBody(e));
};

/** Fastify's own error codes, in the API's words. */
const FRAMEWORK_CODES: Record<string, string> = {
  FST_ERR_CTP_INVALID_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_EMPTY_JSON_BODY: 'invalid_json',
  FST_ERR_CTP_BODY_TOO_LARGE: 'too_large',
  FST_ERR_CTP_INVALID_MEDIA_TYPE: 'unsupported_media_type',
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: 'bad_request',
  FST_ERR_BAD_URL: 'invalid_url',
};

/** The URL as logged: query values replaced, so a token passed as `?token=` never reaches a log. */
export function redactUrl(url: string): string {
  const q = url.indexOf('?');
  if (q < 0) return url;
  const params = url
    .slice(q + 1)
    .split('&')
    .filter(Boolean)
    .map((pair) => `${pair.split('=')[0]}=[redacted]`);
  return `${url.slice(0, q)}?${params.join('&')}`;
}

export async function buildApiServer(opts: ApiServerOptions): Promise<FastifyInstance> {
  const { service } = opts;
  const fileLimit = opts.fileLimitBytes ?? service.fileLimitBytes;
  const app = Fastify({
    loggerInstance: opts.logger as FastifyBaseLogger,
    // Exec bodies carry stdin; 16 MiB plus JSON overhead.
    bodyLimit: 20 * 1024 * 1024,
    // File paths travel in the URL: long enough for PATH_MAX (longer ones are refused by name, not by the router).
    maxParamLength: 8192,
    // Requests are logged below, with query strings redacted.
    disableRequestLogging: true,
    // Errors fastify raises before routing (bad percent-encoding) use the API's error shape too.
    frameworkErrors: (error, _req, reply) => {
      const fe = error as { statusCode?: number; code?: string; message: string };
      const status = fe.statusCode && fe.statusCode >= 400 && fe.statusCode < 500 ? fe.statusCode : 400;
      return sendError(reply, new ApiError(status, FRAMEWORK_CODES[fe.code ?? ''] ?? 'bad_request', fe.message));
    },
  });

  // Errors Node's HTTP parser raises (header or URL too large, malformed request): the same JSON shape.
  app.server.removeAllListeners('clientError');
  app.server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    if (!socket.writable || (socket as unknown as { _httpMessage?: unknown })._httpMessage) return socket.destroy();
    const status = err.code === 'HPE_HEADER_OVERFLOW' ? 431 : err.code === 'ERR_HTTP_REQUEST_TIMEOUT' ? 408 : 400;
    const code = status === 431 ? 'headers_too_large' : status === 408 ? 'request_timeout' : 'bad_request';
    const body = JSON.stringify(errorBody(new ApiError(status, code, status === 431 ? 'the request line or headers are too large (a URL over 16 KiB?)' : 'malformed HTTP request')));
    socket.end(`HTTP/1.1 ${status} ${status === 431 ? 'Request Header Fields Too Large' : status === 408 ? 'Request Timeout' : 'Bad Request'}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  });

  // Preview origins (`<id>-<port>.<domain>`) are proxied to the sandbox before any API route sees them.
  const m = service.metrics;
  const counters: PreviewCounters | undefined = m && { request: (k, o) => m.previewRequest(k, o), bytes: (d, n) => m.interactiveBytes('preview', d, n) };
  app.addHook('onRequest', async (req, reply) => {
    const target = previewTarget(service, req.raw);
    if (!target) return;
    reply.hijack();
    await handlePreviewRequest(service, target, req.raw, reply.raw, counters);
  });

  // A stop waits for the requests in flight. Once one is answered its connection is dropped, or
  // the client's keep-alive would hold the stop for the keep-alive timeout (72 s). Not by a
  // `connection: close` header: undici (fetch) ends a chunked body early at such a close.
  let closing = false;
  app.addHook('preClose', async () => {
    closing = true;
  });
  app.server.on('request', (_req: IncomingMessage, res: ServerResponse) => {
    res.once('finish', () => {
      if (closing) setImmediate(() => app.server.closeIdleConnections());
    });
  });

  app.addHook('onResponse', async (req, reply) => {
    req.log.info({ req: { method: req.method, url: redactUrl(req.url) }, res: { statusCode: reply.statusCode }, responseTime: Math.round(reply.elapsedTime) }, 'request completed');
  });

  app.setErrorHandler((error, req, reply) => {
    if (error instanceof ApiError) return sendError(reply, error);
    const fe = error as { statusCode?: number; code?: string; message: string };
    if (fe.statusCode && fe.statusCode >= 400 && fe.statusCode < 500) {
      // A body over its route's limit (the file limit for files) is told the limit, not only "too large".
      const message = fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE' ? `the request body is over the limit of ${req.routeOptions.bodyLimit} bytes` : fe.message;
      return sendError(reply, new ApiError(fe.statusCode, FRAMEWORK_CODES[fe.code ?? ''] ?? (fe.statusCode === 413 ? 'too_large' : 'bad_request'), message));
    }
    req.log.error({ err: error, req: { method: req.method, url: redactUrl(req.url) } }, 'request failed');
    return sendError(reply, new ApiError(500, 'internal', 'internal error'));
  });
  app.setNotFoundHandler((req, reply) => sendError(reply, new ApiError(404, 'not_found', `no route ${req.method} ${req.url.split('?')[0]}`)));

  const document = buildOpenApiDocument();
  app.get('/api/v1/openapi.json', async () => document);
  app.get('/healthz', async () => ({ ok: true }));
  if (opts.metrics) {
    const metrics = opts.metrics;
    app.get('/metrics', async (_req, reply) => {
      const m = await metrics();
      return reply.header('content-type', m.contentType).send(m.body);
    });
  }

  app.get('/api/v1/grants/introspect', async (req) => service.introspectGrant(bearer(req)));

  await app.register(websocket, { options: { maxPayload: 2 * 1024 * 1024 } });
  // One upgrade dispatcher: a preview origin's upgrade goes to its sandbox and nowhere else; any
  // other upgrade (the exec WebSocket) to @fastify/websocket's router. Both listening on the server
  // would answer one socket twice.
  const routed = app.server.listeners('upgrade') as Array<(...args: unknown[]) => void>;
  app.server.removeAllListeners('upgrade');
  app.server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    // An owner on another host dialling back with a session or preview (ADR 0028): its own proof, no account token.
    if (service.tunnels?.handleUpgrade(req, socket, head)) return;
    const target = previewTarget(service, req);
    if (target) return void handlePreviewUpgrade(service, target, req, socket, head, counters);
    for (const listener of routed) listener.call(app.server, req, socket, head);
  });

  // Everything under /api/v1/sandboxes needs an account token.
  await app.register(async (api) => {
    api.addHook('preHandler', async (req) => {
      req.principal = await service.authenticate(bearer(req));
      service.rateLimit(req.principal.accountId);
    });

    api.post('/api/v1/sandboxes', async (req, reply) => {
      const body = parse(CreateSandboxBody, req.body, 'body');
      const { view, replayed } = await service.createIdempotent(req.principal!, body, idempotencyKeyOf(req.headers));
      if (replayed) reply.header('idempotent-replayed', 'true');
      return reply.status(201).send(view);
    });
    api.get('/api/v1/sandboxes', async (req) => {
      const q = parse(ListQuery, req.query, 'query');
      return { sandboxes: await service.list(req.principal!, q) };
    });
    api.get<{ Params: { id: string } }>('/api/v1/sandboxes/:id', async (req) => {
      const q = parse(GetQuery, req.query, 'query');
      return service.get(req.principal!, req.params.id, (q.wait_ready_seconds ?? 0) * 1000);
    });
    api.delete<{ Params: { id: string } }>('/api/v1/sandboxes/:id', async (req, reply) => {
      return reply.status(202).send(await service.destroy(req.principal!, req.params.id));
    });
    api.post<{ Params: { id: string } }>('/api/v1/sandboxes/:id/exec', async (req, reply) => {
      if ((req.body as { stream?: unknown } | undefined)?.stream === true) return streamExec(req, reply);
      const body = parse(ExecBody, req.body, 'body');
      // A caller that goes away before the answer kills its command (with its process group).
      const gone = new AbortController();
      const onClose = () => {
        if (!reply.raw.writableFinished) gone.abort();
      };
      reply.raw.once('close', onClose);
      try {
        const { result, replayed } = await service.execIdempotent(req.principal!, req.params.id, body, gone.signal, idempotencyKeyOf(req.headers));
        if (replayed) reply.header('idempotent-replayed', 'true');
        return result;
      } finally {
        if (!gone.signal.aborted) reply.raw.off('close', onClose);
      }
    });

    /** POST /exec with stream: true: NDJSON frames as the output comes, bounded by the reader's pace. */
    const streamExec = async (req: FastifyRequest<{ Params: { id: string } }>, reply: FastifyReply) => {
      const body = parse(StreamExecBody, req.body, 'body');
      if (req.headers['idempotency-key'] !== undefined) {
        throw new ApiError(400, 'invalid_request', 'Idempotency-Key cannot be used with stream: true (a streamed run is not replayed)', [{ path: 'headers.idempotency-key', message: 'not with stream: true' }]);
      }
      const session = await service.openSession(req.principal!, req.params.id, { ...body, timeoutMs: body.timeout_seconds * 1000 }, 'stream');
      reply.hijack();
      const res = reply.raw;
      res.on('error', () => undefined);
      res.once('close', () => {
        if (!res.writableFinished) abandonSession(session);
      });
      res.writeHead(200, { 'content-type': 'application/x-ndjson; charset=utf-8', 'cache-control': 'no-store', 'x-content-type-options': 'nosniff' });
      const exit = await relaySession(
        session,
        { send: (f) => res.write(`${f}\n`), onDrain: (resume) => res.once('drain', resume), buffered: () => res.writableLength },
        { encoding: body.output_encoding ?? 'utf8', accountId: req.principal!.accountId, metrics: service.metrics, timeoutMs: body.timeout_seconds * 1000 },
      );
      res.end();
      req.log.info({ req: { method: req.method, url: redactUrl(req.url) }, res: { statusCode: 200 }, responseTime: exit.duration_ms, stream: true }, 'request completed');
      return reply;
    };

    // An interactive session over a WebSocket (ADR 0014): auth and the sandbox's owner are
    // checked before the upgrade, so another account's sandbox is a plain 404.
    api.route<{ Params: { id: string } }>({
      method: 'GET',
      url: '/api/v1/sandboxes/:id/exec/ws',
      preHandler: async (req) => service.requireSandbox(req.principal!, req.params.id),
      // A plain GET (no upgrade) is told what the endpoint wants.
      handler: async (_req, reply) => sendError(reply, new ApiError(426, 'upgrade_required', 'this endpoint speaks WebSocket: send Connection: Upgrade, Upgrade: websocket')),
      wsHandler: (socket, req) => {
        const principal = req.principal!;
        serveSessionSocket(socket, {
          open: (start) => service.openSession(principal, req.params.id, start, 'websocket'),
          accountId: principal.accountId,
          metrics: service.metrics,
          onError: (e) => req.log.error({ err: e, req: { method: req.method, url: redactUrl(req.url) } }, 'session failed'),
        });
      },
    });

    // Preview ports (ADR 0015).
    api.post<{ Params: { id: string } }>('/api/v1/sandboxes/:id/ports', async (req, reply) => {
      const body = parse(OpenPortBody, req.body, 'body');
      return reply.status(201).send(await service.openPort(req.principal!, req.params.id, body, requestOrigin(req)));
    });
    api.get<{ Params: { id: string } }>('/api/v1/sandboxes/:id/ports', async (req) => ({ ports: await service.listPorts(req.principal!, req.params.id, requestOrigin(req)) }));
    api.delete<{ Params: { id: string; port: string } }>('/api/v1/sandboxes/:id/ports/:port', async (req, reply) => {
      const port = parse(OpenPortBody.shape.port, Number(req.params.port), 'path');
      await service.closePort(req.principal!, req.params.id, port);
      return reply.status(204).send();
    });

    // SSH through the broker (ADR 0015).
    api.post<{ Params: { id: string } }>('/api/v1/sandboxes/:id/ssh_tokens', async (req, reply) => {
      const body = parse(MintSshTokenBody, req.body, 'body');
      return reply.status(201).header('cache-control', 'no-store').send(await service.mintSshToken(req.principal!, req.params.id, body, req.headers.host));
    });
    api.delete<{ Params: { id: string; tokenId: string } }>('/api/v1/sandboxes/:id/ssh_tokens/:tokenId', async (req, reply) => {
      await service.revokeSshToken(req.principal!, req.params.id, req.params.tokenId);
      return reply.status(204).send();
    });

    // Files: raw bytes in and out, whatever the content type says.
    await api.register(async (files) => {
      files.removeAllContentTypeParsers();
      files.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: fileLimit }, (_req, body, done) => done(null, body));
      type FileRoute = { Params: { id: string; '*': string } };
      const filePath = (req: FastifyRequest<FileRoute>) => {
        const p = req.params['*'];
        if (!p) throw new ApiError(400, 'invalid_path', 'a file path is needed after /files/');
        return p;
      };
      files.get<{ Params: { id: string } }>('/api/v1/sandboxes/:id/files', async (req) => {
        const q = parse(ListFilesQuery, req.query, 'query');
        return service.listFiles(req.principal!, req.params.id, q.path);
      });
      files.get<FileRoute>('/api/v1/sandboxes/:id/files/*', async (req, reply) => {
        const { size, stream } = await service.openFile(req.principal!, req.params.id, filePath(req));
        return reply.header('content-type', 'application/octet-stream').header('content-length', String(size)).send(stream);
      });
      files.put<FileRoute>('/api/v1/sandboxes/:id/files/*', { bodyLimit: fileLimit }, async (req, reply) => {
        const body = req.body;
        const content = Buffer.isBuffer(body) ? body : Buffer.alloc(0);
        await service.writeFile(req.principal!, req.params.id, filePath(req), content);
        return reply.status(204).send();
      });
      files.delete<FileRoute>('/api/v1/sandboxes/:id/files/*', async (req, reply) => {
        await service.deleteFile(req.principal!, req.params.id, filePath(req));
        return reply.status(204).send();
      });
    });
  });

  // MCP over HTTP: the same token, the same service, the same quotas.
  await app.register(async (mcp) => {
    mcp.post('/mcp', async (req, reply) => {
      const principal = await service.authenticate(bearer(req));
      await handleMcpHttp(service, principal, req, reply);
    });
    mcp.get('/mcp', async (_req, reply) => sendError(reply.status(405), new ApiError(405, 'method_not_allowed', 'this MCP endpoint is stateless: POST JSON-RPC messages')));
    mcp.delete('/mcp', async (_req, reply) => sendError(reply.status(405), new ApiError(405, 'method_not_allowed', 'this MCP endpoint is stateless: no sessions to delete')));
  });

  return app;
}
