/**
 * `SandboxOptions` (workflow input, made by config/sandbox-options.ts from the objective file)
 * -> what the provider's create takes. Pure functions: the activities and the CLI share them.
 */
import type { SandboxOptions } from '../../core/types';
import type { BubblewrapConfinement } from './bubblewrap';
import type { ContainerSettings } from './container';
import type { SandboxCreateRequest } from './provider';

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

/** How a container sandbox made with these options runs: its network, limits and the read-only host paths it sees. */
export function containerSettingsOf(options: SandboxOptions): ContainerSettings {
  return {
    network: options.network,
    ...(options.limits ? { limits: options.limits } : {}),
    ...(options.readable?.length ? { readable: options.readable } : {}),
  };
}

/** The create-request fields for a sandbox made with these options. */
export function createFieldsOf(options: SandboxOptions | undefined): Pick<SandboxCreateRequest, 'confinement' | 'copyIgnored' | 'setup' | 'warmPool' | 'provider' | 'container' | 'kubernetes'> {
  if (!options) return {};
  const setup = options.projectSetup;
  return {
    ...(options.provider && options.provider !== 'local' ? { provider: options.provider, container: containerSettingsOf(options) } : {}),
    ...(options.provider === 'kubernetes' && options.kubernetes ? { kubernetes: options.kubernetes } : {}),
    confinement: confinementOf(options),
    copyIgnored: options.copyIgnored,
    ...(setup ? { setup: { commands: setup.commands, verify: setup.verify, timeoutMs: setup.timeoutSeconds * 1000, attempts: setup.attempts } } : {}),
    warmPool: options.warmPool,
  };
}
