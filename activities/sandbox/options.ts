/**
 * The objective file's `sandbox:` section -> `SandboxOptions` (workflow input) -> what the
 * provider's create takes. Pure functions: the loader, the activities and the CLI share them.
 */
import { limitsFromConfig } from '../../core/limits';
import os from 'node:os';
import path from 'node:path';
import type { SandboxConfig } from '../../core/objective-schema';
import type { SandboxOptions } from '../../core/types';
import type { BubblewrapConfinement } from './bubblewrap';
import type { SandboxCreateRequest } from './provider';

const expandHome = (p: string) => (p === '~' || p.startsWith('~/') ? path.join(os.homedir(), p.slice(1)) : p);

/** Resolves the file's section (defaults applied by zod) to workflow input; undefined when absent. */
export function sandboxOptionsFromConfig(config: SandboxConfig | undefined, objectiveDir: string): SandboxOptions | undefined {
  if (!config) return undefined;
  const setup = config.project_setup;
  const confined = config.confinement === 'bubblewrap';
  return {
    confinement: config.confinement,
    network: config.network,
    copyIgnored: config.copy_ignored,
    ...(setup && (setup.commands.length > 0 || setup.verify.length > 0)
      ? { projectSetup: { commands: setup.commands, verify: setup.verify, timeoutSeconds: setup.timeout_seconds, attempts: setup.attempts } }
      : {}),
    warmPool: config.warm_pool,
    ...(confined && config.writable.length > 0 ? { writable: config.writable.map(expandHome) } : {}),
    ...(confined && config.hidden.length > 0 ? { hidden: config.hidden.map(expandHome) } : {}),
    // Script agents and prompt files live beside the objective file; keep it readable even
    // when it sits under /tmp, which the sandbox replaces with a private one.
    ...(confined ? { readable: [objectiveDir] } : {}),
    ...(confined && config.limits && limitsFromConfig(config.limits) ? { limits: limitsFromConfig(config.limits) } : {}),
  };
}

/** The confinement a sandbox made with these options runs under (undefined: none). */
export function confinementOf(options: SandboxOptions | undefined): BubblewrapConfinement | undefined {
  if (!options || options.confinement !== 'bubblewrap') return undefined;
  return {
    kind: 'bubblewrap',
    network: options.network,
    ...(options.writable?.length ? { writable: options.writable } : {}),
    ...(options.hidden?.length ? { hidden: options.hidden } : {}),
    ...(options.readable?.length ? { readable: options.readable } : {}),
    ...(options.limits ? { limits: options.limits } : {}),
  };
}

/** The create-request fields for a sandbox made with these options. */
export function createFieldsOf(options: SandboxOptions | undefined): Pick<SandboxCreateRequest, 'confinement' | 'copyIgnored' | 'setup' | 'warmPool'> {
  if (!options) return {};
  const setup = options.projectSetup;
  return {
    confinement: confinementOf(options),
    copyIgnored: options.copyIgnored,
    ...(setup ? { setup: { commands: setup.commands, verify: setup.verify, timeoutMs: setup.timeoutSeconds * 1000, attempts: setup.attempts } } : {}),
    warmPool: options.warmPool,
  };
}
