/**
 * Typed search attributes set on every Slipway workflow, so `slipway list` and the
 * Temporal Web UI can filter runs. All are Keyword; the embedded server registers them.
 */
import { defineSearchAttributeKey, SearchAttributeType } from '@temporalio/common';

export const SlipwayKind = defineSearchAttributeKey('SlipwayKind', SearchAttributeType.KEYWORD);
export const SlipwayObjective = defineSearchAttributeKey('SlipwayObjective', SearchAttributeType.KEYWORD);
export const SlipwayStream = defineSearchAttributeKey('SlipwayStream', SearchAttributeType.KEYWORD);
export const SlipwayPhase = defineSearchAttributeKey('SlipwayPhase', SearchAttributeType.KEYWORD);
export const SlipwayOutcome = defineSearchAttributeKey('SlipwayOutcome', SearchAttributeType.KEYWORD);
export const SlipwayAccount = defineSearchAttributeKey('SlipwayAccount', SearchAttributeType.KEYWORD);
export const SlipwaySandboxState = defineSearchAttributeKey('SlipwaySandboxState', SearchAttributeType.KEYWORD);

export const SLIPWAY_SEARCH_ATTRIBUTES = [
  SlipwayKind,
  SlipwayObjective,
  SlipwayStream,
  SlipwayPhase,
  SlipwayOutcome,
  SlipwayAccount,
  SlipwaySandboxState,
] as const;
