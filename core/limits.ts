/**
 * Limits as people write them (an objective's `sandbox.limits`, a service profile's `resources`),
 * and what they mean for the sandbox's commands, enforced by its confinement (cgroups for
 * processes, memory and CPU; RLIMIT_FSIZE for file size; a loop-mounted image for the
 * workspace's disk; ADR 0006).
 */
import { z } from 'zod';
import type { SandboxLimits } from './sandbox-service';

export const LimitsConfigSchema = z.strictObject({
  /** CPU share in cores, e.g. 0.5 or 2. */
  cpu: z.number().min(0.01).max(1024).optional(),
  memory_mb: z.number().int().min(16).max(1_048_576).optional(),
  memory_gb: z.number().min(0.016).max(1024).optional(),
  /** Processes and threads at once. */
  processes: z.number().int().min(8).max(1_000_000).optional(),
  /** Largest file a command may write. */
  file_size_mb: z.number().int().min(1).max(1_048_576).optional(),
  /** The workspace's total size (its files, not the shared repository objects). */
  disk_mb: z.number().int().min(16).max(16_777_216).optional(),
});
export type LimitsConfig = z.infer<typeof LimitsConfigSchema>;

const MB = 1024 * 1024;

/** The limits a (validated) config means; undefined when it sets none. */
export function limitsFromConfig(c: LimitsConfig): SandboxLimits | undefined {
  const memoryBytes = c.memory_mb !== undefined ? c.memory_mb * MB : c.memory_gb !== undefined ? Math.round(c.memory_gb * 1024 * MB) : undefined;
  const limits: SandboxLimits = {
    ...(c.processes !== undefined ? { pids: c.processes } : {}),
    ...(memoryBytes !== undefined ? { memoryBytes } : {}),
    ...(c.cpu !== undefined ? { cpus: c.cpu } : {}),
    ...(c.file_size_mb !== undefined ? { fileSizeBytes: c.file_size_mb * MB } : {}),
    ...(c.disk_mb !== undefined ? { diskBytes: c.disk_mb * MB } : {}),
  };
  return Object.keys(limits).length > 0 ? limits : undefined;
}

/** A stored profile's resources; unknown or invalid stored fields are ignored (validated at creation). */
export function limitsFromResources(resources: unknown): SandboxLimits | undefined {
  const parsed = LimitsConfigSchema.safeParse(resources ?? {});
  return parsed.success ? limitsFromConfig(parsed.data) : undefined;
}

/** Validates resources given at profile creation; the error names the field. */
export function parseProfileResources(value: unknown): LimitsConfig {
  const parsed = LimitsConfigSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0]!;
  const field = issue.path.length > 0 ? `resources.${issue.path.join('.')}` : 'resources';
  throw new Error(`${field}: ${issue.message}`);
}
