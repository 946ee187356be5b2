/**
 * The per-session totals a resumed run subtracts (activities/agents/session-usage.ts): stored per
 * provider and session on the worker, numbers only, and never at a path a session id could steer.
 */
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { readSessionTotals, writeSessionTotals } from '../activities/agents/session-usage';
import { tempDir } from './helpers/repo';

describe('session usage totals', () => {
  it('round-trips per provider and session, keeps numbers only, and has no baseline for an unknown session', async () => {
    const env = { SLIPWAY_HOME: tempDir('slipway-home-') };
    await writeSessionTotals('codex', 'thread-1', { inputTokens: 4000, cachedTokens: 1000, outputTokens: 800 }, env);
    await writeSessionTotals('claude-code', 'thread-1', { costUsd: 0.024 }, env);
    expect(await readSessionTotals('codex', 'thread-1', env)).toEqual({ inputTokens: 4000, cachedTokens: 1000, outputTokens: 800 });
    expect(await readSessionTotals('claude-code', 'thread-1', env)).toEqual({ costUsd: 0.024 });
    expect(await readSessionTotals('pi', 'thread-1', env)).toBeUndefined();
    const file = path.join(env.SLIPWAY_HOME, 'agent-sessions', 'codex', 'thread-1.json');
    writeFileSync(file, JSON.stringify({ inputTokens: 'lots', outputTokens: -1, costUsd: 1, note: 'secret text' }));
    expect(await readSessionTotals('codex', 'thread-1', env)).toEqual({ costUsd: 1 });
  });

  it('ignores a session id that could name a path elsewhere', async () => {
    const env = { SLIPWAY_HOME: tempDir('slipway-home-') };
    for (const id of ['../../escape', '.hidden', 'a/b', '', 'x'.repeat(300)]) {
      await writeSessionTotals('codex', id, { inputTokens: 1 }, env);
      expect(await readSessionTotals('codex', id, env)).toBeUndefined();
    }
    expect(existsSync(path.join(env.SLIPWAY_HOME, 'agent-sessions')) ? readdirSync(path.join(env.SLIPWAY_HOME, 'agent-sessions')) : []).toEqual([]);
  });
});
