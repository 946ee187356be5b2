/**
 * The budget guardrail, pure: whether a limit is spent, the one wording of it, and the checks of
 * a raise. Workflows import it (docs/adr/0017-budget-guardrail.md says who knows which spend).
 */
import type { BudgetConfig, BudgetLimit } from './objective-schema';
import type { TokenTotals } from './types';
import { formatCost, formatCount } from './usage';

export type { BudgetLimit };

/** The objective's budget, resolved: what travels in the workflow inputs. */
export interface BudgetSpec {
  objective?: BudgetLimit;
  stream?: BudgetLimit;
  onExhausted: 'block' | 'fail';
  /** `hard_limit: true`: a run in flight is stopped when the stream's limit is reached. Absent: it finishes. */
  hardLimit?: true;
}

/** What a stream knows of its budget: its own limit, and whether the objective's is spent. */
export interface StreamBudget {
  limit?: BudgetLimit;
  onExhausted: 'block' | 'fail';
  hardLimit?: true;
  /** Set by the objective (in the input, then by signal) while the objective's limit is spent: why. */
  objectiveExhausted?: string;
  /** The objective has a limit: ask it before each run (`objectiveLease`), do not only wait to be told. */
  leased?: true;
}

/** What the objective tells a stream when its budget changes (`slipway budget raise`, the objective's limit reached). */
export interface StreamBudgetUpdate {
  /** The stream's new limit (absent: unchanged). */
  limit?: BudgetLimit;
  /** `null`: the objective's limit is no longer spent. */
  objectiveExhausted?: string | null;
  /** The answer to the stream's lease request of this number (its `objectiveExhausted` says whether it was refused). */
  lease?: number;
}

/** A stream's question to the objective before an agent run (`leased` streams). */
export interface LeaseRequest {
  streamId: string;
  /** The stream's count of its requests: the answer names it, so a late answer is not taken for a new one. */
  seq: number;
}

/** The budget as the objective keeps it (in its status, so a raise survives continue-as-new). */
export interface ObjectiveBudget extends BudgetSpec {
  /** Streams whose limit was raised on its own (`--stream`); the others have `stream`. */
  streams?: Record<string, BudgetLimit>;
  /** Why the objective's limit is spent, while it is (its running streams were told). */
  objectiveExhausted?: string;
  /** Streams with an agent run in flight under a lease (released when the run's event arrives, or the stream blocks or ends). */
  inFlight?: string[];
  /** Lease requests held back until runs in flight report their cost: stream -> request number. */
  waiting?: Record<string, number>;
}

/** What a stream is told of the budget when it starts. */
export function streamBudgetOf(budget: ObjectiveBudget, streamId: string): StreamBudget {
  const limit = budget.streams?.[streamId] ?? budget.stream;
  return { ...(limit ? { limit } : {}), onExhausted: budget.onExhausted, ...(budget.hardLimit ? { hardLimit: true as const } : {}), ...(budget.objectiveExhausted ? { objectiveExhausted: budget.objectiveExhausted } : {}) };
}

/** A raise asked for with `slipway budget raise`: new limits, not increments. */
export interface BudgetRaise {
  /** Absent: the objective's limit. */
  stream?: string;
  usd?: number;
  tokens?: number;
}

/** Tokens a limit counts: input (which includes cached) plus output. */
export const spentTokens = (t: Pick<TokenTotals, 'inputTokens' | 'outputTokens'>): number => t.inputTokens + t.outputTokens;

/** The resolved budget of a file's `budget:` section; undefined when it sets no limit. */
export function budgetSpec(config: BudgetConfig | undefined): BudgetSpec | undefined {
  if (!config || (!config.objective && !config.stream)) return undefined;
  return { ...(config.objective ? { objective: config.objective } : {}), ...(config.stream ? { stream: config.stream } : {}), onExhausted: config.on_exhausted ?? 'block', ...(config.hard_limit ? { hardLimit: true as const } : {}) };
}

/**
 * Why `spent` has reached `limit` (`stream api spent $1.02 of its $1.00 budget`), or undefined
 * while it has not. Reached, not passed: at the limit no new run starts.
 */
export function budgetExhausted(limit: BudgetLimit | undefined, spent: TokenTotals, whose: string): string | undefined {
  if (!limit) return undefined;
  if (limit.usd !== undefined && spent.costUsd >= limit.usd) return `${whose} spent ${formatCost(spent.costUsd)} of its ${formatCost(limit.usd)} budget`;
  if (limit.tokens !== undefined && spentTokens(spent) >= limit.tokens) return `${whose} spent ${formatCount(spentTokens(spent))} of its ${formatCount(limit.tokens)} tokens budget`;
  return undefined;
}

/** A stream's check before each agent run: the reason it may not start one, or undefined. */
export function streamBudgetBlock(budget: StreamBudget | undefined, streamId: string, spent: TokenTotals): string | undefined {
  if (!budget) return undefined;
  return budgetExhausted(budget.limit, spent, `stream ${streamId}`) ?? budget.objectiveExhausted;
}

/**
 * Problems with a raise (the Update's validator): each figure positive and finite, at least one
 * given, none below what is already spent, and only on a limit the objective has. Empty: valid.
 */
export function raiseProblems(raise: BudgetRaise, current: { limit?: BudgetLimit; spent: TokenTotals; whose: string }): string[] {
  const problems: string[] = [];
  if (raise.usd === undefined && raise.tokens === undefined) problems.push('give --usd, --tokens or both');
  if (raise.usd !== undefined && !(Number.isFinite(raise.usd) && raise.usd > 0)) problems.push(`--usd must be a positive number, got ${raise.usd}`);
  if (raise.tokens !== undefined && !(Number.isInteger(raise.tokens) && raise.tokens > 0)) problems.push(`--tokens must be a positive whole number, got ${raise.tokens}`);
  if (problems.length > 0) return problems;
  if (raise.usd !== undefined && raise.usd <= current.spent.costUsd) {
    problems.push(`--usd ${raise.usd} is not above what ${current.whose} already spent (${formatCost(current.spent.costUsd)}); give a higher limit`);
  }
  if (raise.tokens !== undefined && raise.tokens <= spentTokens(current.spent)) {
    problems.push(`--tokens ${raise.tokens} is not above what ${current.whose} already spent (${formatCount(spentTokens(current.spent))} tokens); give a higher limit`);
  }
  if (problems.length === 0) {
    const still = budgetExhausted(raisedLimit(current.limit, raise), current.spent, current.whose);
    if (still) problems.push(`${still} after this raise too; raise that figure as well`);
  }
  return problems;
}

/** The limit after a raise: the figures given replace the old ones, the others stay. */
export function raisedLimit(limit: BudgetLimit | undefined, raise: BudgetRaise): BudgetLimit {
  return { ...limit, ...(raise.usd !== undefined ? { usd: raise.usd } : {}), ...(raise.tokens !== undefined ? { tokens: raise.tokens } : {}) };
}

/** `$1.00 / 200,000 tokens` for messages. */
export function formatLimit(limit: BudgetLimit): string {
  return [limit.usd !== undefined ? formatCost(limit.usd) : undefined, limit.tokens !== undefined ? `${formatCount(limit.tokens)} tokens` : undefined].filter(Boolean).join(' / ');
}

/** What one agent run may still spend before a hard limit stops it (the run activity's input). */
export interface RunAllowance {
  usd?: number;
  tokens?: number;
  /** Whose limit it is, for the stop's wording (`stream api`). */
  whose: string;
}

/**
 * The allowance of a stream's next run under `hard_limit`: its limit less what it spent, figure by
 * figure; undefined without a hard limit. The objective's limit is not in it: a stream learns of
 * the objective's spend only when that limit is reached (ADR 0017, 3), never its remainder.
 */
export function runAllowance(budget: StreamBudget | undefined, streamId: string, spent: TokenTotals): RunAllowance | undefined {
  if (!budget?.hardLimit || !budget.limit) return undefined;
  const { usd, tokens } = budget.limit;
  return {
    ...(usd !== undefined ? { usd: Math.max(0, usd - spent.costUsd) } : {}),
    ...(tokens !== undefined ? { tokens: Math.max(0, tokens - spentTokens(spent)) } : {}),
    whose: `stream ${streamId}`,
  };
}

/**
 * Why a run's usage so far has used up its allowance (at or above it), or undefined. `costUsd`
 * is what the agent reported, else the caller's estimate from the price table; unknown cost
 * holds no USD allowance.
 */
export function allowanceUsed(allowance: RunAllowance | undefined, used: { inputTokens: number; outputTokens: number; costUsd?: number }): string | undefined {
  if (!allowance) return undefined;
  if (allowance.usd !== undefined && used.costUsd !== undefined && used.costUsd >= allowance.usd) {
    return `${allowance.whose} reached its budget during this run (${formatCost(used.costUsd)} of the ${formatCost(allowance.usd)} left); the run was stopped (hard_limit)`;
  }
  if (allowance.tokens !== undefined && spentTokens(used) >= allowance.tokens) {
    return `${allowance.whose} reached its budget during this run (${formatCount(spentTokens(used))} of the ${formatCount(allowance.tokens)} tokens left); the run was stopped (hard_limit)`;
  }
  return undefined;
}

/** The objective's answer to a stream that asks to start an agent run (`objectiveLease`). */
export type LeaseDecision = { type: 'grant' } | { type: 'exhausted'; reason: string } | { type: 'wait' };

/**
 * Whether a stream may start an agent run under the objective's limit, decided by the objective
 * from what it knows when asked: `spent` (every finished run, the asking stream's included: it
 * reports its runs before it asks) and the other streams' runs `inFlight`, whose cost is not known
 * yet. Each of those is expected to cost what the objective's finished runs cost on average; a run
 * starts only while that leaves some of the limit, else it waits for them to report (then the
 * limit is spent, or it is not and the run starts). So two streams cannot both start a run on the
 * last dollars: the second waits for the first's cost. Spent at or above the limit: refused. With
 * no finished run yet nothing is known to expect: the run starts. ADR 0017, decision 3.
 */
export function objectiveLease(limit: BudgetLimit | undefined, whose: string, spent: TokenTotals, inFlight: number): LeaseDecision {
  const reason = budgetExhausted(limit, spent, whose);
  if (reason) return { type: 'exhausted', reason };
  if (!limit || inFlight === 0 || spent.runs === 0) return { type: 'grant' };
  const left = (cap: number | undefined, used: number) => cap === undefined || cap - used - inFlight * (used / spent.runs) > 0;
  return left(limit.usd, spent.costUsd) && left(limit.tokens, spentTokens(spent)) ? { type: 'grant' } : { type: 'wait' };
}
