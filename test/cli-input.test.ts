/**
 * `slipway run` refuses oversized, mis-encoded or blank input with exit 2 before anything
 * starts: no embedded server, no workflow (the embedded mode would create its SQLite file first).
 */
import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { freePort } from '../workers/dev-server';
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
      const run = await slipway(['run', file, '--id', 'input-check'], { SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await freePort()) });
      expect(run.code).toBe(2);
      for (const re of c.expect) expect(run.stderr).toMatch(re);
      expect(run.stderr).not.toMatch(/grpc|\n\s+at /i);
      expect(run.stderr.length).toBeLessThan(2000);
      expect(existsSync(path.join(home, 'temporal.sqlite'))).toBe(false);
    });
  }
});
