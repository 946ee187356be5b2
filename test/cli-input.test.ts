/**
 * `slipway run` refuses oversized, mis-encoded or blank input with exit 2 before anything
 * starts: no embedded server, no workflow (the embedded mode would create its SQLite file first).
 */
import { existsSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { testPort } from './helpers/ports';
import { slipway } from './helpers/cli';
import { makeTinyRepo, tempDir } from './helpers/repo';

describe('slipway run: input limits and encoding', () => {
  const repo = makeTinyRepo();
  const good = {
    objective: 'x',
    repository: repo,
    agents: { builder: { provider: 'script', command: 'true' } },
    streams: [{ id: 'a', task: 'do a' }],
  };
  const cases: { name: string; content: string | Buffer; expect: RegExp[] }[] = [
    {
      name: 'multi-megabyte objective text',
      content: stringify({ ...good, objective: 'z'.repeat(3 * 1024 * 1024) }, { lineWidth: 0 }),
      expect: [/objective\.yaml:1:12: objective: too long: 3,145,728 characters, at most 50,000 allowed/, /objective\.yaml: the file is [\d,]+ bytes, at most 1,048,576 allowed/],
    },
    {
      name: 'file that is not UTF-8',
      content: Buffer.from(stringify({ ...good, objective: 'Café' }), 'latin1'),
      expect: [/objective\.yaml:1:15: the file is not valid UTF-8 \(byte 0xe9\)/],
    },
    {
      name: 'gate whose command is only whitespace',
      content: stringify({ ...good, gates: [{ name: 'test', command: '   ' }] }),
      expect: [/objective\.yaml:\d+:\d+: gates\[0\]\.command: must not be only whitespace/],
    },
  ];
  for (const c of cases) {
    it(`refuses a ${c.name} with exit 2, a one-line-per-problem message and nothing started`, async () => {
      const file = path.join(tempDir('slipway-input-'), 'objective.yaml');
      writeFileSync(file, c.content);
      const home = tempDir('slipway-home-');
      const run = await slipway(['run', file, '--id', 'input-check'], { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await testPort()) });
      expect(run.code).toBe(2);
      for (const re of c.expect) expect(run.stderr).toMatch(re);
      expect(run.stderr).not.toMatch(/grpc|\n\s+at /i);
      expect(run.stderr.length).toBeLessThan(2000);
      expect(existsSync(path.join(home, 'temporal.sqlite'))).toBe(false);
    });
  }
});

describe('numeric flags: one parser (cli/numbers.ts), exit 2 naming the flag, nothing queried', () => {
  // A stand-in for Temporal's HTTP API that counts what reaches it and lists no objective.
  let server: http.Server;
  let requests: string[] = [];
  let env: NodeJS.ProcessEnv;
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      requests.push(req.url ?? '');
      res.setHeader('content-type', 'application/json');
      res.end('{"executions": []}');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
    env = { TEMPORAL_ADDRESS: address, TEMPORAL_HTTP_ADDRESS: address, SLIPWAY_HOME: tempDir('slipway-home-') };
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it('slipway list --limit N with a good N queries the server', async () => {
    requests = [];
    const run = await slipway(['list', '--limit', '5', '--json'], env);
    expect(run.code, run.stderr).toBe(0);
    expect(JSON.parse(run.stdout)).toEqual([]);
    expect(requests.some((u) => u.includes('/workflows'))).toBe(true);
  });

  for (const bad of ['0', '-3', '2.5', 'ten', '', '5x', '0x10', '1e3']) {
    it(`slipway list --limit "${bad}" exits 2 naming --limit, before any query`, async () => {
      requests = [];
      const run = await slipway(['list', '--limit', bad], env);
      expect(run.code).toBe(2);
      expect(run.stderr).toBe(`slipway: --limit must be a whole number of at least 1, got "${bad}"\n`);
      expect(run.stdout).toBe('');
      expect(requests).toEqual([]);
    });
  }

  const others: Array<[string[], string]> = [
    [['api', '--port', '70000'], '--port must be a whole number from 0 to 65535, got "70000"'],
    [['api', '--reaper-seconds', '0'], '--reaper-seconds must be a whole number of at least 1, got "0"'],
    [['api', '--rate', '-1'], '--rate must be a whole number (0 or more), got "-1"'],
    [['api', '--ssh-port', 'x'], '--ssh-port must be a whole number from 0 to 65535, got "x"'],
    [['codec-server', '--port', '8.5'], '--port must be a whole number from 0 to 65535, got "8.5"'],
    [['account', 'create', 'acme', '--concurrency', '-2'], '--concurrency must be a whole number (0 or more), got "-2"'],
    [['profile', 'create', 'p', '--account', 'acme', '--repo', '.', '--idle-seconds', '0'], '--idle-seconds must be a number above 0, got "0"'],
    [['sandbox', 'create', 'sb', '--profile', 'p', '--deadline-minutes', 'soon'], '--deadline-minutes must be a number above 0, got "soon"'],
    [['sandbox', 'exec', 'sb', '--timeout', '-5', '--', 'true'], '--timeout must be a number above 0, got "-5"'],
    [['sandbox', 'ssh', 'sb', '--minutes', '0'], '--minutes must be a whole number of at least 1, got "0"'],
    [['sandbox', 'ports', 'open', 'sb', 'http'], '<port> must be a whole number from 0 to 65535, got "http"'],
  ];
  for (const [args, message] of others) {
    it(`slipway ${args.join(' ')}: exit 2, "${message}"`, async () => {
      requests = [];
      const run = await slipway(args, { ...env, SLIPWAY_API_URL: `http://${env.TEMPORAL_HTTP_ADDRESS}`, SLIPWAY_API_TOKEN: 'unused' });
      expect(run.stderr).toContain(`slipway: ${message}\n`);
      expect(run.code).toBe(2);
      expect(requests).toEqual([]);
    });
  }
});
