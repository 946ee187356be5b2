/**
 * The provider watcher: notices ready sandboxes that died outside Slipway (local: the worktree
 * directory removed or unregistered) and tells their workflow, which closes the compute
 * session at the moment the death was seen, with the reason. The proposal's Sandbox Pod
 * Watcher: Kubernetes pods' deaths come pushed from the worker's pod informers (kube-watch.ts),
 * with the pod's own end time, the moment the informer sees them; the probe pass every
 * `intervalMs` stays as the fallback (other providers, a death no informer saw) and is off at 0.
 */
import { readFile } from 'node:fs/promises';
import type { Client } from '@temporalio/client';
import { WorkflowNotFoundError } from '@temporalio/client';
import type { Logger } from 'pino';
import { ABNORMAL_END_REASONS, serviceSandboxWorkflowId, type AbnormalEndReason } from '../core/sandbox-service';
import type { Queryable } from '../activities/billing/db';
import type { ProviderFor } from '../activities/service/providers';
import type { PodExit, PodWatchers } from '../activities/sandbox/kube-watch';
import { parseKubernetesRoot } from '../activities/sandbox/kubernetes';
import type { SandboxLiveness } from '../activities/sandbox/provider';
import { sandboxExitedSignal } from '../workflows/service-sandbox';

export interface SandboxWatcher {
  /** One pass now (tests, and the loop). */
  sweep(): Promise<number>;
  stop(): Promise<void>;
}

export function startSandboxWatcher(opts: { db: Queryable; client: Client; providerFor: ProviderFor; intervalMs: number; logger: Logger; podWatchers?: PodWatchers }): SandboxWatcher {
  const reported = new Set<string>();
  let stopped = false;
  let running: Promise<number> | undefined;

  /** Tells a sandbox's workflow it died (once); false when it was no longer ready or its workflow is gone. */
  const report = async (id: string, liveness: Extract<SandboxLiveness, { alive: false }>): Promise<boolean> => {
    if (reported.has(id)) return false;
    // The provider's own end time when it has one (a pod's finish time), else now.
    const observedAtMs = Math.min(Date.now(), liveness.endedAtMs ?? Date.now());
    // Re-check: a suspend or a delete that started since the query removes the directory on purpose.
    const again = await opts.db.query<{ status: string }>('SELECT status FROM sandboxes WHERE id = $1', [id]);
    if (again.rows[0]?.status !== 'ready') return false;
    const reason: AbnormalEndReason = (ABNORMAL_END_REASONS as readonly string[]).includes(liveness.reason) ? (liveness.reason as AbnormalEndReason) : 'sandbox_lost';
    try {
      await opts.client.workflow.getHandle(serviceSandboxWorkflowId(id)).signal(sandboxExitedSignal, { reason, observedAtMs, detail: liveness.detail });
    } catch (e) {
      if (!(e instanceof WorkflowNotFoundError)) throw e;
      return false;
    }
    reported.add(id);
    opts.logger.warn({ sandboxId: id, reason, detail: liveness.detail }, 'sandbox died outside Slipway');
    return true;
  };

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
      if (await report(row.id, liveness)) found++;
    }
    return found;
  };

  /**
   * A pod the informer saw die: its service sandbox is the ready one whose root the pod's
   * annotations name (a warm-pool sandbox keeps its warm root, so not by sandbox id) and whose
   * record still names this pod (an earlier pod of a restored sandbox is no death of it).
   */
  const onPodExit = async (exit: PodExit) => {
    if (!exit.group || !exit.name) return;
    const { rows } = await opts.db.query<{ id: string; root: string }>(`SELECT id, root FROM sandboxes WHERE status = 'ready' AND provider = 'kubernetes' AND root LIKE $1`, [`%/${exit.group}/${exit.name}`]);
    for (const row of rows) {
      const where = parseKubernetesRoot(row.root);
      if (!where || where.group !== exit.group || where.name !== exit.name) continue;
      const record = await readFile(`${row.root}.json`, 'utf8').then((t) => JSON.parse(t) as { pod?: string; namespace?: string }, () => undefined);
      if (record && (record.pod !== exit.pod || record.namespace !== exit.namespace)) continue;
      await report(row.id, { alive: false, reason: exit.reason, detail: `pod ${exit.namespace}/${exit.pod}: ${exit.detail}`, endedAtMs: exit.endedAtMs });
    }
  };
  const unsubscribe = opts.podWatchers?.onExit((exit) => {
    void onPodExit(exit).catch((e) => opts.logger.error({ err: e, pod: `${exit.namespace}/${exit.pod}` }, 'reporting a pod exit failed'));
  });

  const loop = async () => {
    while (!stopped && opts.intervalMs > 0) {
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
      unsubscribe?.();
      await running;
    },
  };
}
