/** The objective file's `sandbox:` section -> `SandboxOptions` (workflow input). Pure. */
import os from 'node:os';
import path from 'node:path';
import { kubernetesSettingsOf } from '../core/kubernetes';
import { limitsFromConfig } from '../core/limits';
import type { SandboxConfig } from '../core/objective-schema';
import type { SandboxOptions } from '../core/types';

const expandHome = (p: string) => (p === '~' || p.startsWith('~/') ? path.join(os.homedir(), p.slice(1)) : p);

/** Resolves the file's section (defaults applied by zod) to workflow input; undefined when absent. */
export function sandboxOptionsFromConfig(config: SandboxConfig | undefined, objectiveDir: string): SandboxOptions | undefined {
  if (!config) return undefined;
  const setup = config.project_setup;
  const confined = config.confinement === 'bubblewrap';
  const container = config.provider !== 'local';
  return {
    ...(container ? { provider: config.provider } : {}),
    ...(config.provider === 'kubernetes' ? { kubernetes: kubernetesSettingsOf(config.kubernetes) } : {}),
    confinement: config.confinement,
    network: config.network,
    copyIgnored: config.copy_ignored,
    ...(setup && (setup.commands.length > 0 || setup.verify.length > 0)
      ? { projectSetup: { commands: setup.commands, verify: setup.verify, timeoutSeconds: setup.timeout_seconds, attempts: setup.attempts } }
      : {}),
    warmPool: config.warm_pool,
    ...(config.probe_seconds !== undefined ? { probeSeconds: config.probe_seconds } : {}),
    ...(confined && config.writable.length > 0 ? { writable: config.writable.map(expandHome) } : {}),
    ...(confined && config.hidden.length > 0 ? { hidden: config.hidden.map(expandHome) } : {}),
    // Script agents and prompt files live beside the objective file; keep it readable even
    // when it sits under /tmp, which the sandbox replaces with a private one.
    // `readable:` of the file (agent CLIs, their config) beside it. A container sees them only if bound in (read-only).
    ...(confined ? { readable: [objectiveDir, ...config.readable.map(expandHome)] } : container ? { readable: [objectiveDir] } : {}),
    ...((confined || container) && config.limits && limitsFromConfig(config.limits) ? { limits: limitsFromConfig(config.limits) } : {}),
  };
}
