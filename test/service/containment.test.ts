/**
 * The sandbox service played by a hostile tenant with a valid token (issue 9, "Containment"):
 * unconfined profiles refused unless the operator opts in, the files API against FIFOs,
 * devices, symlink races, hard links, `.git` and long names, exec's environment kept out of
 * argv, and a client that walks away from an exec. Everything is real: HTTP, Postgres,
 * Temporal, bubblewrap. Without bubblewrap this file fails (the host refuses to start).
 */
import { promises as fs, existsSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createProfile } from '../../activities/billing/records';
import { BWRAP_MISSING_MESSAGE, findExecutable } from '../../activities/sandbox/bubblewrap';
import { openSandboxFile, readSandboxFile } from '../../activities/sandbox/file-io';
import { codeOf, rawRequest, startServiceHarness, type ServiceHarness, type TestAccount } from './harness';
import { tempDir } from './repo';
import { hostileLibrary, processName } from '../sandbox/helpers';

// Loud, never a skip: the security claims below are about bubblewrap.
if (!findExecutable('bwrap')) throw new Error(`the containment suite needs bubblewrap: ${BWRAP_MISSING_MESSAGE}`);

const FILE_LIMIT = 1024 * 1024;
let h: ServiceHarness;
let a: TestAccount;
let b!: TestAccount;
let sa: string;
let sb!: string;

beforeAll(async () => {
  h = await startServiceHarness({ fileLimitBytes: FILE_LIMIT });
  a = await h.account({ limit: 3 });
  b = await h.account({ limit: 3 });
  await a.profile({ name: 'confined' });
  await b.profile({ name: 'confined' });
  await a.profile({ name: 'open', confinement: 'none', network: true });
  [sa, sb] = await Promise.all([a.api.create({ profile: 'confined' }).then((s) => s.id), b.api.create({ profile: 'confined' }).then((s) => s.id)]);
  await Promise.all([h.waitFor(a.api, sa, ['ready']), h.waitFor(b.api, sb, ['ready'])]);
});
afterAll(async () => {
  await h?.stop();
});

const raw = (method: string, p: string, opts: Parameters<typeof rawRequest>[3] = {}) => rawRequest(h.url, method, p, opts);

const sh = (script: string, extra: Record<string, unknown> = {}) => ({ command: 'sh', args: ['-c', script], ...extra });
const rootOf = async (id: string) => (await h.database.db.query<{ root: string }>('SELECT root FROM sandboxes WHERE id = $1', [id])).rows[0]!.root;

/** Polls `check` until it is true (conditions, not wall-clock windows); fails after `ms`. */
async function until(check: () => Promise<boolean> | boolean, what: string, ms = 30_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('unconfined tenants need the operator to opt in', () => {
  it('profiles default to bubblewrap without network', async () => {
    const p = await createProfile(h.database.db, a.id, { name: 'defaults', repository: h.repo });
    expect(p).toMatchObject({ confinement: 'bubblewrap', network: false });
  });

  it('refuses to create a sandbox from a confinement "none" profile: 422 naming the field, nothing started', async () => {
    const res = await raw('POST', '/api/v1/sandboxes', { token: a.token, body: JSON.stringify({ profile: 'open' }) });
    expect(res.status).toBe(422);
    const body = (await res.json()) as { error: { code: string; message: string; issues: Array<{ path: string }> } };
    expect(body.error.code).toBe('unconfined_refused');
    expect(body.error.issues.map((i) => i.path)).toEqual(['profile.confinement']);
    expect(body.error.message).toContain('--allow-unconfined');
    const { rows } = await h.database.db.query<{ n: number }>(`SELECT count(*)::int AS n FROM sandboxes s JOIN sandbox_profiles p ON p.id = s.profile_id WHERE p.name = 'open'`);
    expect(rows[0]!.n).toBe(0);
  });

  it('reports slipway_unconfined_allowed 0', async () => {
    expect(await (await raw('GET', '/metrics')).text()).toMatch(/^slipway_unconfined_allowed 0$/m);
  });

  it('runs service sandboxes confined and offline', async () => {
    const marker = path.join(h.repo, 'escaped-marker');
    // Whatever the sandbox sees at that path (nothing, read-only, or its private tmpfs), the host's repository is untouched.
    const run = await a.api.exec(sa, sh(`cat /proc/net/dev; echo x > '${marker}'`));
    expect(existsSync(marker)).toBe(false);
    // Own network namespace: only the loopback device.
    const devices = run.stdout.split('\n').slice(2).filter(Boolean).map((l) => l.trim().split(':')[0]);
    expect(devices).toEqual(['lo']);
  });

  it('a server started with the opt-in serves them, says so at start-up and in /metrics', async () => {
    const open = await startServiceHarness({ allowUnconfined: true });
    try {
      const c = await open.account();
      await c.profile({ name: 'open', confinement: 'none' });
      const { id } = await c.api.create({ profile: 'open' });
      await open.waitFor(c.api, id, ['ready']);
      expect((await c.api.exec(id, { command: 'true' })).exit_code).toBe(0);
      expect(open.logs.some((l) => l.includes('"level":40') && l.includes('unconfined profiles are allowed'))).toBe(true);
      expect(await (await fetch(new URL('/metrics', open.url))).text()).toMatch(/^slipway_unconfined_allowed 1$/m);
      await c.api.destroy(id);
      await open.waitFor(c.api, id, ['terminated']);
    } finally {
      await open.stop();
    }
  });
});

/** Times one exec of the other tenant (b): the service must keep serving it during an attack by a. */
async function otherTenantExecMs(): Promise<number> {
  const started = Date.now();
  const run = await b.api.exec(sb, { command: 'true' });
  expect(run.exit_code).toBe(0);
  return Date.now() - started;
}

describe('files API: what it refuses', () => {
  it("refuses .git and .slipway paths, also through links and in any case: 400 naming the path", async () => {
    const root = await rootOf(sa);
    const gitLink = await fs.readFile(path.join(root, '.git'), 'utf8');
    await a.api.exec(sa, sh('ln -s .git g && mkdir -p sub && ln -s ../.slipway sub/s'));
    for (const p of ['.git/config', '.git', '.slipway/grants.json', 'src/.GIT/hooks/pre-commit', '.Slipway/x', 'g/config', 'sub/s/grants.json']) {
      const put = await raw('PUT', `/api/v1/sandboxes/${sa}/files/${encodeURIComponent(p)}`, { token: a.token, body: Buffer.from('[core]\n\tfsmonitor = /bin/evil\n') });
      expect(put.status, p).toBe(400);
      const body = (await put.json()) as { error: { code: string; message: string } };
      expect(body.error.code).toBe('path_refused');
      expect(body.error.message).toContain(p);
      expect(await codeOf(a.api.readFile(sa, p))).toBe('400 path_refused');
      expect(await codeOf(a.api.deleteFile(sa, p))).toBe('400 path_refused');
    }
    expect(await fs.readFile(path.join(root, '.git'), 'utf8')).toBe(gitLink);
  });

  it('answers 400 for a path component over 255 bytes, and for a path over 4096', async () => {
    for (const p of ['x'.repeat(256), `src/${'é'.repeat(128)}`, `${'d/'.repeat(2100)}f`]) {
      expect(await codeOf(a.api.writeFile(sa, p, Buffer.from('x')))).toBe('400 name_too_long');
      expect(await codeOf(a.api.readFile(sa, p))).toBe('400 name_too_long');
    }
    await a.api.writeFile(sa, 'y'.repeat(255), Buffer.from('ok')); // the longest name is fine
    expect((await a.api.readFile(sa, 'y'.repeat(255))).toString()).toBe('ok');
  });

  it('refuses FIFOs and devices without blocking anyone: 400, and the other tenant keeps being served', async () => {
    const root = await rootOf(sa);
    await a.api.exec(sa, sh('for i in 1 2 3 4 5 6 7 8 9 10 11 12; do mkfifo fifo$i; done'));
    // A device node (made from the host: a tenant should not be able to, but the API must not care).
    await fs.rm(path.join(root, 'null-device'), { force: true });
    const { execFileSync } = await import('node:child_process');
    execFileSync('mknod', [path.join(root, 'null-device'), 'c', '1', '3']);
    const names = [...Array.from({ length: 12 }, (_, i) => `fifo${i + 1}`), 'null-device'];
    // More blocking opens than libuv has threads, were they to block.
    const attack = Promise.all(names.map((p) => codeOf(a.api.readFile(sa, p))));
    const latency = await otherTenantExecMs();
    expect(await attack).toEqual(Array(13).fill('400 not_a_regular_file'));
    // Writes replace the name with a regular file (never writing into the FIFO or the device).
    expect(await Promise.all(names.map((p) => codeOf(a.api.writeFile(sa, p, Buffer.from('x')))))).toEqual(Array(13).fill('ok'));
    expect((await fs.lstat(path.join(root, 'null-device'))).isFile()).toBe(true);
    console.log(`other tenant's exec during the FIFO attack: ${latency} ms`);
    expect(await otherTenantExecMs()).toBeGreaterThanOrEqual(0);
  });

  it('streams reads up to the cap and answers 413 beyond it, in the error shape', async () => {
    await a.api.exec(sa, sh(`head -c ${FILE_LIMIT} /dev/zero > at-limit; head -c ${FILE_LIMIT + 1} /dev/zero > over-limit`));
    expect((await a.api.readFile(sa, 'at-limit')).length).toBe(FILE_LIMIT);
    const over = await raw('GET', `/api/v1/sandboxes/${sa}/files/over-limit`, { token: a.token });
    expect(over.status).toBe(413);
    expect(((await over.json()) as { error: { code: string } }).error.code).toBe('file_too_large');
    const put = await raw('PUT', `/api/v1/sandboxes/${sa}/files/big`, { token: a.token, body: Buffer.alloc(FILE_LIMIT + 1) });
    expect(put.status).toBe(413);
    expect(((await put.json()) as { error: { code: string } }).error.code).toBe('too_large');
  });

  it("hard links: a confined tenant links only its own files, reads them, and writes replace the name only", async () => {
    const root = await rootOf(sa);
    // From inside, a link to anything outside the tree crosses a mount: EXDEV (or EPERM), nothing made.
    const tried = await a.api.exec(
      sa,
      sh(
        'for t in /etc/passwd /usr/bin/env "$(ls -d /run/slipway/objects/*/*/* | head -1)" "$(git rev-parse --absolute-git-dir)/HEAD" "$(git rev-parse --git-common-dir)/config"; do ln "$t" "link-$(basename "$t")" 2>&1 || echo "refused $t"; done; ls link-* 2>&1',
      ),
    );
    expect(tried.stdout.match(/^refused /gm)?.length, tried.stdout).toBe(5);
    expect(tried.stdout.match(/Invalid cross-device link$/gm)?.length, tried.stdout).toBe(5);
    expect(tried.stdout).toMatch(/No such file/); // the final ls: no link-* was made
    // The tenant's own hard link is served.
    await a.api.exec(sa, sh('rm -f own own2 && echo mine > own && ln own own2 && stat -c %h own2'));
    expect((await a.api.readFile(sa, 'own2')).toString()).toBe('mine\n');
    // A write replaces the name it names, never the file behind the other name.
    await a.api.writeFile(sa, 'own2', Buffer.from('replaced\n'));
    expect((await a.api.readFile(sa, 'own')).toString()).toBe('mine\n');
    expect((await a.api.readFile(sa, 'own2')).toString()).toBe('replaced\n');
    // Even a link made from the host side (Slipway never makes one) is only ever replaced by a PUT.
    const outside = path.join(tempDir('hardlink'), 'host-file.txt');
    await fs.writeFile(outside, 'host file\n');
    await fs.rm(path.join(root, 'hl'), { force: true });
    await fs.link(outside, path.join(root, 'hl'));
    await a.api.writeFile(sa, 'hl', Buffer.from('pwned\n'));
    expect(await fs.readFile(outside, 'utf8')).toBe('host file\n');
  });

  it('hard links stay refused where commands run unconfined (they could link any host file they can read)', async () => {
    const tree = tempDir('hardlink-open');
    const outside = path.join(tempDir('hardlink-host'), 'host-secret.txt');
    await fs.writeFile(outside, 'host secret\n');
    await fs.link(outside, path.join(tree, 'hl'));
    await expect(openSandboxFile(tree, 'hl')).rejects.toThrow(/hard link/);
    await expect(readSandboxFile(tree, 'hl', { allowHardLinks: false })).rejects.toThrow(/hard link/);
    expect((await readSandboxFile(tree, 'hl', { allowHardLinks: true })).toString()).toBe('host secret\n');
  });

  it('refuses /proc/self/root and other absolute links, and finds no proc inside the tree', async () => {
    const root = await rootOf(sa);
    await a.api.exec(sa, sh(`ln -sfn /proc/self/root/etc/passwd p1; ln -sfn /proc/self/root${root}/README.md p2; ln -sfn /proc/self/cwd p3`));
    for (const p of ['p1', 'p2', 'p3/README.md']) {
      expect(await codeOf(a.api.readFile(sa, p))).toBe('400 path_refused');
      expect(await codeOf(a.api.writeFile(sa, p, Buffer.from('x')))).toBe('400 path_refused');
    }
    expect(await codeOf(a.api.readFile(sa, 'proc/self/root/etc/passwd'))).toBe('404 file_not_found');
  });
});

describe('files API: a confined exec races symlinks against PUT', () => {
  it('never lands a file outside the sandbox (10 s and at least 300 attempts)', async () => {
    const host = tempDir('race-target');
    // The tenant keeps swapping folder `d` for a symlink to a host folder until told to stop.
    const swapper = a.api.exec(sa, sh(`while [ ! -e stop-racing ]; do rm -rf d; mkdir d; rm -rf d; ln -s '${host}' d; done; rm -rf d`, { timeout_seconds: 120 }));
    const started = Date.now();
    let attempts = 0;
    const outcomes = new Map<string, number>();
    while (attempts < 300 || Date.now() - started < 10_000) {
      const r = await codeOf(a.api.writeFile(sa, `d/planted-${attempts}.txt`, Buffer.from('x')));
      outcomes.set(r, (outcomes.get(r) ?? 0) + 1);
      attempts++;
    }
    await a.api.writeFile(sa, 'stop-racing', Buffer.from('1'));
    const run = await swapper;
    expect(run.timed_out).toBe(false);
    console.log(`symlink race: ${attempts} PUTs in ${Date.now() - started} ms: ${JSON.stringify(Object.fromEntries(outcomes))}`);
    expect(await fs.readdir(host)).toEqual([]);
    if (outcomes.has('500 internal')) console.log(h.logs.filter((l) => l.includes('request failed')).join('\n'));
    expect([...outcomes.keys()].every((k) => ['ok', '400 path_refused', '400 not_a_directory', '404 file_not_found'].includes(k))).toBe(true);
  });
});

describe('exec', () => {
  it('passes the environment in the process environment, never in argv; a client that goes away kills the command', async () => {
    const secret = `s3cr3t-${Date.now()}-value`;
    const root = await rootOf(sa);
    await fs.rm(path.join(root, 'still-alive'), { force: true });
    await fs.rm(path.join(root, 'started'), { force: true });
    const gone = new AbortController();
    const pending = raw('POST', `/api/v1/sandboxes/${sa}/exec`, {
      token: a.token,
      body: JSON.stringify(sh('echo $$ > started; while [ ! -e release ]; do sleep 0.05; done; echo yes > still-alive', { env: { MY_SECRET: secret }, timeout_seconds: 300 })),
      signal: gone.signal,
    }).catch((e: Error) => e);
    await until(() => existsSync(path.join(root, 'started')), 'the command to start');
    const scan = async (file: 'cmdline' | 'environ') => {
      const hits: string[] = [];
      for (const pid of await fs.readdir('/proc')) {
        if (!/^\d+$/.test(pid)) continue;
        const text = await fs.readFile(`/proc/${pid}/${file}`).catch(() => Buffer.alloc(0));
        if (text.includes(secret)) hits.push(pid);
      }
      return hits;
    };
    expect(await scan('cmdline')).toEqual([]);
    const holders = await scan('environ');
    expect(holders.length).toBeGreaterThan(0); // it is there, where ps cannot show it
    // ... in the tenant's own processes only: never in Slipway's host-side helpers (bwrap, and the
    // descriptor step and limits wrapper exec'd into it), which run before confinement (ADR 0027).
    const names = await Promise.all(holders.map((pid) => processName(Number(pid))));
    expect(names.filter((n) => n !== '' && n !== 'sh' && n !== 'sleep')).toEqual([]);
    gone.abort();
    await pending;
    // Killed: no process carries the value any more; only then release a survivor, if there were one.
    await until(async () => (await scan('environ')).length === 0, 'the command to be killed');
    await fs.writeFile(path.join(root, 'release'), '1');
    const after = await a.api.exec(sa, sh('sleep 0.2; ls still-alive 2>/dev/null || echo none'));
    expect(after.stdout.trim()).toBe('none');
    await fs.rm(path.join(root, 'release'), { force: true });
  });

  it('an LD_PRELOAD or LD_AUDIT library in the environment runs nowhere on the host (ADR 0027)', async () => {
    const dir = tempDir('preload');
    const marker = path.join(dir, 'ran-on-the-host');
    const lib = hostileLibrary(dir, marker);
    const run = await a.api.exec(sa, sh('printf "%s" "$LD_PRELOAD"', { env: { LD_PRELOAD: lib, LD_AUDIT: lib, GCONV_PATH: dir, BASH_ENV: lib } }));
    expect(run.exit_code, run.stderr).toBe(0);
    expect(run.stdout).toBe(lib); // the command has it as given; the library is not in its view
    expect(existsSync(marker)).toBe(false);
  });

  it('answers 400 naming cwd when the folder does not exist (not 500, not a bubblewrap message)', async () => {
    const res = await raw('POST', `/api/v1/sandboxes/${sa}/exec`, { token: a.token, body: JSON.stringify({ command: 'true', cwd: 'no/such/folder' }) });
    expect(res.status).toBe(400);
    const body = (await res.json()) as { error: { code: string; message: string; issues: Array<{ path: string }> } };
    expect(body.error).toMatchObject({ code: 'invalid_cwd', issues: [{ path: 'cwd' }] });
    expect(body.error.message).not.toMatch(/bubblewrap/);
    expect(await codeOf(a.api.exec(sa, { command: 'true', cwd: 'README.md' }))).toBe('400 invalid_cwd');
  });
});


describe('HTTP hygiene', () => {
  type ErrorShape = { error: { code: string; message: string } };
  const shaped = async (res: Response) => {
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    const body = (await res.json()) as ErrorShape;
    expect(typeof body.error.code).toBe('string');
    expect(typeof body.error.message).toBe('string');
    return body.error.code;
  };

  it('answers framework errors in the documented error shape: 413 body, bad percent-encoding, URL too long', async () => {
    const big = await raw('POST', `/api/v1/sandboxes/${sa}/exec`, { token: a.token, body: JSON.stringify({ command: 'true', stdin: 'x'.repeat(21 * 1024 * 1024) }) });
    expect(big.status).toBe(413);
    expect(await shaped(big)).toBe('too_large');
    const badEncoding = await raw('GET', '/api/v1/sandboxes/%zz', { token: a.token });
    expect(badEncoding.status).toBe(400);
    await shaped(badEncoding);
    const longUrl = await raw('GET', `/api/v1/sandboxes/${sa}/files/${'a'.repeat(20_000)}`, { token: a.token });
    expect([414, 431]).toContain(longUrl.status);
    await shaped(longUrl);
  });

  it('429s carry Retry-After: the sandbox limit and the per-account exec limit', async () => {
    const c = await h.account({ limit: 1 });
    await c.profile({ name: 'p' });
    const { id } = await c.api.create({ profile: 'p' });
    const over = await raw('POST', '/api/v1/sandboxes', { token: c.token, body: JSON.stringify({ profile: 'p' }) });
    expect(over.status).toBe(429);
    expect(Number(over.headers.get('retry-after'))).toBeGreaterThan(0);
    await h.waitFor(c.api, id, ['ready']);
    const root = await rootOf(id);
    // Eight execs hold the account's slots until told to go; a ninth is refused, not queued.
    const holders = Array.from({ length: 8 }, (_, i) => c.api.exec(id, sh(`touch held-${i}; while [ ! -e go ]; do sleep 0.05; done`)));
    await until(async () => (await fs.readdir(root)).filter((f) => f.startsWith('held-')).length === 8, 'eight execs to run');
    const ninth = await raw('POST', `/api/v1/sandboxes/${id}/exec`, { token: c.token, body: JSON.stringify({ command: 'true' }) });
    expect(ninth.status).toBe(429);
    expect(await shaped(ninth)).toBe('exec_limit');
    expect(Number(ninth.headers.get('retry-after'))).toBeGreaterThan(0);
    expect((await b.api.exec(sb, { command: 'true' })).exit_code).toBe(0); // another account is not limited by it
    await c.api.writeFile(id, 'go', Buffer.from('1'));
    expect((await Promise.all(holders)).map((r) => r.exit_code)).toEqual(Array(8).fill(0));
    expect((await c.api.exec(id, { command: 'true' })).exit_code).toBe(0);
    await c.api.destroy(id);
  });

  it('never logs a token passed in a query string', async () => {
    const leaked = `slp_${'q'.repeat(43)}`;
    await raw('GET', `/api/v1/sandboxes?access_token=${leaked}&limit=5`, { token: a.token });
    await raw('GET', `/api/v1/sandboxes/${sa}?token=${leaked}`, { token: a.token });
    await until(() => h.logs.some((l) => l.includes('access_token=[redacted]')), 'the request log line');
    expect(h.logs.join('\n')).not.toContain(leaked);
  });
});
