/**
 * Operator verbs on the billing database: accounts, API tokens, projects, profiles, and monthly usage.
 * They open the billing database directly (DATABASE_URL, else the embedded PGlite under SLIPWAY_HOME, or
 * through `slipway api`'s billing socket while that holds it).
 */
import path from 'node:path';
import type { Command } from 'commander';
import type { Db } from '../../activities/billing/db';
import type * as billingRecords from '../../activities/billing/records';
import { ACCOUNT_ID_PATTERN, ALLOW_UNCONFINED_ENV, allowUnconfinedFromEnv, SERVICE_DEFAULTS, SERVICE_PROVIDERS } from '../../core/sandbox-service';
import { slipwaySettings } from '../../lib/settings';
import { CliError, EXIT } from '../exit-codes';
import { positiveNumber, wholeNumber } from '../numbers';
import { GROUP_DESCRIPTIONS } from '../verbs';

async function withBillingDb<T>(fn: (db: Db) => Promise<T>): Promise<T> {
  let db: Db;
  try {
    // While `slipway api` holds the embedded billing database, the verbs run through its billing socket.
    db = await (require('../../activities/billing/db') as typeof import('../../activities/billing/db')).openBillingDb({ databaseUrl: process.env.DATABASE_URL || undefined, dataDir: slipwaySettings().dataDir, viaHolder: true });
  } catch (e) {
    throw new CliError((e as Error).message, EXIT.runFailed);
  }
  try {
    return await fn(db);
  } finally {
    await db.close();
  }
}

// The billing records (and zod, through them) load on use: `slipway account --help` needs none of it (ADR 0016, 3).
const billing = () => require('../../activities/billing/records') as typeof import('../../activities/billing/records');
const out = (line: string): void => void process.stdout.write(`${line}\n`);

async function requireAccount(db: Db, id: string): Promise<billingRecords.Account> {
  const account = await billing().getAccount(db, id);
  if (!account) throw new CliError(`no account "${id}" (create it with \`slipway account create ${id}\`)`);
  return account;
}

/**
 * A disabled account's sandboxes end now, not at the reaper's next tick: each sandbox workflow is
 * signalled through Temporal (TEMPORAL_ADDRESS, else the embedded server `slipway api` started).
 * Its tokens are refused from the next request on already (the API does not cache them).
 */
async function endLiveSandboxes(db: Db, accountId: string): Promise<void> {
  const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM sandboxes WHERE account_id = $1 AND status NOT IN ('terminated', 'failed')`, [accountId]);
  if (rows[0]!.n === 0) return;
  // Loaded here: only this verb needs Temporal.
  const { resolveTemporal, connectClient } = require('../../workers/temporal') as typeof import('../../workers/temporal');
  const { endAccountSandboxes } = require('../../api/service') as typeof import('../../api/service');
  try {
    const target = await resolveTemporal(slipwaySettings(), { startIfMissing: false });
    const { client, close } = await connectClient(target);
    try {
      const ended = await endAccountSandboxes(db, client, accountId);
      out(`ending ${ended.length} live sandbox(es) of ${accountId} now; its tokens are refused from the next request on`);
    } finally {
      await close();
    }
  } catch (e) {
    out(`${rows[0]!.n} live sandbox(es) of ${accountId} end at the reaper's next tick (Temporal not reachable: ${(e as Error).message}); its tokens are refused now`);
  }
}

/** Unique-violation and check-violation errors read as bad input, not crashes. */
function dbInputError(e: unknown): never {
  const code = (e as { code?: string }).code;
  if (code === '23505') throw new CliError(`already exists: ${(e as { detail?: string }).detail ?? (e as Error).message}`);
  if (code === '23514' || code === '22P02') throw new CliError(`invalid value: ${(e as Error).message}`);
  throw e;
}

export function registerAccountCommands(program: Command): void {
  const account = program.command('account').description(GROUP_DESCRIPTIONS.account);
  account
    .command('create')
    .argument('<id>', `account id: ${ACCOUNT_ID_PATTERN.source}`)
    .option('--name <name>', 'display name')
    .option('--concurrency <n>', 'live sandboxes at once (default 1)', wholeNumber('--concurrency'))
    .option('--monthly-minutes <n>', 'soft monthly cap, for dashboards', wholeNumber('--monthly-minutes'))
    .option('--disabled', 'create with sandboxes turned off')
    .description('create an account')
    .action(async (id: string, opts) => {
      if (!ACCOUNT_ID_PATTERN.test(id)) throw new CliError(`account id must match ${ACCOUNT_ID_PATTERN.source}`);
      await withBillingDb(async (db) => {
        const a = await billing()
          .createAccount(db, { id, name: opts.name, concurrentLimit: opts.concurrency, monthlyMinutes: opts.monthlyMinutes, sandboxesEnabled: !opts.disabled })
          .catch(dbInputError);
        out(`account ${a.id} created (concurrency ${a.concurrent_limit}${a.sandboxes_enabled ? '' : ', sandboxes disabled'})`);
      });
    });
  account
    .command('set')
    .argument('<id>')
    .option('--concurrency <n>', 'live sandboxes at once', wholeNumber('--concurrency'))
    .option('--monthly-minutes <n>', 'soft monthly cap', wholeNumber('--monthly-minutes'))
    .option('--enable', 'turn sandboxes on')
    .option('--disable', 'turn sandboxes off')
    .description("change an account's limits or feature flag")
    .action(async (id: string, opts) => {
      if (opts.enable && opts.disable) throw new CliError('--enable and --disable cannot be given together');
      await withBillingDb(async (db) => {
        await requireAccount(db, id);
        const a = await billing().updateAccount(db, id, {
          concurrentLimit: opts.concurrency,
          monthlyMinutes: opts.monthlyMinutes,
          sandboxesEnabled: opts.enable ? true : opts.disable ? false : undefined,
        });
        out(`account ${a!.id}: concurrency ${a!.concurrent_limit}, sandboxes ${a!.sandboxes_enabled ? 'enabled' : 'disabled'}`);
        if (opts.disable) await endLiveSandboxes(db, id);
      });
    });
  account
    .command('list')
    .option('--json', 'print JSON')
    .description('list accounts')
    .action(async (opts) => {
      await withBillingDb(async (db) => {
        const { rows } = await db.query<billingRecords.Account>('SELECT * FROM accounts ORDER BY id');
        if (opts.json) out(JSON.stringify(rows));
        else for (const a of rows) out(`${a.id.padEnd(24)} concurrency ${a.concurrent_limit}  ${a.sandboxes_enabled ? 'enabled' : 'disabled'}`);
      });
    });

  const token = program.command('token').description(GROUP_DESCRIPTIONS.token);
  token
    .command('create')
    .requiredOption('--account <id>', 'account')
    .option('--name <name>', 'what the token is for', 'default')
    .option('--expires-days <n>', 'expire after this many days', positiveNumber('--expires-days'))
    .description('create a token and print it (the only time it is shown)')
    .action(async (opts) => {
      await withBillingDb(async (db) => {
        await requireAccount(db, opts.account);
        const t = await billing().createApiToken(db, opts.account, { name: opts.name, expiresAtMs: opts.expiresDays ? Date.now() + opts.expiresDays * 86_400_000 : undefined });
        process.stderr.write(`token ${t.id} for account ${opts.account}; store it now, it is not shown again\n`);
        out(t.token);
      });
    });
  token
    .command('revoke')
    .requiredOption('--account <id>', 'account')
    .argument('<token-id>', 'the tok_... id printed at creation')
    .description('revoke a token')
    .action(async (tokenId: string, opts) => {
      await withBillingDb(async (db) => {
        if (!(await billing().revokeApiToken(db, opts.account, tokenId))) throw new CliError(`no live token ${tokenId} in account ${opts.account}`);
        out(`token ${tokenId} revoked`);
      });
    });

  program
    .command('project')
    .description(GROUP_DESCRIPTIONS.project)
    .command('create')
    .argument('<name>')
    .requiredOption('--account <id>', 'account')
    .description('create a project and print its id')
    .action(async (name: string, opts) => {
      await withBillingDb(async (db) => {
        await requireAccount(db, opts.account);
        out((await billing().createProject(db, opts.account, name).catch(dbInputError)).id);
      });
    });

  const profile = program.command('profile').description(GROUP_DESCRIPTIONS.profile);
  profile
    .command('create')
    .argument('<name>')
    .requiredOption('--account <id>', 'account')
    .requiredOption('--repo <path>', 'repository each sandbox is a worktree of (local provider)')
    .option('--base <ref>', 'branch or commit sandboxes start from', 'HEAD')
    .option('--provider <kind>', 'local (worktrees), podman or docker (one container per sandbox, ADR 0012), daytona (one Daytona sandbox each, ADR 0019; the worker needs DAYTONA_API_KEY), kubernetes (one pod each, ADR 0020; the worker needs KUBECONFIG)', 'local')
    .option('--kubernetes <json>', 'with --provider kubernetes: the pods\' settings {"image":"ghcr.io/acme/sandbox:1","namespace":"sandboxes","node_selector":{},"tolerations":[],"resources":{"limits":{"cpu":"2","memory":"4Gi"}},"service_account":"...","storage":"10Gi","storage_class":"...","warm_pool":2} (ADR 0029; image and namespace default to the worker\'s SLIPWAY_KUBE_IMAGE and SLIPWAY_KUBE_NAMESPACE)')
    .option('--platform <platform>', 'linux or macos', 'linux')
    .option('--resources <json>', 'enforced under bubblewrap: {"cpu":2,"memory_mb":4096,"processes":256,"file_size_mb":1024,"disk_mb":8192} (memory_gb also accepted)', '{}')
    .option('--idle-seconds <n>', 'idle threshold before suspend (default 300)', positiveNumber('--idle-seconds'))
    .option('--provisioning-timeout-seconds <n>', 'pending longer than this fails (default 120)', positiveNumber('--provisioning-timeout-seconds'))
    .option('--default-deadline-minutes <n>', 'default deadline (default 60)', positiveNumber('--default-deadline-minutes'))
    .option('--max-deadline-minutes <n>', 'largest deadline a create may ask for (default 1440)', positiveNumber('--max-deadline-minutes'))
    .option('--cap-minutes <n>', 'absolute lifetime cap (default 10080, 7 days)', positiveNumber('--cap-minutes'))
    .option('--warm <n>', 'warm pool size', wholeNumber('--warm'))
    .option('--confinement <kind>', 'bubblewrap, or none (runs tenants on the host: needs --allow-unconfined)', SERVICE_DEFAULTS.confinement)
    .option('--network', 'give sandboxes network access (default: none)')
    .option('--no-network', 'no network (the default)')
    .option('--allow-unconfined', `accept --confinement none (single-tenant setups; \`slipway api --allow-unconfined\` must serve it; env ${ALLOW_UNCONFINED_ENV}=1)`, allowUnconfinedFromEnv())
    .option('--no-copy-ignored', "do not copy the checkout's ignored files (node_modules, ...)")
    .description('create a profile')
    .action(async (name: string, opts) => {
      let resources: Record<string, unknown>;
      try {
        resources = JSON.parse(opts.resources);
      } catch {
        throw new CliError('--resources must be JSON');
      }
      try {
        resources = (require('../../core/limits') as typeof import('../../core/limits')).parseProfileResources(resources);
      } catch (e) {
        throw new CliError(`--resources: ${(e as Error).message}`);
      }
      if (!(SERVICE_PROVIDERS as readonly string[]).includes(opts.provider)) throw new CliError(`--provider must be one of ${SERVICE_PROVIDERS.join(', ')}`);
      if (opts.provider !== 'local' && opts.warm) throw new CliError(`--warm: ${opts.provider} profiles have no worktree warm pool${opts.provider === 'kubernetes' ? ' (warm pods: "warm_pool" in --kubernetes)' : ''}`);
      let kubernetes: unknown;
      if (opts.kubernetes !== undefined) {
        if (opts.provider !== 'kubernetes') throw new CliError(`--kubernetes applies to --provider kubernetes only, not ${opts.provider}`);
        try {
          kubernetes = JSON.parse(opts.kubernetes);
        } catch {
          throw new CliError('--kubernetes must be JSON');
        }
        try {
          (require('../../core/kubernetes') as typeof import('../../core/kubernetes')).parseProfileKubernetes(kubernetes);
        } catch (e) {
          throw new CliError(`--kubernetes: ${(e as Error).message}`);
        }
      }
      if (!['linux', 'macos'].includes(opts.platform)) throw new CliError('--platform must be linux or macos');
      if (!['none', 'bubblewrap'].includes(opts.confinement)) throw new CliError('--confinement must be none or bubblewrap');
      if (opts.provider === 'local' && opts.confinement === 'none' && !opts.allowUnconfined) {
        throw new CliError('--confinement none would run tenants\' commands on the host as the API server\'s user; pass --allow-unconfined as well for a single-tenant setup (and start `slipway api --allow-unconfined`)');
      }
      await withBillingDb(async (db) => {
        await requireAccount(db, opts.account);
        const p = await billing()
          .createProfile(db, opts.account, {
            name,
            repository: path.resolve(opts.repo),
            baseRef: opts.base,
            provider: opts.provider,
            platform: opts.platform,
            resources,
            idleTimeoutSeconds: opts.idleSeconds,
            provisioningTimeoutSeconds: opts.provisioningTimeoutSeconds,
            defaultDeadlineMinutes: opts.defaultDeadlineMinutes,
            maxDeadlineMinutes: opts.maxDeadlineMinutes,
            absoluteCapMinutes: opts.capMinutes,
            warmReplicas: opts.warm,
            confinement: opts.confinement,
            network: opts.network,
            copyIgnored: opts.copyIgnored,
            ...(kubernetes !== undefined ? { kubernetes } : {}),
          })
          .catch(dbInputError);
        out(`profile ${p.name} (${p.id}) for ${opts.account}: ${p.provider}/${p.platform}, ${p.confinement}, network ${p.network ? 'on' : 'off'}, idle ${p.idle_timeout_seconds} s, warm ${p.warm_replicas}`);
      });
    });
  profile
    .command('list')
    .option('--account <id>', 'only this account')
    .option('--json', 'print JSON')
    .description('list profiles')
    .action(async (opts) => {
      await withBillingDb(async (db) => {
        const rows = await billing().listProfiles(db, opts.account);
        if (opts.json) out(JSON.stringify(rows));
        else for (const p of rows) out(`${p.account_id.padEnd(20)} ${p.name.padEnd(24)} ${p.provider}/${p.platform}  ${p.repository}`);
      });
    });

  program
    .command('usage')
    .requiredOption('--account <id>', 'account')
    .requiredOption('--month <yyyy-mm>', 'calendar month (UTC), e.g. 2026-11')
    .option('--json', 'print JSON')
    .description(GROUP_DESCRIPTIONS.usage)
    .action(async (opts) => {
      try {
        billing().monthRange(opts.month);
      } catch (e) {
        throw new CliError((e as Error).message);
      }
      await withBillingDb(async (db) => {
        const acct = await requireAccount(db, opts.account);
        const lines = await billing().monthlyUsage(db, opts.account, opts.month);
        const compute = lines.filter((l) => l.kind === 'compute').reduce((s, l) => s + l.minutes, 0);
        if (opts.json) {
          out(JSON.stringify({ account: opts.account, month: opts.month, lines, compute_minutes: compute, monthly_minutes_cap: acct.monthly_minutes }));
          return;
        }
        out(`usage of ${opts.account} in ${opts.month} (UTC)`);
        if (lines.length === 0) out('  no sessions');
        for (const l of lines) out(`  ${l.kind.padEnd(17)} ${l.platform.padEnd(6)} ${l.minutes.toFixed(2).padStart(10)} min  (${l.sessions} sessions)`);
        if (acct.monthly_minutes !== null) out(`  soft cap: ${acct.monthly_minutes} compute minutes (${((compute / acct.monthly_minutes) * 100).toFixed(1)}% used)`);
      });
    });
}
