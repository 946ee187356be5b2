/**
 * MCP tools mirroring the REST surface: create_sandbox, exec_in_sandbox, read_sandbox_file,
 * write_sandbox_file, list_sandbox_files, delete_sandbox_file, destroy_sandbox, and wait_sandbox_ready (polling sugar over GET). The
 * same tools run over HTTP inside the API (`POST /mcp`, bearer token, stateless) and over
 * stdio (`slipway mcp`, a thin client of the REST API), so auth and quotas are the REST ones.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { ApiClientError, type SandboxOps } from './client';
import { tail } from '../activities/process';
import { CreateSandboxBody, ExecBody, ExecResult, FileList, ListFilesQuery, OpenPortBody, PreviewPortView, SandboxView, StreamExecBody, type SessionServerFrame } from './schemas';
import { relaySession, writeInput } from './session-relay';
import { ApiError, type Principal, type SandboxService } from './service';
import { requestOrigin } from './preview-proxy';

export const MCP_TOOLS = ['create_sandbox', 'exec_in_sandbox', 'read_sandbox_file', 'write_sandbox_file', 'list_sandbox_files', 'delete_sandbox_file', 'destroy_sandbox', 'wait_sandbox_ready', 'open_sandbox_port', 'close_sandbox_port'] as const;

/** Objects go out as text (for older clients) and as structured content matching the tool's output schema. */
const text = (value: unknown): CallToolResult => ({
  content: [{ type: 'text', text: typeof value === 'string' ? value : JSON.stringify(value, null, 2) }],
  ...(value !== null && typeof value === 'object' ? { structuredContent: value as Record<string, unknown> } : {}),
});

async function guard(fn: () => Promise<CallToolResult>): Promise<CallToolResult> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof ApiError || e instanceof ApiClientError) {
      return { isError: true, content: [{ type: 'text', text: `${e.code}: ${e.message}` }] };
    }
    throw e;
  }
}

/** Characters of each output kept for a streamed exec's final answer (as much as exec keeps). */
const EXEC_CAPTURE_CHARS = 4 * 1024 * 1024;

const sandboxId = z.string().describe('the sandbox id (sbx_...)');
const encoding = z.enum(['utf8', 'base64']).default('utf8').describe('how content is encoded in this call: utf8 text, or base64 for binary files');
const filePath = z.string().min(1).describe('path relative to the sandbox root; may not leave it, nor name .git or .slipway');

export function buildMcpServer(ops: SandboxOps): McpServer {
  const server = new McpServer({ name: 'slipway-sandboxes', version: '1.0.0' });

  server.registerTool(
    'create_sandbox',
    {
      description: 'Create a sandbox from a profile. Returns it in status "pending"; call wait_sandbox_ready next.',
      inputSchema: CreateSandboxBody.shape,
      outputSchema: SandboxView.shape,
      annotations: { title: 'Create sandbox', readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
    },
    async (args) => guard(async () => text(await ops.create(args))),
  );
  server.registerTool(
    'wait_sandbox_ready',
    {
      description: 'Wait until a sandbox leaves "pending" (polls GET /api/v1/sandboxes/:id). Returns the sandbox.',
      inputSchema: { sandbox_id: sandboxId, timeout_seconds: z.number().positive().max(300).default(60).describe('give up (returning the pending sandbox) after this many seconds') },
      outputSchema: SandboxView.shape,
      annotations: { title: 'Wait for a sandbox', readOnlyHint: true, openWorldHint: false },
    },
    async ({ sandbox_id, timeout_seconds }) =>
      guard(async () => {
        const until = Date.now() + timeout_seconds * 1000;
        let sandbox = await ops.get(sandbox_id);
        while (sandbox.status === 'pending' && Date.now() < until) {
          sandbox = await ops.get(sandbox_id, Math.min(10, Math.max(0.1, (until - Date.now()) / 1000)));
        }
        return text(sandbox);
      }),
  );
  server.registerTool(
    'exec_in_sandbox',
    {
      description:
        'Run a command in the sandbox (no shell; use command "sh" with args ["-c", "..."]). Wakes a suspended sandbox first. ' +
        'With a progressToken, the output streams as progress notifications ("stdout: ..." / "stderr: ...") while it runs.',
      inputSchema: { sandbox_id: sandboxId, ...ExecBody.shape },
      outputSchema: ExecResult.shape,
      // Arbitrary commands can change or delete anything in the sandbox.
      annotations: { title: 'Run a command', readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
    },
    async ({ sandbox_id, ...body }, extra) =>
      guard(async () => {
        const progressToken = extra._meta?.progressToken;
        if (progressToken === undefined) return text(await ops.exec(sandbox_id, body));
        // Asked for progress: the output comes as progress notifications while the command runs
        // (each awaited, so a slow client slows the command rather than filling the server).
        const kept = { stdout: '', stderr: '' };
        let progress = 0;
        const exit = await ops.execStream(sandbox_id, body, async (stream, data) => {
          kept[stream] = tail(kept[stream] + data, EXEC_CAPTURE_CHARS);
          await extra.sendNotification({ method: 'notifications/progress', params: { progressToken, progress: ++progress, message: `${stream}: ${data}` } });
        });
        return text({ exit_code: exit.exit_code, stdout: kept.stdout, stderr: kept.stderr, timed_out: exit.timed_out, duration_ms: exit.duration_ms });
      }),
  );
  server.registerTool(
    'read_sandbox_file',
    {
      description: 'Read a file of the sandbox (path relative to its root; regular files only, up to the server\'s file limit).',
      inputSchema: { sandbox_id: sandboxId, path: filePath, encoding },
      annotations: { title: 'Read a file', readOnlyHint: true, openWorldHint: false },
    },
    async ({ sandbox_id, path, encoding: enc }) => guard(async () => text((await ops.readFile(sandbox_id, path)).toString(enc))),
  );
  server.registerTool(
    'write_sandbox_file',
    {
      description: 'Write a file in the sandbox (parent folders are created; an existing file is replaced).',
      inputSchema: { sandbox_id: sandboxId, path: filePath, content: z.string().describe('the file content, in `encoding`'), encoding },
      annotations: { title: 'Write a file', readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    async ({ sandbox_id, path, content, encoding: enc }) =>
      guard(async () => {
        const bytes = Buffer.from(content, enc);
        await ops.writeFile(sandbox_id, path, bytes);
        return text(`wrote ${bytes.length} bytes to ${path}`);
      }),
  );
  server.registerTool(
    'list_sandbox_files',
    {
      description: 'List a folder of the sandbox (path relative to its root, default the root): each entry\'s name, type (file, directory, symlink, other; links are not followed) and size. .git and .slipway are left out.',
      inputSchema: { sandbox_id: sandboxId, path: ListFilesQuery.shape.path },
      outputSchema: FileList.shape,
      annotations: { title: 'List a folder', readOnlyHint: true, openWorldHint: false },
    },
    async ({ sandbox_id, path }) => guard(async () => text(await ops.listFiles(sandbox_id, path))),
  );
  server.registerTool(
    'delete_sandbox_file',
    {
      description: 'Delete a file of the sandbox (a link is removed, never its target; a file already gone is fine; folders are refused).',
      inputSchema: { sandbox_id: sandboxId, path: filePath },
      annotations: { title: 'Delete a file', readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    async ({ sandbox_id, path }) =>
      guard(async () => {
        await ops.deleteFile(sandbox_id, path);
        return text(`deleted ${path}`);
      }),
  );
  server.registerTool(
    'destroy_sandbox',
    {
      description: 'Destroy the sandbox (it moves to terminating, then terminated); its files are gone.',
      inputSchema: { sandbox_id: sandboxId },
      outputSchema: SandboxView.shape,
      annotations: { title: 'Destroy sandbox', readOnlyHint: false, destructiveHint: true, idempotentHint: true, openWorldHint: false },
    },
    async ({ sandbox_id }) => guard(async () => text(await ops.destroy(sandbox_id))),
  );
  server.registerTool(
    'open_sandbox_port',
    {
      description: 'Expose a port a process in the sandbox listens on at a preview URL (its own origin). Returns the URL and a signed, short-lived link for a browser. The preview lives while the process serving the port runs.',
      inputSchema: { sandbox_id: sandboxId, ...OpenPortBody.shape },
      outputSchema: PreviewPortView.shape,
      annotations: { title: 'Open a preview port', readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
    },
    async ({ sandbox_id, ...body }) => guard(async () => text(await ops.openPort(sandbox_id, body))),
  );
  server.registerTool(
    'close_sandbox_port',
    {
      description: 'Close a preview port: its URL and links stop working.',
      inputSchema: { sandbox_id: sandboxId, port: OpenPortBody.shape.port },
      annotations: { title: 'Close a preview port', readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: false },
    },
    async ({ sandbox_id, port }) =>
      guard(async () => {
        await ops.closePort(sandbox_id, port);
        return text(`closed port ${port} of ${sandbox_id}`);
      }),
  );
  return server;
}

/** The service bound to one principal, as SandboxOps (the HTTP MCP endpoint's view). */
export function inProcessOps(service: SandboxService, principal: Principal, origin: { scheme: string; port: string | undefined } = { scheme: 'http', port: undefined }): SandboxOps {
  const parse = <T extends z.ZodType>(schema: T, value: unknown): z.infer<T> => {
    const r = schema.safeParse(value);
    if (!r.success) throw new ApiError(400, 'invalid_body', r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; '));
    return r.data;
  };
  return {
    create: (body) => service.create(principal, parse(CreateSandboxBody, body)),
    get: (id, wait) => service.get(principal, id, (wait ?? 0) * 1000),
    list: (opts) => service.list(principal, { status: opts?.status as never, limit: opts?.limit ?? 100 }),
    destroy: (id) => service.destroy(principal, id),
    exec: (id, body) => service.exec(principal, id, parse(ExecBody, body)),
    execStream: async (id, body, onOutput) => {
      const parsed = parse(StreamExecBody, { ...body, stream: true });
      const session = await service.openSession(principal, id, parsed, 'stream');
      if (parsed.stdin !== undefined) writeInput(session, Buffer.from(parsed.stdin), { accountId: principal.accountId, metrics: service.metrics });
      session.stdin.end();
      // Output waits for each notification to go out before more is read from the command.
      let delivered: Promise<unknown> = Promise.resolve();
      let inFlight = 0;
      const exit = await relaySession(
        session,
        {
          send(f) {
            const frame = JSON.parse(f) as SessionServerFrame;
            if (frame.type !== 'stdout' && frame.type !== 'stderr') return true;
            inFlight++;
            delivered = delivered.then(() => onOutput(frame.type as 'stdout' | 'stderr', frame.data)).catch(() => undefined).finally(() => inFlight--);
            return inFlight === 0;
          },
          onDrain: (resume) => void delivered.then(resume),
          buffered: () => 0,
        },
        { encoding: 'utf8', accountId: principal.accountId, metrics: service.metrics, timeoutMs: parsed.timeout_seconds * 1000 },
      );
      await delivered;
      return exit;
    },
    readFile: (id, path) => service.readFile(principal, id, path),
    writeFile: (id, path, content) => service.writeFile(principal, id, path, content),
    deleteFile: (id, path) => service.deleteFile(principal, id, path),
    listFiles: (id, path) => service.listFiles(principal, id, path ?? '.'),
    openPort: (id, body) => service.openPort(principal, id, parse(OpenPortBody, body), origin),
    closePort: (id, port) => service.closePort(principal, id, port),
  };
}

/** One stateless MCP exchange over HTTP (JSON responses, no session). */
export async function handleMcpHttp(service: SandboxService, principal: Principal, req: FastifyRequest, reply: FastifyReply): Promise<void> {
  // Preview URLs name the port the MCP client reached this server on.
  const server = buildMcpServer(inProcessOps(service, principal, requestOrigin(req)));
  // Progress notifications (streamed exec output) need an SSE answer; everything else is plain JSON.
  const wantsProgress = (Array.isArray(req.body) ? req.body : [req.body]).some((m) => (m as { params?: { _meta?: { progressToken?: unknown } } } | undefined)?.params?._meta?.progressToken !== undefined);
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: !wantsProgress });
  reply.hijack();
  reply.raw.on('close', () => {
    void transport.close();
    void server.close();
  });
  await server.connect(transport);
  await transport.handleRequest(req.raw, reply.raw, req.body);
}
