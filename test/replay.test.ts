/**
 * Replays recorded histories (test/histories) against today's workflow code. A failure here
 * means a change altered the command sequence of already-running workflows: guard it with
 * `patched()` (see docs/adr/0003-blueprint-interpreter.md), then re-record.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, inject, it } from 'vitest';
import { historyFromJSON } from '@temporalio/common/lib/proto-utils';
import { Worker } from '@temporalio/worker';
import { installRuntimeLogging } from '../workers/logging';

const HISTORIES = path.join(__dirname, 'histories');
const scenarios = readdirSync(HISTORIES, { withFileTypes: true }).filter((d) => d.isDirectory()).map((d) => d.name);

describe('replay of recorded histories', () => {
  it('has recorded histories to replay', () => {
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
