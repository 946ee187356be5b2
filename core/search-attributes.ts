/**
 * Typed search attributes set on every Slipway workflow, so `slipway list` and the
 * Temporal Web UI can filter runs. Keyword, but the objective's cost (a Double, so
 * `SlipwayCostUsd > 5` works); the embedded server registers them, `registerSearchAttributes`
 * (workers/temporal.ts) on a server Slipway did not start.
 */
import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

export const SlipwayKind = defineSearchAttributeKey('SlipwayKind', SearchAttributeType.KEYWORD);
export const SlipwayObjective = defineSearchAttributeKey('SlipwayObjective', SearchAttributeType.KEYWORD);
export const SlipwayStream = defineSearchAttributeKey('SlipwayStream', SearchAttributeType.KEYWORD);
export const SlipwayPhase = defineSearchAttributeKey('SlipwayPhase', SearchAttributeType.KEYWORD);
export const SlipwayOutcome = defineSearchAttributeKey('SlipwayOutcome', SearchAttributeType.KEYWORD);
export const SlipwayAccount = defineSearchAttributeKey('SlipwayAccount', SearchAttributeType.KEYWORD);
export const SlipwaySandboxState = defineSearchAttributeKey('SlipwaySandboxState', SearchAttributeType.KEYWORD);
/** An objective's spend on agent runs so far, in USD (estimates included), set as runs finish. */
export const SlipwayCostUsd = defineSearchAttributeKey('SlipwayCostUsd', SearchAttributeType.DOUBLE);

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
