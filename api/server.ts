/**
 * The REST surface of the sandbox service (fastify): `/api/v1/sandboxes`, bearer-token auth,
 * zod-validated bodies with clear 4xx errors, the OpenAPI document, Prometheus metrics and
 * the MCP endpoint. Logs are pino JSON lines; the Authorization header is never logged.
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { z } from 'zod';
import { handleMcpHttp } from './mcp';
import { buildOpenApiDocument } from './openapi';
import { CreateSandboxBody, ExecBody, GetQuery, ListQuery, zodIssues } from './schemas';
import { ApiError, SandboxService, type Principal } from './service';

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

const sendError = (reply: FastifyReply, e: ApiError) =>
  reply
    .status(e.status)
    .header(e.status === 401 ? 'www-authenticate' : 'x-slipway-error', e.status === 401 ? 'Bearer' : e.code)
    .send({ error: { code: e.code, message: e.message, ...(e.issues ? { issues: e.issues } : {}) } });

export async function buildApiServer(opts: ApiServerOptions): Promise<FastifyInstance> {
  const { service } = opts;
  const app = Fastify({
    loggerInstance: opts.logger as FastifyBaseLogger,
    // Exec bodies carry stdin; 16 MiB plus JSON overhead.
    bodyLimit: 20 * 1024 * 1024,
  });

  app.setErrorHandler((error, req, reply) => {
    if (error instanceof ApiError) return sendError(reply, error);
    const fe = error as { statusCode?: number; code?: string; message: string };
    if (fe.statusCode && fe.statusCode >= 400 && fe.statusCode < 500) {
      const code = fe.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || fe.code === 'FST_ERR_CTP_EMPTY_JSON_BODY' ? 'invalid_json' : fe.code === 'FST_ERR_CTP_BODY_TOO_LARGE' ? 'too_large' : fe.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE' ? 'unsupported_media_type' : 'bad_request';
      return sendError(reply, new ApiError(fe.statusCode, code, fe.message));
    }
    req.log.error({ err: error }, 'request failed');
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

  // Everything under /api/v1/sandboxes needs an account token.
  await app.register(async (api) => {
    api.addHook('preHandler', async (req) => {
      req.principal = await service.authenticate(bearer(req));
    });

    api.post('/api/v1/sandboxes', async (req, reply) => {
      const body = parse(CreateSandboxBody, req.body, 'body');
      return reply.status(201).send(await service.create(req.principal!, body));
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
    api.post<{ Params: { id: string } }>('/api/v1/sandboxes/:id/exec', async (req) => {
      const body = parse(ExecBody, req.body, 'body');
      return service.exec(req.principal!, req.params.id, body);
    });

    // Files: raw bytes in and out, whatever the content type says.
    await api.register(async (files) => {
      files.removeAllContentTypeParsers();
      files.addContentTypeParser('*', { parseAs: 'buffer', bodyLimit: opts.fileLimitBytes ?? 64 * 1024 * 1024 }, (_req, body, done) => done(null, body));
      type FileRoute = { Params: { id: string; '*': string } };
      const filePath = (req: FastifyRequest<FileRoute>) => {
        const p = req.params['*'];
        if (!p) throw new ApiError(400, 'invalid_path', 'a file path is needed after /files/');
        return p;
      };
      files.get<FileRoute>('/api/v1/sandboxes/:id/files/*', async (req, reply) => {
        const content = await service.readFile(req.principal!, req.params.id, filePath(req));
        return reply.header('content-type', 'application/octet-stream').send(content);
      });
      files.put<FileRoute>('/api/v1/sandboxes/:id/files/*', async (req, reply) => {
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
