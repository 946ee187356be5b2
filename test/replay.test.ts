/**
 * Replays every release's golden histories (test/histories/<version>/<scenario>) against today's
 * workflow code. A failure here means a change altered the command sequence of workflows that may
 * be running: guard it with `patched()` (ADR 0007). Goldens are never re-recorded.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, inject, it } from 'vitest';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import { Worker } from '@temporalio/worker';
import { installRuntimeLogging } from '../workers/logging';

const HISTORIES = path.join(__dirname, 'histories');
const versions = readdirSync(HISTORIES, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);
const scenarios = versions.flatMap((v) =>
  readdirSync(path.join(HISTORIES, v), { withFileTypes: true })
    .filter((d) => d.isDirectory())
    .map((d) => `${v}/${d.name}`),
);

describe('replay of recorded histories', () => {
  it('has recorded histories to replay, in release folders only', () => {
    expect(versions.length).toBeGreaterThan(0);
    for (const v of versions) expect(v).toMatch(/^\d+\.\d+\.\d+$/);
    expect(scenarios.length).toBeGreaterThan(0);
  });

  for (const scenario of scenarios) {
    it(`replays ${scenario} deterministically`, async () => {
      installRuntimeLogging();
      const files = readdirSync(path.join(HISTORIES, scenario)).filter((f) => f.endsWith('.json'));
      expect(files.some((f) => f.startsWith('objective_'))).toBe(true);
      const histories = files.map((f) => ({
        workflowId: f.replace(/\.json$/, ''),
        history: historyFromJSON(JSON.parse(readFileSync(path.join(HISTORIES, scenario, f), 'utf8'))),
      }));
      const results = [];
      for await (const result of Worker.runReplayHistories({ workflowBundle: { codePath: inject('workflowBundlePath') } }, histories)) {
        results.push({ workflowId: result.workflowId, error: result.error?.message });
      }
      expect(results.filter((r) => r.error)).toEqual([]);
      expect(results).toHaveLength(files.length);
    });
  }
});
