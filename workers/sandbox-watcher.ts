/**
 * The provider watcher: notices ready sandboxes that died outside Slipway (local: the worktree
 * directory removed or unregistered) and tells their workflow, which closes the compute
 * session at the moment the death was seen, with the reason. The proposal's Sandbox Pod
 * Watcher; a Kubernetes provider would feed the same signal from an informer.
 */
import type { Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/client';
import type { Logger } from 'pino';
import { ABNORMAL_END_REASONS, serviceSandboxWorkflowId, type AbnormalEndReason } from '../core/sandbox-service';
import type { Queryable } from '../activities/billing/db';
import type { ProviderFor } from '../activities/service/providers';
import { sandboxExitedSignal } from '../workflows/service-sandbox';

export interface SandboxWatcher {
  /** One pass now (tests, and the loop). */
  sweep(): Promise<number>;
  stop(): Promise<void>;
}

export function startSandboxWatcher(opts: { db: Queryable; client: Client; providerFor: ProviderFor; intervalMs: number; logger: Logger }): SandboxWatcher {
  const reported = new Set<string>();
  let stopped = false;
  let running: Promise<number> | undefined;

  const sweep = async (): Promise<number> => {
    const { rows } = await opts.db.query<{ id: string; root: string; provider: 'local'; copy_ignored: boolean; confinement: 'none' | 'bubblewrap'; network: boolean }>(
      `SELECT s.id, s.root, s.provider, p.copy_ignored, p.confinement, p.network
       FROM sandboxes s JOIN sandbox_profiles p ON p.id = s.profile_id
       WHERE s.status = 'ready' AND s.root IS NOT NULL`,
    );
    const live = new Set(rows.map((r) => r.id));
    for (const id of reported) if (!live.has(id)) reported.delete(id);
    let found = 0;
    for (const row of rows) {
      if (reported.has(row.id)) continue;
      const provider = opts.providerFor({ provider: row.provider, confinement: row.confinement, network: row.network, copyIgnored: row.copy_ignored });
      if (!provider.probe) continue;
      const liveness = await provider.probe({ root: row.root });
      if (liveness.alive) continue;
      // The provider's own end time when it has one (a pod's finish time), else now.
      const observedAtMs = Math.min(Date.now(), liveness.endedAtMs ?? Date.now());
      // Re-check: a suspend or a delete that started since the query removes the directory on purpose.
      const again = await opts.db.query<{ status: string }>('SELECT status FROM sandboxes WHERE id = $1', [row.id]);
      if (again.rows[0]?.status !== 'ready') continue;
      const reason: AbnormalEndReason = (ABNORMAL_END_REASONS as readonly string[]).includes(liveness.reason) ? (liveness.reason as AbnormalEndReason) : 'sandbox_lost';
      try {
        await opts.client.workflow.getHandle(serviceSandboxWorkflowId(row.id)).signal(sandboxExitedSignal, { reason, observedAtMs, detail: liveness.detail });
        reported.add(row.id);
        found++;
        opts.logger.warn({ sandboxId: row.id, reason, detail: liveness.detail }, 'sandbox died outside Slipway');
      } catch (e) {
        if (!(e instanceof WorkflowNotFoundError)) throw e;
      }
    }
    return found;
  };

  const loop = async () => {
    while (!stopped) {
      running = sweep().catch((e) => {
        opts.logger.error({ err: e }, 'sandbox watcher pass failed');
        return 0;
      });
      await running;
      await new Promise((r) => setTimeout(r, opts.intervalMs).unref());
    }
  };
  void loop();
  return {
    sweep,
    async stop() {
      stopped = true;
      await running;
    },
  };
}
