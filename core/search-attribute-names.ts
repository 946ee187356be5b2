/**
 * The names of Slipway's search attributes, as plain strings: `slipway status`/`list` read them
 * over Temporal's HTTP API without the SDK (ADR 0024). The typed keys are in search-attributes.ts.
 */
export const SEARCH_ATTRIBUTE_NAMES = {
  kind: 'SlipwayKind',
  objective: 'SlipwayObjective',
  stream: 'SlipwayStream',
  phase: 'SlipwayPhase',
  outcome: 'SlipwayOutcome',
  account: 'SlipwayAccount',
  sandboxState: 'SlipwaySandboxState',
  costUsd: 'SlipwayCostUsd',
} as const;

/** The visibility query of `slipway list`: every objective workflow. */
export const OBJECTIVES_QUERY = `${SEARCH_ATTRIBUTE_NAMES.kind} = "objective"`;
