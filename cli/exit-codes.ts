/** Exit codes of the `slipway` CLI, defined once. */
export const EXIT = {
  ok: 0,
  /** The run ended other than completed, or Temporal could not be reached. */
  runFailed: 1,
  /** Bad input: objective file, flags, unknown objective. Nothing was started. */
  badInput: 2,
} as const;

export class CliError extends Error {
  constructor(message: string, readonly exitCode: number = EXIT.badInput) {
    super(message);
    this.name = 'CliError';
  }
}
