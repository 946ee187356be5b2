/**
 * `slipway codec-server`: decodes encrypted history payloads (SLIPWAY_PAYLOAD_KEY) for the
 * Temporal Web UI and CLI. See workers/codec-server.ts and docs/security.md.
 */
import type { Command } from 'commander';
import { EncryptionCodec, payloadKeyringFromEnv, PAYLOAD_KEY_ENV } from '../../workers/payload-codec';
import { slipwaySettings } from '../../lib/settings';
import { startCodecServer } from '../../workers/codec-server';
import { CliError, EXIT } from '../exit-codes';
import { portNumber } from '../numbers';
import { GROUP_DESCRIPTIONS } from '../verbs';

const log = (line: string) => process.stderr.write(`${line}\n`);

export async function codecServerCommand(opts: { host: string; port: number; origin?: string[] }): Promise<number> {
  const settings = slipwaySettings();
  const keyring = payloadKeyringFromEnv();
  if (!keyring) throw new CliError(`${PAYLOAD_KEY_ENV} is not set (environment or $SLIPWAY_HOME/.env): there is nothing to decode`);
  const origins = opts.origin && opts.origin.length > 0 ? opts.origin : [`http://localhost:${settings.uiPort}`, `http://127.0.0.1:${settings.uiPort}`];
  let server;
  try {
    server = await startCodecServer({ codec: new EncryptionCodec(keyring), host: opts.host, port: opts.port, allowedOrigins: origins });
  } catch (e) {
    throw new CliError(`cannot listen on ${opts.host}:${opts.port}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, EXIT.runFailed);
  }
  log(`codec server on ${server.url} (keys: ${[...keyring.keys.keys()].join(', ')}; current ${keyring.currentKeyId}); browser origins: ${origins.join(', ')}`);
  log(`Web UI: set the codec endpoint to ${server.url} (or start the server with --ui-codec-endpoint ${server.url}); CLI: temporal workflow show --codec-endpoint ${server.url} ...`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
  await server.close();
  return EXIT.ok;
}

export function registerCodecServerCommand(program: Command, setExit: (code: number) => void): void {
  program
    .command('codec-server')
    .description(GROUP_DESCRIPTIONS['codec-server'])
    .option('--host <host>', 'listen address', '127.0.0.1')
    .option('--port <port>', 'listen port', portNumber('--port'), 8234)
    .option('--origin <url...>', 'browser origins allowed to call it (default: the embedded Web UI, http://localhost:$SLIPWAY_UI_PORT)')
    .action(async (opts) => setExit(await codecServerCommand(opts)));
}
