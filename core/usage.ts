/**
 * Token and cost totals of agent runs: adding a run, and the one wording used by the CLI, the
 * live feed and the Web UI details. Pure: workflows import it.
 */
import type { AgentRunRecord, TokenTotals } from './types';

/** Adds one run's usage to `totals` (in place). */
export function addRunUsage(totals: TokenTotals, run: Pick<AgentRunRecord, 'inputTokens' | 'outputTokens' | 'cachedTokens' | 'costUsd'> & { estimated?: boolean; usageUnknown?: boolean }): void {
  totals.inputTokens += run.inputTokens;
  totals.outputTokens += run.outputTokens;
  totals.cachedTokens += run.cachedTokens;
  totals.costUsd += run.costUsd ?? 0;
  totals.runs += 1;
  if (run.estimated) totals.estimated = true;
  if (run.usageUnknown) totals.usageUnknownRuns = (totals.usageUnknownRuns ?? 0) + 1;
}

/** The sum of two totals (a new object; workflows keep their state immutable where they can). */
export function addTotals(a: TokenTotals, b: TokenTotals): TokenTotals {
  return {
    inputTokens: a.inputTokens + b.inputTokens,
    outputTokens: a.outputTokens + b.outputTokens,
    cachedTokens: a.cachedTokens + b.cachedTokens,
    costUsd: a.costUsd + b.costUsd,
    runs: a.runs + b.runs,
    ...(a.estimated || b.estimated ? { estimated: true } : {}),
    ...(a.usageUnknownRuns || b.usageUnknownRuns ? { usageUnknownRuns: (a.usageUnknownRuns ?? 0) + (b.usageUnknownRuns ?? 0) } : {}),
  };
}

export function formatCount(n: number): string {
  // No Intl: the same in the workflow sandbox as in the CLI.
  return String(Math.round(n)).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

export function formatCost(usd: number): string {
  return `$${usd < 1 ? usd.toFixed(4) : usd.toFixed(2)}`;
}

/**
 * `12,345 in (10,000 cached) / 678 out tokens, $0.0421` — cost left out when none was reported,
 * `~$0.0421 (estimated)` when (some of) it is estimated from model prices.
 */
export function formatUsage(u: Pick<TokenTotals, 'inputTokens' | 'outputTokens' | 'cachedTokens'> & { costUsd?: number; estimated?: boolean; usageUnknown?: boolean; usageUnknownRuns?: number }): string {
  if (u.usageUnknown) return 'usage unknown (the agent reports no token counts)';
  const unknown = u.usageUnknownRuns ? `; usage unknown for ${u.usageUnknownRuns} run${u.usageUnknownRuns > 1 ? 's' : ''} (no token counts)` : '';
  const cached = u.cachedTokens ? ` (${formatCount(u.cachedTokens)} cached)` : '';
  const cost = u.costUsd ? `, ${u.estimated ? `~${formatCost(u.costUsd)} (estimated)` : formatCost(u.costUsd)}` : '';
  return `${formatCount(u.inputTokens)} in${cached} / ${formatCount(u.outputTokens)} out tokens${cost}${unknown}`;
}

/** Totals with the number of runs: `… over 3 agent runs`, or `no agent runs yet`. */
export function formatTotals(t: TokenTotals | undefined): string {
  if (!t || t.runs === 0) return 'no agent runs yet';
  return `${formatUsage(t)} over ${t.runs} agent run${t.runs === 1 ? '' : 's'}`;
}
