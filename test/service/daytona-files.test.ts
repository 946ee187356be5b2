/**
 * The files API (REST `/sandboxes/:id/files...` and the MCP file tools) on a Daytona sandbox:
 * the calls reach the remote sandbox through its provider's file API (the real SDK against the
 * local fake of Daytona's API; real Postgres, Temporal, HTTP, MCP SDK client), never a folder on
 * the API's host. Reads are stat-first and capped; paths are confined and `.git` / `.slipway`
 * refused after links are followed inside the sandbox; Daytona's failures answer as exec's do.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { Client as McpClient } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaSandboxProvider } from '../../activities/sandbox/daytona';
import { defaultProviderFor } from '../../activities/service/providers';
import { FakeDaytona } from '../helpers/fake-daytona';
import { codeOf, rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

const LIMIT = 4096;
const fake = new FakeDaytona();
let h: ServiceHarness;
let a: TestAccount;
let id: string;

beforeAll(async () => {
  await fake.start();
  // No retries: an injected failure is answered at once, not after the provider's backoff.
  h = await startServiceHarness({ fileLimitBytes: LIMIT, execConcurrency: 8, providerFor: defaultProviderFor({ daytona: { apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', snapshot: 'slipway-test', retries: 0 } }) });
  a = await h.account({ limit: 4 });
  await a.profile({ name: 'daytona', provider: 'daytona' });
  id = (await a.api.create({ profile: 'daytona' })).id;
  await h.waitFor(a.api, id, ['ready'], 60_000);
}, 120_000);
afterAll(async () => {
  await h?.stop();
  await fake.stop();
});

const sh = (script: string) => ({ command: 'sh', args: ['-c', script] });
const rootOf = async (sandbox: string) => (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [sandbox])).rows[0]!.root;
const daytonaId = async (sandbox: string) => (JSON.parse(await fs.readFile(`${await rootOf(sandbox)}.json`, 'utf8')) as { daytonaId: string }).daytonaId;
const workspace = async (sandbox: string) => path.join(fake.sandboxes.get(await daytonaId(sandbox))!.home, 'workspace');
type ErrorBody = { error: { code: string; message: string; issues?: Array<{ path: string; message: string }> } };
const files = (sandbox: string, p: string) => `/api/v1/sandboxes/${sandbox}/files/${encodeURIComponent(p)}`;
const raw = async (method: string, url: string, body?: Buffer) => {
  const res = await rawRequest(h.url, method, url, { token: a.token, ...(body ? { body, headers: { 'content-type': 'application/octet-stream' } } : {}) });
  const text = Buffer.from(await res.arrayBuffer());
  return { status: res.status, text, error: res.status >= 400 && text.length ? (JSON.parse(text.toString()) as ErrorBody).error : undefined, retryAfter: res.headers.get('retry-after') };
};

describe('REST files on a Daytona sandbox', () => {
  it('writes, reads, lists and deletes in the remote workspace, nothing on the API host', async () => {
    const bytes = Buffer.from([0, 1, 2, 255, 10, 13, 0]);
    await a.api.writeFile(id, 'notes/deep/bin.dat', bytes);
    const ws = await workspace(id);
    // It is in the Daytona sandbox's workspace ...
    expect([...(await fs.readFile(path.join(ws, 'notes/deep/bin.dat')))]).toEqual([...bytes]);
    // The Daytona sandbox is labelled with the account's group and the sandbox's id (list by label finds it).
    expect(fake.sandboxes.get(await daytonaId(id))!.labels).toMatchObject({ 'slipway.group': `acct-${a.id}`, 'slipway.sandbox': id, 'slipway.name': id });
    // ... and the sandbox's root on this host is only Slipway's record, no folder.
    expect(existsSync(await rootOf(id))).toBe(false);
    expect([...(await a.api.readFile(id, 'notes/deep/bin.dat'))]).toEqual([...bytes]);
    // A file a command made is read back; a write is what a command sees.
    await a.api.exec(id, sh('printf made-inside > by-command.txt && mkdir -p notes/sub && ln -sfn deep notes/link'));
    expect((await a.api.readFile(id, 'by-command.txt')).toString()).toBe('made-inside');
    expect((await a.api.exec(id, { command: 'cat', args: ['notes/deep/bin.dat'] })).stdout).toBe(bytes.toString());
    const listed = await a.api.listFiles(id, 'notes');
    expect(listed).toEqual({
      path: 'notes',
      entries: [
        { name: 'deep', type: 'directory', size: expect.any(Number) },
        { name: 'link', type: 'symlink', size: expect.any(Number) },
        { name: 'sub', type: 'directory', size: expect.any(Number) },
      ],
      truncated: false,
    });
    expect((await a.api.listFiles(id, 'notes/link')).entries).toEqual([{ name: 'bin.dat', type: 'file', size: bytes.length }]);
    // The root's listing leaves .git (and .slipway) out.
    const top = (await a.api.listFiles(id)).entries.map((e) => e.name);
    expect(top).toContain('by-command.txt');
    expect(top).not.toContain('.git');
    expect(await fs.stat(path.join(ws, '.git')).then((s) => s.isDirectory())).toBe(true);
    // Delete removes a link, never its target; a file already gone is fine.
    await a.api.deleteFile(id, 'notes/link');
    expect(existsSync(path.join(ws, 'notes/link'))).toBe(false);
    expect(existsSync(path.join(ws, 'notes/deep/bin.dat'))).toBe(true);
    await a.api.deleteFile(id, 'notes/deep/bin.dat');
    expect(existsSync(path.join(ws, 'notes/deep/bin.dat'))).toBe(false);
    expect(await codeOf(a.api.deleteFile(id, 'notes/deep/bin.dat'))).toBe('ok');
    expect(await codeOf(a.api.readFile(id, 'notes/deep/bin.dat'))).toBe('404 file_not_found');
  });

  it('answers what a path is not: a folder to read or delete, a file to list, a missing folder', async () => {
    expect(await codeOf(a.api.readFile(id, 'notes'))).toBe('400 is_a_directory');
    expect(await codeOf(a.api.deleteFile(id, 'notes'))).toBe('400 is_a_directory');
    expect(await codeOf(a.api.writeFile(id, 'notes', Buffer.from('x')))).toBe('400 is_a_directory');
    const notDir = await raw('GET', `/api/v1/sandboxes/${id}/files?path=by-command.txt`);
    expect([notDir.status, notDir.error?.code, notDir.error?.issues?.[0]?.path]).toEqual([400, 'not_a_directory', 'path']);
    expect(await codeOf(a.api.listFiles(id, 'no/such/folder'))).toBe('404 file_not_found');
    await a.api.exec(id, sh('mkfifo a-fifo'));
    expect(await codeOf(a.api.readFile(id, 'a-fifo'))).toBe('400 not_a_regular_file');
  });

  it('refuses a file over the limit with 413 naming the limit, from the stat, before any download', async () => {
    await a.api.exec(id, sh(`head -c ${LIMIT + 1} /dev/zero > big.bin && head -c ${LIMIT} /dev/zero > exactly.bin`));
    const before = fake.requests.filter((r) => r.endsWith('/files/bulk-download')).length;
    const res = await raw('GET', files(id, 'big.bin'));
    expect([res.status, res.error?.code]).toEqual([413, 'file_too_large']);
    expect(res.error?.message).toContain(`limit of ${LIMIT} bytes`);
    expect(fake.requests.filter((r) => r.endsWith('/files/bulk-download')).length).toBe(before);
    // At the limit is fine.
    expect((await a.api.readFile(id, 'exactly.bin')).length).toBe(LIMIT);
    // Writes over the limit are refused too, and nothing is written.
    const put = await raw('PUT', files(id, 'too-big.bin'), Buffer.alloc(LIMIT + 1));
    expect(put.status).toBe(413);
    expect(existsSync(path.join(await workspace(id), 'too-big.bin'))).toBe(false);
  });

  it('sends what the stat saw: a file growing between the stat and the download is cut there', async () => {
    const ws = await workspace(id);
    await fs.writeFile(path.join(ws, 'growing.log'), 'first part\n');
    fake.afterFileInfo = async (file) => {
      if (file.endsWith('growing.log')) await fs.appendFile(file, 'x'.repeat(LIMIT * 4));
    };
    try {
      const res = await raw('GET', files(id, 'growing.log'));
      expect(res.status).toBe(200);
      expect(res.text.toString()).toBe('first part\n');
    } finally {
      fake.afterFileInfo = undefined;
    }
    // The provider's own stream carries exactly the stat's bytes (not just an HTTP body cut by its content-length) ...
    const provider = new DaytonaSandboxProvider({ apiKey: fake.apiKey, apiUrl: fake.url, target: 'fake', retries: 0 });
    const handle = { root: await rootOf(id) };
    await fs.writeFile(path.join(ws, 'grows.log'), 'first part\n');
    await fs.writeFile(path.join(ws, 'shrinks.log'), 'a longer first part\n');
    fake.afterFileInfo = async (file) => {
      if (file.endsWith('grows.log')) await fs.appendFile(file, 'x'.repeat(LIMIT * 4));
      if (file.endsWith('shrinks.log')) await fs.truncate(file, 3);
    };
    try {
      const grown = await provider.openFile(handle, 'grows.log', { maxBytes: LIMIT });
      expect(grown.size).toBe(11);
      expect(Buffer.concat(await grown.stream.toArray()).toString()).toBe('first part\n');
      // ... and one that shrank meanwhile ends in an error, never a short file passed off as whole.
      const shrunk = await provider.openFile(handle, 'shrinks.log', { maxBytes: LIMIT });
      await expect(shrunk.stream.toArray()).rejects.toThrow(/shrank while it was read \(3 of 20 bytes\)/);
    } finally {
      fake.afterFileInfo = undefined;
    }
    // The file did grow past the limit on the sandbox: the next read is refused.
    expect((await fs.stat(path.join(ws, 'growing.log'))).size).toBeGreaterThan(LIMIT);
    expect(await codeOf(a.api.readFile(id, 'growing.log'))).toBe('413 file_too_large');
  });

  it('confines paths to the workspace and refuses .git and .slipway after following links inside the sandbox (400 naming the path)', async () => {
    await a.api.exec(id, sh('ln -sfn / to-root && ln -sfn .. to-parent && ln -sfn .git g && mkdir -p .slipway d && ln -sfn ../.slipway d/s && ln -sfn .git/config cfg'));
    const ws = await workspace(id);
    const refused = ['../outside.txt', 'sub/../../outside.txt', 'to-root/etc/hostname', 'to-parent/outside.txt', '.git/config', '.GIT/config', 'g/config', 'cfg', '.slipway/grants.json', 'd/s/x', 'notes/../.git/HEAD'];
    for (const p of refused) {
      // A delete does not follow the last component: deleting `cfg` removes that link (below).
      for (const [method, body] of [['GET'], ['PUT', Buffer.from('pwned')], ...(p === 'cfg' ? [] : [['DELETE']])] as Array<[string, Buffer?]>) {
        const res = await raw(method, files(id, p), body);
        expect([p, method, res.status, res.error?.code]).toEqual([p, method, 400, 'path_refused']);
        expect(res.error?.issues?.map((i) => i.path)).toEqual(['path']);
        expect(res.error?.message).toContain(`"${p}"`);
      }
      const list = await raw('GET', `/api/v1/sandboxes/${id}/files?path=${encodeURIComponent(p)}`);
      expect([p, list.status, list.error?.code]).toEqual([p, 400, 'path_refused']);
    }
    // An absolute path is refused as such.
    expect((await raw('GET', files(id, '/etc/hostname'))).error?.code).toBe('path_refused');
    // Nothing was written or removed through any of them.
    expect(existsSync(path.join(path.dirname(ws), 'outside.txt'))).toBe(false);
    expect((await fs.readFile(path.join(ws, '.git/config'), 'utf8')).includes('pwned')).toBe(false);
    expect(existsSync(path.join(ws, '.git/HEAD'))).toBe(true);
    expect(existsSync(path.join(ws, '.slipway/x'))).toBe(false);
    await a.api.deleteFile(id, 'cfg');
    expect(existsSync(path.join(ws, 'cfg'))).toBe(false);
    expect(existsSync(path.join(ws, '.git/config'))).toBe(true);
    // A link that stays inside (and off the reserved folders) is followed.
    await a.api.exec(id, sh('mkdir -p real && printf inside > real/f && ln -sfn real alias'));
    expect((await a.api.readFile(id, 'alias/f')).toString()).toBe('inside');
  });
});

describe('Daytona failures on file calls are answered as on exec', () => {
  it('an outage is 503 provider_unavailable with Retry-After; the next call works', async () => {
    await a.api.writeFile(id, 'ok.txt', Buffer.from('ok'));
    // [the API call, the Daytona route that fails]
    const calls: Array<[string, string, Buffer | undefined, string, RegExp]> = [
      ['GET', files(id, 'ok.txt'), undefined, 'GET', /\/files\/info$/],
      ['PUT', files(id, 'new.txt'), Buffer.from('n'), 'POST', /\/files\/bulk-upload$/],
      ['DELETE', files(id, 'ok.txt'), undefined, 'DELETE', /\/files$/],
      ['GET', `/api/v1/sandboxes/${id}/files?path=.`, undefined, 'GET', /\/files$/],
    ];
    for (const [method, url, body, daytonaMethod, route] of calls) {
      fake.inject({ method: daytonaMethod, path: route, status: 503, times: 1 });
      const res = await raw(method, url, body);
      expect([method, url, res.status, res.error?.code]).toEqual([method, url, 503, 'provider_unavailable']);
      expect(Number(res.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(res.error?.message).not.toContain(fake.url);
    }
    fake.clearFailures();
    expect((await a.api.readFile(id, 'ok.txt')).toString()).toBe('ok');
  });

  it("a rate limit is 503 with Daytona's reset as Retry-After", async () => {
    fake.inject({ method: 'GET', path: /\/files\/info$/, status: 429, headers: { 'retry-after': '42' }, times: 1 });
    const res = await raw('GET', files(id, 'ok.txt'));
    expect([res.status, res.error?.code]).toEqual([503, 'provider_unavailable']);
    expect(Number(res.retryAfter)).toBeGreaterThanOrEqual(40);
    expect(Number(res.retryAfter)).toBeLessThanOrEqual(42);
  });

  it("Daytona's 4xx on an upload: 400 passes its reason naming the file, 404 is no such file, 409 a conflict, 429 a 503 with its reset", async () => {
    const upload = /\/files\/bulk-upload$/;
    const ws = await workspace(id);
    fake.inject({ method: 'POST', path: upload, status: 400, body: { statusCode: 400, message: `invalid destination path: ${ws}/odd name.txt`, error: 'Bad Request' } });
    const bad = await raw('PUT', files(id, 'odd name.txt'), Buffer.from('x'));
    expect([bad.status, bad.error?.code]).toEqual([400, 'provider_refused']);
    expect(bad.error?.message).toContain('"odd name.txt"');
    expect(bad.error?.message).toContain(`invalid destination path: ${ws}/odd name.txt`);
    expect(bad.error?.issues).toEqual([{ path: 'path', message: bad.error?.message }]);
    // Nothing was written.
    expect(existsSync(path.join(ws, 'odd name.txt'))).toBe(false);

    fake.inject({ method: 'POST', path: upload, status: 404, body: { statusCode: 404, message: 'no such file or directory', error: 'Not Found' } });
    expect(await codeOf(a.api.writeFile(id, 'missing/parent.txt', Buffer.from('x')))).toBe('404 file_not_found');

    fake.inject({ method: 'POST', path: upload, status: 409, body: { statusCode: 409, message: 'sandbox is busy', error: 'Conflict' } });
    const busy = await raw('PUT', files(id, 'busy.txt'), Buffer.from('x'));
    expect([busy.status, busy.error?.code]).toEqual([409, 'provider_conflict']);
    expect(busy.error?.message).toContain('sandbox is busy');

    fake.inject({ method: 'POST', path: upload, status: 429, headers: { 'retry-after': '30' } });
    const limited = await raw('PUT', files(id, 'limited.txt'), Buffer.from('x'));
    expect([limited.status, limited.error?.code]).toEqual([503, 'provider_unavailable']);
    expect(Number(limited.retryAfter)).toBeGreaterThanOrEqual(28);
    expect(Number(limited.retryAfter)).toBeLessThanOrEqual(30);

    // The next upload works.
    fake.clearFailures();
    await a.api.writeFile(id, 'after.txt', Buffer.from('fine'));
    expect((await a.api.readFile(id, 'after.txt')).toString()).toBe('fine');
  });

  it('refused credentials are 502 provider_error', async () => {
    fake.inject({ method: 'POST', path: /\/files\/bulk-upload$/, status: 401, times: 1 });
    const res = await raw('PUT', files(id, 'cred.txt'), Buffer.from('x'));
    expect([res.status, res.error?.code]).toEqual([502, 'provider_error']);
    expect(h.logs.some((l) => l.includes('the sandbox provider failed a call'))).toBe(true);
  });

  it('a sandbox Daytona deleted behind Slipway answers 409 sandbox_ended on every file call', async () => {
    const other = (await a.api.create({ profile: 'daytona' })).id;
    await h.waitFor(a.api, other, ['ready'], 60_000);
    await a.api.writeFile(other, 'f.txt', Buffer.from('x'));
    const deleted = await fetch(`${fake.url}/sandbox/${await daytonaId(other)}`, { method: 'DELETE', headers: { authorization: `Bearer ${fake.apiKey}` } });
    expect(deleted.status).toBe(200);
    expect(await codeOf(a.api.readFile(other, 'f.txt'))).toBe('409 sandbox_ended');
    expect(await codeOf(a.api.writeFile(other, 'f.txt', Buffer.from('y')))).toBe('409 sandbox_ended');
    expect(await codeOf(a.api.deleteFile(other, 'f.txt'))).toBe('409 sandbox_ended');
    expect(await codeOf(a.api.listFiles(other))).toBe('409 sandbox_ended');
    await h.waitFor(a.api, other, ['terminated', 'failed'], 30_000);
  });
});

describe('MCP file tools on a Daytona sandbox', () => {
  it('write, read (utf8 and base64), list and delete through the MCP SDK client; refusals come back as tool errors', async () => {
    const transport = new StreamableHTTPClientTransport(new URL('/mcp', h.url), { requestInit: { headers: { authorization: `Bearer ${a.token}` } } });
    const mcp = new McpClient({ name: 'test', version: '1.0.0' });
    await mcp.connect(transport);
    try {
      const call = async (name: string, args: Record<string, unknown>) => {
        const r = (await mcp.callTool({ name, arguments: { sandbox_id: id, ...args } })) as { isError?: boolean; content: Array<{ text: string }>; structuredContent?: unknown };
        return { error: r.isError === true, text: r.content[0]?.text ?? '', structured: r.structuredContent };
      };
      expect(await call('write_sandbox_file', { path: 'mcp/hello.txt', content: 'héllo\n' })).toMatchObject({ error: false, text: 'wrote 7 bytes to mcp/hello.txt' });
      expect(await call('write_sandbox_file', { path: 'mcp/bin', content: Buffer.from([0, 255, 7]).toString('base64'), encoding: 'base64' })).toMatchObject({ error: false });
      const ws = await workspace(id);
      expect(await fs.readFile(path.join(ws, 'mcp/hello.txt'), 'utf8')).toBe('héllo\n');
      expect(await call('read_sandbox_file', { path: 'mcp/hello.txt' })).toMatchObject({ error: false, text: 'héllo\n' });
      expect((await call('read_sandbox_file', { path: 'mcp/bin', encoding: 'base64' })).text).toBe(Buffer.from([0, 255, 7]).toString('base64'));
      const listed = await call('list_sandbox_files', { path: 'mcp' });
      expect(listed.structured).toEqual({ path: 'mcp', entries: [{ name: 'bin', type: 'file', size: 3 }, { name: 'hello.txt', type: 'file', size: 7 }], truncated: false });
      expect(await call('delete_sandbox_file', { path: 'mcp/bin' })).toMatchObject({ error: false, text: 'deleted mcp/bin' });
      expect(existsSync(path.join(ws, 'mcp/bin'))).toBe(false);
      // Refusals: a link to .git, a path out, a file over the limit.
      await a.api.exec(id, sh(`ln -sfn ../.git mcp/g && head -c ${LIMIT + 1} /dev/zero > mcp/big`));
      for (const [tool, args] of [
        ['read_sandbox_file', { path: 'mcp/g/config' }],
        ['write_sandbox_file', { path: 'mcp/g/hooks/pre-commit', content: 'pwned' }],
        ['delete_sandbox_file', { path: 'mcp/g/HEAD' }],
        ['list_sandbox_files', { path: 'mcp/g' }],
        ['read_sandbox_file', { path: '../../etc/hostname' }],
      ] as const) {
        const r = await call(tool, args);
        expect([tool, args.path, r.error, r.text.split(':')[0]]).toEqual([tool, args.path, true, 'path_refused']);
      }
      expect(existsSync(path.join(ws, '.git/hooks/pre-commit'))).toBe(false);
      expect(existsSync(path.join(ws, '.git/HEAD'))).toBe(true);
      const big = await call('read_sandbox_file', { path: 'mcp/big' });
      expect(big.error).toBe(true);
      expect(big.text).toMatch(new RegExp(`^file_too_large: .*limit of ${LIMIT} bytes`));
    } finally {
      await mcp.close();
    }
  });
});
