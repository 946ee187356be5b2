/**
 * Prometheus metrics of the sandbox service: provisioning time, exec duration, suspend and
 * restore times, and active sandboxes per account and state (read from the billing database at scrape
 * time, so every API replica reports the same truth).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Queryable } from '../billing/db';

const SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

export interface ServiceMetrics {
  registry: Registry;
  provisioned(platform: string, kind: string, ms: number): void;
  exec(accountId: string, platform: string, ms: number): void;
  suspended(ms: number): void;
  restored(ms: number): void;
  transition(state: string): void;
  /** An interactive session (streaming exec, WebSocket) opened. */
  sessionOpened(accountId: string, platform: string, transport: 'stream' | 'websocket', pty: boolean): void;
  /** Bytes a session's command read (in) or wrote (out). */
  sessionBytes(accountId: string, direction: 'in' | 'out', bytes: number): void;
  /** Output bytes the server holds for one slow reader right now; the gauge keeps the highest seen. */
  sessionBuffered(bytes: number): void;
  /** Preview proxy requests (kind http or upgrade), by outcome (proxied, link, or the error code). */
  previewRequest(kind: string, outcome: string): void;
  /** Bytes through the interactive surfaces (surface preview or ssh; in = towards the sandbox). */
  interactiveBytes(surface: 'preview' | 'ssh', direction: 'in' | 'out', n: number): void;
  /** SSH sessions and channels, by what happened (authenticated, refused, shell, exec, sftp). */
  ssh(event: string): void;
}

export function createServiceMetrics(db: Queryable, opts: { defaultMetrics?: boolean; allowUnconfined?: boolean } = {}): ServiceMetrics {
  const registry = new Registry();
  if (opts.defaultMetrics) collectDefaultMetrics({ register: registry });
  // Visible on every scrape, so an operator's dashboard shows a server that accepts unconfined tenants.
  new Gauge({ name: 'slipway_unconfined_allowed', help: '1 when the server was started with --allow-unconfined (tenants may run on the host unconfined).', registers: [registry] }).set(opts.allowUnconfined ? 1 : 0);
  const provisioning = new Histogram({
    name: 'slipway_sandbox_provisioning_seconds',
    help: 'Time from the start of provisioning to ready, by platform and provisioning kind (warm_hit, cold_boot).',
    labelNames: ['platform', 'kind'],
    buckets: SECONDS,
    registers: [registry],
  });
  const exec = new Histogram({
    name: 'slipway_sandbox_exec_duration_seconds',
    help: 'Duration of POST /exec calls inside sandboxes, by account and platform.',
    labelNames: ['account', 'platform'],
    buckets: SECONDS,
    registers: [registry],
  });
  const suspend = new Histogram({ name: 'slipway_sandbox_suspend_seconds', help: 'Idle offload: time to snapshot and free a sandbox.', buckets: SECONDS, registers: [registry] });
  const restore = new Histogram({ name: 'slipway_sandbox_restore_seconds', help: 'Wake: time to restore a suspended sandbox.', buckets: SECONDS, registers: [registry] });
  const transitions = new Counter({ name: 'slipway_sandbox_transitions_total', help: 'Lifecycle transitions recorded, by the state entered.', labelNames: ['state'], registers: [registry] });
  const previewRequests = new Counter({ name: 'slipway_preview_requests_total', help: 'Preview proxy requests, by kind (http, upgrade) and outcome (proxied, link, or the refusal code).', labelNames: ['kind', 'outcome'], registers: [registry] });
  const interactiveBytes = new Counter({ name: 'slipway_interactive_bytes_total', help: 'Bytes through previews and SSH, by surface and direction (in: towards the sandbox).', labelNames: ['surface', 'direction'], registers: [registry] });
  const ssh = new Counter({ name: 'slipway_ssh_events_total', help: 'SSH broker events: authenticated, refused, and channels opened (shell, exec, sftp).', labelNames: ['event'], registers: [registry] });
  new Gauge({
    name: 'slipway_sandboxes',
    help: 'Sandboxes not yet terminated, by account, platform and state.',
    labelNames: ['account', 'platform', 'state'],
    registers: [registry],
    async collect() {
      this.reset();
      const { rows } = await db.query<{ account_id: string; platform: string; status: string; n: number }>(
        `SELECT account_id, platform, status, count(*)::int AS n FROM sandboxes WHERE status NOT IN ('terminated', 'failed') GROUP BY 1, 2, 3`,
      );
      for (const r of rows) this.set({ account: r.account_id, platform: r.platform, state: r.status }, r.n);
    },
  });
  const sessions = new Counter({ name: 'slipway_sandbox_sessions_opened_total', help: 'Interactive sessions opened (streaming exec and WebSocket), by account, platform, transport and pty.', labelNames: ['account', 'platform', 'transport', 'pty'], registers: [registry] });
  const sessionBytes = new Counter({ name: 'slipway_sandbox_session_bytes_total', help: "Bytes through interactive sessions: in = to the command's stdin, out = its output.", labelNames: ['account', 'direction'], registers: [registry] });
  let bufferedMax = 0;
  const buffered = new Gauge({ name: 'slipway_sandbox_session_buffered_bytes_max', help: 'Most output bytes the server held at once for one session reader (bounded by back-pressure).', registers: [registry] });
  return {
    registry,
    sessionOpened: (account, platform, transport, pty) => sessions.inc({ account, platform, transport, pty: String(pty) }),
    sessionBytes: (account, direction, bytes) => sessionBytes.inc({ account, direction }, bytes),
    sessionBuffered: (bytes) => {
      if (bytes > bufferedMax) buffered.set((bufferedMax = bytes));
    },
    provisioned: (platform, kind, ms) => provisioning.observe({ platform, kind }, ms / 1000),
    exec: (account, platform, ms) => exec.observe({ account, platform }, ms / 1000),
    suspended: (ms) => suspend.observe(ms / 1000),
    restored: (ms) => restore.observe(ms / 1000),
    transition: (state) => transitions.inc({ state }),
    previewRequest: (kind, outcome) => previewRequests.inc({ kind, outcome }),
    interactiveBytes: (surface, direction, n) => interactiveBytes.inc({ surface, direction }, n),
    ssh: (event) => ssh.inc({ event }),
  };
}
