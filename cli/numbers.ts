/**
 * Parsers of numeric flags and arguments (Commander's option parsers): each names its flag in
 * the error, which exits 2 before anything is read or started. One place, so `--limit 0`,
 * `--port x` and `--minutes -1` are refused alike. Only digits (and one point for decimals):
 * `Number()` alone would take '', ' 5', '0x10' and '1e3'.
 */
import { CliError } from './exit-codes';

const WHOLE = /^\d+$/;
const DECIMAL = /^(\d+(\.\d*)?|\.\d+)$/;

/** A whole number from `min` (default 0) to `max`. */
export const wholeNumber =
  (flag: string, { min = 0, max }: { min?: number; max?: number } = {}) =>
  (value: string): number => {
    const n = Number(value);
    const range = max !== undefined ? `from ${min} to ${max}` : min === 0 ? '(0 or more)' : `of at least ${min}`;
    if (!WHOLE.test(value) || n < min || (max !== undefined && n > max)) throw new CliError(`${flag} must be a whole number ${range}, got "${value}"`);
    return n;
  };

/** A number above 0, fractions allowed. */
export const positiveNumber =
  (flag: string) =>
  (value: string): number => {
    const n = Number(value);
    if (!DECIMAL.test(value) || !(n > 0)) throw new CliError(`${flag} must be a number above 0, got "${value}"`);
    return n;
  };

/** A TCP port (0: any free one, where the command allows it). */
export const portNumber = (flag: string) => wholeNumber(flag, { min: 0, max: 65535 });
