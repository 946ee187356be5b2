/**
 * Typed search attributes set on every Slipway workflow, so `slipway list` and the
 * Temporal Web UI can filter runs. Keyword, but the objective's cost (a Double, so
 * `SlipwayCostUsd > 5` works); the embedded server registers them, `registerSearchAttributes`
 * (workers/temporal.ts) on a server Slipway did not start.
 */
import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';
import { SEARCH_ATTRIBUTE_NAMES as N } from './search-attribute-names';

export const SlipwayKind = defineSearchAttributeKey(N.kind, SearchAttributeType.KEYWORD);
export const SlipwayObjective = defineSearchAttributeKey(N.objective, SearchAttributeType.KEYWORD);
export const SlipwayStream = defineSearchAttributeKey(N.stream, SearchAttributeType.KEYWORD);
export const SlipwayPhase = defineSearchAttributeKey(N.phase, SearchAttributeType.KEYWORD);
export const SlipwayOutcome = defineSearchAttributeKey(N.outcome, SearchAttributeType.KEYWORD);
export const SlipwayAccount = defineSearchAttributeKey(N.account, SearchAttributeType.KEYWORD);
export const SlipwaySandboxState = defineSearchAttributeKey(N.sandboxState, SearchAttributeType.KEYWORD);
/** An objective's spend on agent runs so far, in USD (estimates included), set as runs finish. */
export const SlipwayCostUsd = defineSearchAttributeKey(N.costUsd, SearchAttributeType.DOUBLE);

export const SLIPWAY_SEARCH_ATTRIBUTES = [
  SlipwayKind,
  SlipwayObjective,
  SlipwayStream,
  SlipwayPhase,
  SlipwayOutcome,
  SlipwayAccount,
  SlipwaySandboxState,
  SlipwayCostUsd,
] as const;

/** The name the Temporal CLI's `--search-attribute NAME=TYPE` takes for each type used here. */
export const SEARCH_ATTRIBUTE_CLI_TYPE: Record<(typeof SLIPWAY_SEARCH_ATTRIBUTES)[number]['type'], string> = {
  [SearchAttributeType.KEYWORD]: 'Keyword',
  [SearchAttributeType.DOUBLE]: 'Double',
};
