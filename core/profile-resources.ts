/**
 * A service profile's `resources`: what each of its sandboxes may use, enforced by the sandbox's
 * confinement (cgroups for processes, memory and CPU; RLIMIT_FSIZE for file size; ADR 0006).
 */
import { z } from 'zod';
import type { SandboxLimitsSpec } from './sandbox-service';

export const ProfileResourcesSchema = z.strictObject({
  /** CPU share in cores, e.g. 0.5 or 2. */
  cpu: z.number().min(0.01).max(1024).optional(),
  memory_mb: z.number().int().min(16).max(1_048_576).optional(),
  memory_gb: z.number().min(0.016).max(1024).optional(),
  /** Processes and threads at once. */
  processes: z.number().int().min(8).max(1_000_000).optional(),
  /** Largest file a command may write. */
  file_size_mb: z.number().int().min(1).max(1_048_576).optional(),
});
export type ProfileResources = z.infer<typeof ProfileResourcesSchema>;

const MB = 1024 * 1024;

/** The limits a profile's resources mean; unknown or invalid stored fields are ignored (validated at creation). */
export function limitsFromResources(resources: unknown): SandboxLimitsSpec | undefined {
  const parsed = ProfileResourcesSchema.safeParse(resources ?? {});
  if (!parsed.success) return undefined;
  const r = parsed.data;
  const memoryBytes = r.memory_mb !== undefined ? r.memory_mb * MB : r.memory_gb !== undefined ? Math.round(r.memory_gb * 1024 * MB) : undefined;
  const limits: SandboxLimitsSpec = {
    ...(r.processes !== undefined ? { pids: r.processes } : {}),
    ...(memoryBytes !== undefined ? { memoryBytes } : {}),
    ...(r.cpu !== undefined ? { cpus: r.cpu } : {}),
    ...(r.file_size_mb !== undefined ? { fileSizeBytes: r.file_size_mb * MB } : {}),
  };
  return Object.keys(limits).length > 0 ? limits : undefined;
}

/** Validates resources given at profile creation; the error names the field. */
export function parseProfileResources(value: unknown): ProfileResources {
  const parsed = ProfileResourcesSchema.safeParse(value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0]!;
  const field = issue.path.length > 0 ? `resources.${issue.path.join('.')}` : 'resources';
  throw new Error(`${field}: ${issue.message}`);
}
