/** Retry profiles map to Temporal activity retry policies. */
export const RETRY_PROFILES = {
  strict: { maximumAttempts: 2 },
  balanced: { maximumAttempts: 4 },
  self_healing: { maximumAttempts: 6 },
} as const;

export type RetryProfileName = keyof typeof RETRY_PROFILES;
export const RETRY_PROFILE_NAMES = Object.keys(RETRY_PROFILES) as RetryProfileName[];
