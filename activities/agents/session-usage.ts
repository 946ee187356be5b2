/**
 * What an agent session has reported in total so far, per provider and session id, so a resumed
 * run reports its own usage and cost, not the session's. Claude Code's `total_cost_usd` and Codex's
 * token totals on a resumed session are running totals of the whole session; the run's figure is
 * the new total minus the one the session's previous run ended with.
 *
 * Kept on the worker, in `<data dir>/agent-sessions/<provider>/<session>.json`: the session itself
 * lives in the agent's home on the worker that ran it, so a run that can resume it finds the totals
 * beside it. Only numbers are stored, never text. A missing or unreadable file means no baseline.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { AgentProviderKind } from '../../core/objective-schema';
import { slipwaySettings } from '../../lib/settings';
import { writeJsonAtomic } from '../../lib/atomic-write';
import type { SessionTotals } from '../../agents/provider';

const SAFE_ID = /^[A-Za-z0-9._-]{1,200}$/;

function totalsFile(provider: AgentProviderKind, sessionId: string, env: NodeJS.ProcessEnv): string | undefined {
  // The id comes from agent output: never let it name a path outside the folder.
  if (!SAFE_ID.test(sessionId) || sessionId.startsWith('.')) return undefined;
  return path.join(slipwaySettings(env).dataDir, 'agent-sessions', provider, `${sessionId}.json`);
}

export async function readSessionTotals(provider: AgentProviderKind, sessionId: string, env: NodeJS.ProcessEnv = process.env): Promise<SessionTotals | undefined> {
  const file = totalsFile(provider, sessionId, env);
  if (!file) return undefined;
  try {
    const raw = JSON.parse(await fs.readFile(file, 'utf8')) as Record<string, unknown>;
    const n = (v: unknown) => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
    const totals: SessionTotals = {};
    for (const key of ['inputTokens', 'outputTokens', 'cachedTokens', 'costUsd'] as const) {
      const value = n(raw[key]);
      if (value !== undefined) totals[key] = value;
    }
    return totals;
  } catch {
    return undefined;
  }
}

export async function writeSessionTotals(provider: AgentProviderKind, sessionId: string, totals: SessionTotals, env: NodeJS.ProcessEnv = process.env): Promise<void> {
  const file = totalsFile(provider, sessionId, env);
  if (file) await writeJsonAtomic(file, totals, { mkdir: true });
}
