/**
 * The names of the history encryption key variables (workers/payload-codec.ts reads them), in the
 * lowest layer so every place that starts a process can leave them out: they are for Slipway's
 * own clients and workers, never for agents, gates, sandbox commands, git, pip or the embedded
 * Temporal server, which could otherwise read (or have no use for) every payload.
 */
export const PAYLOAD_KEY_ENV = 'SLIPWAY_PAYLOAD_KEY';
export const PAYLOAD_KEY_ID_ENV = 'SLIPWAY_PAYLOAD_KEY_ID';
export const PAYLOAD_KEYS_ENV = 'SLIPWAY_PAYLOAD_KEYS';
export const PAYLOAD_KEY_VARIABLES: readonly string[] = [PAYLOAD_KEY_ENV, PAYLOAD_KEY_ID_ENV, PAYLOAD_KEYS_ENV];

export function isPayloadKeyVariable(name: string): boolean {
  return PAYLOAD_KEY_VARIABLES.includes(name);
}

/** `env` without the key variables. */
export function withoutPayloadKeys(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(env)) if (!isPayloadKeyVariable(k)) out[k] = v;
  return out;
}
