/**
 * Removes secret values from text before it can reach workflow history, logs or the ledger.
 * Agents may echo their environment; we never keep it. Secrets are the worker's environment
 * values with secret-looking names, and the values of the repository's `.slipway/.env`
 * (activities/agents/credentials.ts), which exists to hold credentials.
 */
const SECRET_NAME = /(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE)/i;
const MIN_SECRET_LENGTH = 6;
/**
 * `.slipway/.env` values that cannot be secrets, so redacting them would only garble output:
 * booleans, numbers, and plain lowercase words (`development`, `us-east-1`-like names keep digits out).
 */
const PLAIN_SETTING = /^(true|false|yes|no|on|off|\d+(\.\d+)?|[a-z]+(-[a-z]+)*)$/;

export function secretValues(env: NodeJS.ProcessEnv = process.env): string[] {
  return Object.entries(env)
    .filter(([name, value]) => SECRET_NAME.test(name) && typeof value === 'string' && value.length >= MIN_SECRET_LENGTH)
    .map(([, value]) => value as string)
    .sort((a, b) => b.length - a.length);
}

/**
 * Secrets of the worker's environment plus those of a project `.env`: every value of a
 * secret-looking name, and every other value unless it is a plain setting (see PLAIN_SETTING).
 */
export function secretValuesWith(projectEnv: Record<string, string>, env: NodeJS.ProcessEnv = process.env): string[] {
  const project = Object.entries(projectEnv)
    .filter(([name, value]) => value.length >= MIN_SECRET_LENGTH && (SECRET_NAME.test(name) || !PLAIN_SETTING.test(value)))
    // A multi-line value (a private key) may reach the output one line at a time.
    .flatMap(([, value]) => [value, ...value.split('\n').filter((line) => line.trim().length >= 16)]);
  return [...new Set([...secretValues(env), ...project])].sort((a, b) => b.length - a.length);
}

export function redact(text: string, secrets: string[] = secretValues()): string {
  let out = text;
  for (const secret of secrets) {
    if (out.includes(secret)) out = out.split(secret).join('[redacted]');
  }
  return out;
}
