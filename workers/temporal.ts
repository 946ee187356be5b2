/**
 * Reaching Temporal: TEMPORAL_ADDRESS when set (start nothing), else the embedded dev server
 * on the Slipway port, started here when nothing listens there yet.
 */
import { Client, Connection } from '@temporalio/client';
import type { DataConverter } from '@temporalio/common';
import { SLIPWAY_SEARCH_ATTRIBUTES } from '../core/search-attributes';
import { SearchAttributeType } from '@temporalio/common';
import { isPortOpen, startDevServer, waitForTemporal, type DevServer } from './dev-server';
import { slipwayDataConverter } from './payload-codec';
import type { SlipwaySettings } from '../lib/settings';

export interface TemporalTarget {
  address: string;
  namespace: string;
  /** The server this process started (and must stop), if any. */
  server?: DevServer;
  uiUrl?: string;
}

export async function resolveTemporal(settings: SlipwaySettings, opts: { startIfMissing: boolean }): Promise<TemporalTarget> {
  if (settings.temporalAddress) {
    await waitForTemporal(settings.temporalAddress, 15_000);
    await registerSearchAttributes(settings.temporalAddress, settings.namespace);
    return { address: settings.temporalAddress, namespace: settings.namespace };
  }
  const address = `127.0.0.1:${settings.embeddedPort}`;
  const uiUrl = `http://localhost:${settings.uiPort}`;
  if (await isPortOpen(settings.embeddedPort)) {
    await waitForTemporal(address, 15_000);
    return { address, namespace: settings.namespace, uiUrl };
  }
  if (!opts.startIfMissing) {
    throw new Error(`No Temporal server at ${address}. Start one with \`slipway dev\`, or set TEMPORAL_ADDRESS.`);
  }
  const server = await startDevServer({
    dataDir: settings.dataDir,
    port: settings.embeddedPort,
    uiPort: settings.uiPort,
    namespace: settings.namespace,
  }).catch((e: Error) => {
    throw new Error(withPortHint(e.message));
  });
  return { address: server.address, namespace: settings.namespace, server, uiUrl: server.uiUrl };
}

/** The setting that moves a port the embedded server found taken, after the server's own reason. */
export function withPortHint(message: string): string {
  const hint = /can't set UI port/.test(message) ? 'SLIPWAY_UI_PORT' : /can't set frontend port/.test(message) ? 'SLIPWAY_TEMPORAL_PORT' : undefined;
  if (!hint) return message;
  const [first, ...rest] = message.split('\n');
  return [`${first} (set ${hint} to use another port)`, ...rest].join('\n');
}

/** Registers Slipway's search attributes on a server Slipway did not start (idempotent). */
export async function registerSearchAttributes(address: string, namespace: string): Promise<void> {
  const connection = await Connection.connect({ address });
  try {
    const existing = await connection.operatorService.listSearchAttributes({ namespace });
    const missing = SLIPWAY_SEARCH_ATTRIBUTES.filter((k) => !(k.name in (existing.customAttributes ?? {})));
    if (missing.length === 0) return;
    await connection.operatorService.addSearchAttributes({
      namespace,
      searchAttributes: Object.fromEntries(missing.map((k) => [k.name, k.type === SearchAttributeType.DOUBLE ? 4 /* INDEXED_VALUE_TYPE_DOUBLE */ : 2 /* INDEXED_VALUE_TYPE_KEYWORD */])),
    });
  } finally {
    await connection.close();
  }
}

/** A client with Slipway's data converter (default: from the environment, see workers/payload-codec.ts), so it agrees with the workers. */
export async function connectClient(
  target: TemporalTarget,
  dataConverter: DataConverter = slipwayDataConverter(),
): Promise<{ client: Client; close: () => Promise<void> }> {
  const connection = await Connection.connect({ address: target.address });
  return { client: new Client({ connection, namespace: target.namespace, dataConverter }), close: () => connection.close() };
}
