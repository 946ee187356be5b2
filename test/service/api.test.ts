/**
 * The REST and MCP surfaces over real HTTP: auth and account isolation, validation errors,
 * path confinement of the files API, grants, the concurrency limit, OpenAPI, metrics, and
 * that no token or secret reaches logs or workflow history.
 */
import { readFileSync } from 'node:fs';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSandboxServiceActivities } from '../../activities/service';
import { defaultProviderFor } from '../../activities/service/providers';
import { ApiClientError } from '../../api/client';
import { createApiToken, revokeApiToken } from '../../activities/billing/records';
import { MCP_TOOLS } from '../../api/mcp';
import { OPENAPI_FILE, renderOpenApi } from '../../api/write-openapi';
import { GRANTS_FILE, serviceSandboxWorkflowId } from '../../core/sandbox-service';
import { codeOf, rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

let h: ServiceHarness;
let a: TestAccount;
let b: TestAccount;
let sandboxId: string;
const created: string[] = [];
const secrets: string[] = [];
let grantToken = '';

beforeAll(async () => {
  h = await startServiceHarness();
  a = await h.account({ limit: 3 });
  b = await h.account({ limit: 1 });
  secrets.push(a.token, b.token);
  await a.profile({ name: 'linux' });
  await b.profile({ name: 'linux' });
  const project = await a.project('web');
  const sandbox = await a.api.create({ profile: 'linux', project_id: project, grants: [{ project_id: project, scopes: ['cache:read', 'registry:write'] }] });
  sandboxId = sandbox.id;
  created.push(sandboxId);
  await a.api.get(sandboxId, 30);
});
afterAll(async () => {
  await h?.stop();
});

const raw = (method: string, p: string, opts: Parameters<typeof rawRequest>[3] = {}) => rawRequest(h.url, method, p, opts);

describe('auth and account isolation', () => {
  it('refuses missing and wrong tokens with 401', async () => {
    const none = await raw('GET', '/api/v1/sandboxes');
    expect(none.status).toBe(401);
    expect(none.headers.get('www-authenticate')).toBe('Bearer');
    expect(((await none.json()) as { error: { code: string } }).error.code).toBe('unauthorized');
    expect((await raw('GET', '/api/v1/sandboxes', { token: `${a.token}x` })).status).toBe(401);
    expect((await raw('GET', '/api/v1/sandboxes', { headers: { authorization: a.token } })).status).toBe(401); // not "Bearer ..."
  });

  it("answers 404 for another account's sandbox, whatever the verb", async () => {
    expect(await codeOf(b.api.get(sandboxId))).toBe('404 not_found');
    expect(await codeOf(b.api.exec(sandboxId, { command: 'true' }))).toBe('404 not_found');
    expect(await codeOf(b.api.readFile(sandboxId, 'README.md'))).toBe('404 not_found');
    expect(await codeOf(b.api.writeFile(sandboxId, 'x.txt', Buffer.from('x')))).toBe('404 not_found');
    expect(await codeOf(b.api.destroy(sandboxId))).toBe('404 not_found');
    expect((await b.api.list()).map((s) => s.id)).not.toContain(sandboxId);
    expect((await a.api.list()).map((s) => s.id)).toContain(sandboxId);
    expect((await a.api.get(sandboxId)).status).toBe('ready'); // untouched by b's DELETE
  });

  it('refuses a revoked token from the next request on', async () => {
    const { id: tokenId, token } = await createApiToken(h.database.db, a.id, { name: 'short-lived' });
    secrets.push(token);
    expect((await raw('GET', '/api/v1/sandboxes', { token })).status).toBe(200);
    await revokeApiToken(h.database.db, a.id, tokenId);
    expect((await raw('GET', '/api/v1/sandboxes', { token })).status).toBe(401);
  });

  it('answers 403 when the account has sandboxes turned off', async () => {
    const off = await h.account({ enabled: false });
    expect(await codeOf(off.api.list())).toBe('403 sandboxes_disabled');
  });
});

describe('validation', () => {
  it('explains malformed bodies with 4xx and the failing fields', async () => {
    const bad = async (body: string, p = '/api/v1/sandboxes') => {
      const res = await raw('POST', p, { token: a.token, body });
      return { status: res.status, body: (await res.json()) as { error: { code: string; message: string; issues?: Array<{ path: string }> } } };
    };
    const broken = await bad('{"profile": ');
    expect(broken).toMatchObject({ status: 400, body: { error: { code: 'invalid_json' } } });
    const missing = await bad('{}');
    expect(missing.status).toBe(400);
    expect(missing.body.error.issues?.map((i) => i.path)).toEqual(['profile']);
    const types = await bad('{"profile": "linux", "deadline_minutes": "soon", "grants": [{"project_id": "nope", "scopes": []}]}');
    expect(types.status).toBe(400);
    expect(types.body.error.issues?.map((i) => i.path).sort()).toEqual(['deadline_minutes', 'grants.0.project_id', 'grants.0.scopes']);
    expect((await bad('{"profile": "linux", "surprise": 1}')).body.error.message).toMatch(/surprise/);
    expect((await bad('{"profile": "no-such"}')).status).toBe(422);
    expect((await bad('{"profile": "linux", "deadline_minutes": 100000}')).status).toBe(400);
    expect((await bad('{"args": ["x"]}', `/api/v1/sandboxes/${sandboxId}/exec`)).body.error.issues?.[0]?.path).toBe('command');
    expect((await bad('{"command": "true", "env": {"BAD NAME": "x"}}', `/api/v1/sandboxes/${sandboxId}/exec`)).status).toBe(400);
    expect((await bad('[]')).status).toBe(400);
    const unsupported = await raw('POST', '/api/v1/sandboxes', { token: a.token, body: 'profile=linux', headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    expect(unsupported.status).toBe(415);
  });

  it('refuses grants on another account’s project with 422', async () => {
    const foreign = await b.project('theirs');
    expect(await codeOf(a.api.create({ profile: 'linux', grants: [{ project_id: foreign, scopes: ['cache:read'] }] }))).toBe('422 grant_not_allowed');
  });
});

describe('exec and files', () => {
  it('runs commands with args, stdin, env and cwd, without the server environment', async () => {
    process.env.SLIPWAY_TEST_SECRET_TOKEN = 'hunter2-server-side';
    const run = await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'cat; echo "$GREETING"; pwd; env | grep -c SECRET || true'], stdin: 'in\n', env: { GREETING: 'hi' }, cwd: 'src' });
    expect(run.exit_code).toBe(0);
    const [stdin, greeting, cwd, secretCount] = run.stdout.trim().split('\n');
    expect([stdin, greeting, secretCount]).toEqual(['in', 'hi', '0']);
    // Confined (the service default): the sandbox sees its own tree at /workspace, never a host path.
    expect(cwd).toBe('/workspace/src');
    const fail = await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'echo oops >&2; exit 3'] });
    expect(fail).toMatchObject({ exit_code: 3, stderr: 'oops\n' });
    const slow = await a.api.exec(sandboxId, { command: 'sleep', args: ['5'], timeout_seconds: 0.3 });
    expect(slow.timed_out).toBe(true);
    expect(await codeOf(a.api.exec(sandboxId, { command: 'true', cwd: '../..' }))).toBe('400 path_refused');
  });

  it('reads, writes and deletes files as raw bytes', async () => {
    const bytes = Buffer.from([0, 1, 2, 255, 10]);
    await a.api.writeFile(sandboxId, 'data/blob.bin', bytes);
    expect(Buffer.compare(await a.api.readFile(sandboxId, 'data/blob.bin'), bytes)).toBe(0);
    await a.api.writeFile(sandboxId, 'data/config.json', Buffer.from('{"a":1}'));
    expect((await a.api.readFile(sandboxId, 'data/config.json')).toString()).toBe('{"a":1}'); // JSON stays bytes
    await a.api.deleteFile(sandboxId, 'data/blob.bin');
    expect(await codeOf(a.api.readFile(sandboxId, 'data/blob.bin'))).toBe('404 file_not_found');
    expect(await codeOf(a.api.readFile(sandboxId, 'src'))).toBe('400 is_a_directory');
  });

  it('lists a folder: entries by name, links not followed, .git and .slipway left out', async () => {
    await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'mkdir -p listed/sub listed/.slipway && printf 12345 > listed/five && ln -sfn five listed/ln && ln -sfn ../.. listed/up'] });
    expect(await a.api.listFiles(sandboxId, 'listed')).toEqual({
      path: 'listed',
      entries: [
        { name: 'five', type: 'file', size: 5 },
        { name: 'ln', type: 'symlink', size: expect.any(Number) },
        { name: 'sub', type: 'directory', size: expect.any(Number) },
        { name: 'up', type: 'symlink', size: expect.any(Number) },
      ],
      truncated: false,
    });
    expect((await a.api.listFiles(sandboxId)).entries.map((e) => e.name)).not.toContain('.git');
    // A folder reached through a link out of the sandbox, a reserved one, a file: refused.
    expect(await codeOf(a.api.listFiles(sandboxId, 'listed/up'))).toBe('400 path_refused');
    expect(await codeOf(a.api.listFiles(sandboxId, '.git'))).toBe('400 path_refused');
    expect(await codeOf(a.api.listFiles(sandboxId, 'listed/five'))).toBe('400 not_a_directory');
    expect(await codeOf(a.api.listFiles(sandboxId, 'no-such'))).toBe('404 file_not_found');
  });

  it('refuses path traversal and symlink escapes', async () => {
    const outside = path.join(path.dirname(h.repo), 'outside-secret.txt');
    await fs.writeFile(outside, 'secret\n');
    await a.api.exec(sandboxId, { command: 'sh', args: ['-c', `ln -s ${outside} leak && ln -s ${path.dirname(h.repo)} updir && ln -s ../../../.. climb`] });
    for (const p of ['../../../../etc/passwd', 'leak', 'updir/outside-secret.txt', 'climb/etc/passwd', 'src/../../x']) {
      expect(await codeOf(a.api.readFile(sandboxId, p))).toBe('400 path_refused');
    }
    expect(await codeOf(a.api.writeFile(sandboxId, 'updir/planted.txt', Buffer.from('x')))).toBe('400 path_refused');
    expect(await codeOf(a.api.writeFile(sandboxId, 'leak', Buffer.from('x')))).toBe('400 path_refused');
    // Percent-encoded dots and absolute paths through raw HTTP.
    for (const p of ['%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd', '..%2f..%2f..%2f..%2fetc%2fpasswd', '%2fetc%2fpasswd']) {
      const res = await raw('GET', `/api/v1/sandboxes/${sandboxId}/files/${p}`, { token: a.token });
      expect([400, 404]).toContain(res.status);
      expect(await res.text()).not.toContain('root:');
    }
    // Deleting a link removes the link, never its target.
    await a.api.deleteFile(sandboxId, 'leak');
    expect(readFileSync(outside, 'utf8')).toBe('secret\n');
  });
});

describe('grants', () => {
  it('writes short-lived scoped tokens inside the sandbox, bounded by the deadline, revoked at the end', async () => {
    // The files API refuses .slipway/ (Slipway's own state); the sandbox's commands read it.
    expect(await codeOf(a.api.readFile(sandboxId, GRANTS_FILE))).toBe('400 path_refused');
    const file = JSON.parse((await a.api.exec(sandboxId, { command: 'cat', args: [GRANTS_FILE] })).stdout) as { grants: Array<{ token: string; scopes: string[]; expires_at: string }> };
    expect(file.grants).toHaveLength(1);
    const [grant] = file.grants;
    secrets.push(grant!.token);
    grantToken = grant!.token;
    const sandbox = await a.api.get(sandboxId);
    expect(Date.parse(grant!.expires_at)).toBeLessThanOrEqual(Date.parse(sandbox.deadline_at!));
    expect(Date.parse(grant!.expires_at)).toBeLessThanOrEqual(Date.now() + 60 * 60_000 + 1_000);
    const introspect = await raw('GET', '/api/v1/grants/introspect', { token: grant!.token });
    expect(await introspect.json()).toMatchObject({ sandbox_id: sandboxId, scopes: ['cache:read', 'registry:write'] });
    // The grant token is not an account token.
    expect((await raw('GET', '/api/v1/sandboxes', { token: grant!.token })).status).toBe(401);
    // Git ignores the grants file.
    expect((await a.api.exec(sandboxId, { command: 'git', args: ['status', '--porcelain', '--', '.slipway'] })).stdout).toBe('');
  });
});

describe('concurrency limit over HTTP', () => {
  it('admits exactly the limit under parallel creates; the rest get 429', async () => {
    const c = await h.account({ limit: 1 });
    await c.profile({ name: 'p' });
    const results = await Promise.all(Array.from({ length: 6 }, () => c.api.create({ profile: 'p' }).then((s) => s.id, (e: ApiClientError) => `${e.status} ${e.code}`)));
    const ok = results.filter((r) => r.startsWith('sbx_'));
    expect(ok).toHaveLength(1);
    expect(results.filter((r) => r === '429 concurrency_limit')).toHaveLength(5);
    created.push(...ok);
    await c.api.get(ok[0]!, 30);
    await c.api.destroy(ok[0]!);
  });
});

describe('MCP over HTTP', () => {
  it('drives a sandbox end to end with the six tools', async () => {
    const transport = new StreamableHTTPClientTransport(new URL('/mcp', h.url), { requestInit: { headers: { authorization: `Bearer ${a.token}` } } });
    const mcp = new McpClient({ name: 'test', version: '1.0.0' });
    await mcp.connect(transport);
    try {
      const listed = (await mcp.listTools()).tools;
      const tools = listed.map((t) => t.name).sort();
      expect(tools).toEqual([...MCP_TOOLS].sort());
      // Every input is described; results have schemas; destructive tools say so.
      for (const tool of listed) {
        for (const [name, prop] of Object.entries(tool.inputSchema.properties ?? {})) expect((prop as { description?: string }).description, `${tool.name}.${name}`).toBeTruthy();
      }
      const byName = Object.fromEntries(listed.map((t) => [t.name, t]));
      expect(byName.destroy_sandbox!.annotations).toMatchObject({ destructiveHint: true });
      expect(byName.exec_in_sandbox!.annotations).toMatchObject({ destructiveHint: true });
      expect(byName.read_sandbox_file!.annotations).toMatchObject({ readOnlyHint: true });
      expect(Object.keys(byName.exec_in_sandbox!.outputSchema?.properties ?? {})).toContain('exit_code');
      expect(Object.keys(byName.create_sandbox!.outputSchema?.properties ?? {})).toContain('status');
      const call = async (name: string, args: Record<string, unknown>) => {
        const r = (await mcp.callTool({ name, arguments: args })) as { isError?: boolean; content: Array<{ text: string }> };
        return { isError: r.isError ?? false, text: r.content[0]!.text };
      };
      const createdRes = await call('create_sandbox', { profile: 'linux' });
      expect(createdRes.isError).toBe(false);
      const id = (JSON.parse(createdRes.text) as { id: string }).id;
      created.push(id);
      expect(JSON.parse((await call('wait_sandbox_ready', { sandbox_id: id, timeout_seconds: 30 })).text)).toMatchObject({ status: 'ready' });
      expect((await call('write_sandbox_file', { sandbox_id: id, path: 'hello.txt', content: 'from mcp\n' })).text).toMatch(/wrote 9 bytes/);
      expect((await call('read_sandbox_file', { sandbox_id: id, path: 'hello.txt' })).text).toBe('from mcp\n');
      const exec = JSON.parse((await call('exec_in_sandbox', { sandbox_id: id, command: 'cat', args: ['hello.txt'] })).text);
      expect(exec).toMatchObject({ exit_code: 0, stdout: 'from mcp\n' });
      const refused = await call('read_sandbox_file', { sandbox_id: id, path: '../../../../etc/passwd' });
      expect(refused).toMatchObject({ isError: true });
      expect(refused.text).toMatch(/^path_refused/);
      expect((await call('exec_in_sandbox', { sandbox_id: sandboxId.replace(/.$/, (last) => (last === 'a' ? 'b' : 'a')), command: 'true' })).text).toMatch(/^not_found/);
      expect(JSON.parse((await call('destroy_sandbox', { sandbox_id: id })).text).id).toBe(id);
      await h.waitFor(a.api, id, ['terminated']);
    } finally {
      await mcp.close();
    }
    // Same auth as REST.
    const anon = await raw('POST', '/mcp', { body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }), headers: { accept: 'application/json, text/event-stream' } });
    expect(anon.status).toBe(401);
  });
});

describe('documents and metrics', () => {
  it('serves the OpenAPI document, identical to the committed api/openapi.json', async () => {
    const served = await (await raw('GET', '/api/v1/openapi.json')).json();
    expect(JSON.stringify(served, null, 2) + '\n').toBe(renderOpenApi());
    expect(readFileSync(OPENAPI_FILE, 'utf8')).toBe(renderOpenApi()); // run `npm run openapi` after changing a schema
    expect(Object.keys((served as { paths: object }).paths)).toContain('/api/v1/sandboxes/{id}/exec');
  });

  it('exposes Prometheus metrics: provisioning, exec duration, sandboxes by account and state', async () => {
    const text = await (await raw('GET', '/metrics')).text();
    expect(text).toMatch(/slipway_sandbox_provisioning_seconds_count\{platform="linux",kind="cold_boot"\} \d+/);
    expect(text).toMatch(new RegExp(`slipway_sandbox_exec_duration_seconds_count\\{account="${a.id}",platform="linux"\\} \\d+`));
    expect(text).toContain(`slipway_sandboxes{account="${a.id}",platform="linux",state="ready"} 1`);
  });
});

describe('billing activities', () => {
  it('writes a transition once when the activity is retried', async () => {
    const acts = createSandboxServiceActivities({ db: h.database.db, providerFor: defaultProviderFor() });
    const { rows } = await h.database.db.query<{ n: number }>('SELECT count(*)::int AS n FROM sandbox_sessions WHERE sandbox_id = $1', [sandboxId]);
    const open = { sandboxId, status: 'ready' as const, open: { kind: 'compute' as const, seq: 1, startedAtMs: Date.now() } };
    await acts.recordSandboxTransition(open);
    await acts.recordSandboxTransition(open);
    expect((await h.sessions(sandboxId)).length).toBe(rows[0]!.n);
  });
});

describe('secrets', () => {
  it('keeps tokens out of logs and workflow history', async () => {
    await a.api.destroy(sandboxId);
    await h.waitFor(a.api, sandboxId, ['terminated']);
    expect(secrets.length).toBeGreaterThanOrEqual(4);
    expect(grantToken).toMatch(/^slpg_/);
    expect((await raw('GET', '/api/v1/grants/introspect', { token: grantToken })).status).toBe(401); // revoked at terminate
    const logText = h.logs.join('\n');
    expect(h.logs.length).toBeGreaterThan(10);
    expect(logText).toContain(sandboxId);
    for (const secret of secrets) expect(logText).not.toContain(secret);
    expect(logText).not.toMatch(/slpg?_[A-Za-z0-9_-]{20,}/);
    for (const id of created) {
      const history = await h.host.client.workflow.getHandle(serviceSandboxWorkflowId(id)).fetchHistory();
      // Payloads are bytes: decode them so the scan sees what Temporal stores.
      const text = JSON.stringify(history, (_k, v) => {
        if (v instanceof Uint8Array) return Buffer.from(v).toString('utf8');
        if (_k === 'data' && typeof v === 'string') return Buffer.from(v, 'base64').toString('utf8');
        return v;
      });
      expect(text).toContain('"sandboxId\\":\\"' + id);
      for (const secret of secrets) {
        expect(text).not.toContain(secret);
        expect(text).not.toContain(Buffer.from(secret).toString('base64'));
      }
    }
  });
});
