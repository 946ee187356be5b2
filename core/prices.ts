/**
 * Prices per model, to estimate the cost of an agent run whose output reports none (Codex;
 * Claude Code or OpenCode when they leave it out). US dollars per million tokens. The one table;
 * `.slipway/config.yaml` `prices:` overrides or adds models. An estimate is marked as one
 * (`estimated: true` on the run, `~` in text); a cost the agent reports always wins.
 * Pure: the loader resolves an agent's price, the agent activity applies it.
 */
import { z } from 'zod';

export const ModelPriceSchema = z.strictObject({
  /** Uncached input tokens, USD per million. */
  input: z.number().min(0),
  /** Output tokens (reasoning included), USD per million. */
  output: z.number().min(0),
  /** Cached input tokens (cache reads), USD per million; default: the input price. */
  cached_input: z.number().min(0).optional(),
});
export type ModelPrice = z.infer<typeof ModelPriceSchema>;

/**
 * List prices as published by the model vendors for their APIs (standard tier). Keys are the
 * model names the agent CLIs take (`--model`); an OpenCode `provider/model` is looked up by its
 * model part too. Update here when prices change; override per project in `.slipway/config.yaml`.
 */
export const MODEL_PRICES: Readonly<Record<string, ModelPrice>> = {
  'claude-opus-4-1': { input: 15, output: 75, cached_input: 1.5 },
  'claude-opus-4-5': { input: 5, output: 25, cached_input: 0.5 },
  'claude-sonnet-4-5': { input: 3, output: 15, cached_input: 0.3 },
  'claude-sonnet-4': { input: 3, output: 15, cached_input: 0.3 },
  'claude-haiku-4-5': { input: 1, output: 5, cached_input: 0.1 },
  'gpt-5': { input: 1.25, output: 10, cached_input: 0.125 },
  'gpt-5-codex': { input: 1.25, output: 10, cached_input: 0.125 },
  'gpt-5.1': { input: 1.25, output: 10, cached_input: 0.125 },
  'gpt-5.1-codex': { input: 1.25, output: 10, cached_input: 0.125 },
  'gpt-5-mini': { input: 0.25, output: 2, cached_input: 0.025 },
  'gpt-5.1-codex-mini': { input: 0.25, output: 2, cached_input: 0.025 },
};

/** The price of `model`: the project's override first, then the table; by full name, then without a `provider/` prefix. */
export function priceFor(model: string | undefined, overrides: Readonly<Record<string, ModelPrice>> = {}): ModelPrice | undefined {
  if (!model) return undefined;
  const bare = model.includes('/') ? model.slice(model.indexOf('/') + 1) : undefined;
  for (const table of [overrides, MODEL_PRICES]) {
    if (Object.hasOwn(table, model)) return table[model];
    if (bare && Object.hasOwn(table, bare)) return table[bare];
  }
  return undefined;
}

/** The cost of a run's tokens at `price` (input includes cached, the providers' shared convention). */
export function estimateCostUsd(usage: { inputTokens: number; outputTokens: number; cachedTokens?: number }, price: ModelPrice): number {
  const cached = Math.min(usage.cachedTokens ?? 0, usage.inputTokens);
  const uncached = usage.inputTokens - cached;
  return (uncached * price.input + cached * (price.cached_input ?? price.input) + usage.outputTokens * price.output) / 1_000_000;
}
