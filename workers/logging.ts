/** Temporal Core runtime logging: warnings and errors by default (SLIPWAY_LOG_LEVEL to change). */
import { DefaultLogger, Runtime, type LogLevel } from '@temporalio/worker';

let installed = false;

export function installRuntimeLogging(level: LogLevel = (process.env.SLIPWAY_LOG_LEVEL?.toUpperCase() as LogLevel) || 'WARN'): void {
  if (installed) return;
  installed = true;
  try {
    Runtime.install({ logger: new DefaultLogger(level) });
  } catch {
    /* a runtime already exists in this process: keep its logger */
  }
}
