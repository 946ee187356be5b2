/**
 * One small database interface over two engines: real Postgres (`pg`, via DATABASE_URL) and
 * the embedded default, PGlite (Postgres compiled to WebAssembly, in this process, data in a
 * folder). Both speak the same SQL, so the billing database and its migrations are written once.
 */
import { chmodSync, existsSync, mkdirSync, promises as fs, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { withFileLock } from '../../lib/file-lock';
import { migrate } from './migrate';
import { connectBillingSocket, billingSocketPath } from './socket';

export interface QueryResult<T> {
  rows: T[];
  rowCount: number;
}

export interface Queryable {
  query<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<QueryResult<T>>;
  /** Runs several statements with no parameters (migrations). */
  exec(sql: string): Promise<void>;
}

export interface Db extends Queryable {
  readonly engine: 'postgres' | 'pglite';
  /** Runs `fn` in one transaction; rolls back when it throws. */
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

// timestamptz and int8 come back as Date and number on both engines.
pg.types.setTypeParser(20, (v) => Number(v));

export function openPostgres(url: string, opts: { max?: number } = {}): Db {
  const pool = new pg.Pool({ connectionString: url, max: opts.max ?? 10 });
  // An idle client losing its connection must not crash the process; the next query reconnects.
  pool.on('error', () => undefined);
  const run = async <T>(q: pg.Pool | pg.PoolClient, sql: string, params?: unknown[]): Promise<QueryResult<T>> => {
    const r = await q.query(sql, params as unknown[]);
    return { rows: r.rows as T[], rowCount: r.rowCount ?? 0 };
  };
  return {
    engine: 'postgres',
    query: (sql, params) => run(pool, sql, params),
    async transaction(fn) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const result = await fn({
          query: (sql, params) => run(client, sql, params),
          exec: async (sql) => {
            await client.query(sql);
          },
        });
        await client.query('COMMIT');
        return result;
      } catch (e) {
        await client.query('ROLLBACK').catch(() => undefined);
        throw e;
      } finally {
        client.release();
      }
    },
    async exec(sql) {
      await pool.query(sql);
    },
    close: () => pool.end(),
  };
}

export class BillingDbInUseError extends Error {
  constructor(
    readonly dir: string,
    readonly pid: number,
    hint = 'stop it first, or set DATABASE_URL to share a Postgres server',
  ) {
    super(`the embedded billing database in ${dir} is in use by process ${pid} (\`slipway api\`?); ${hint}`);
    this.name = 'BillingDbInUseError';
  }
}

const LOCK_FILE = 'slipway.lock';

/**
 * A process's identity as the kernel sees it: its pid and start time (clock ticks since boot,
 * field 22 of /proc/<pid>/stat), so a pid reused by another process is not taken for the holder.
 * Undefined when the process is gone or a zombie (a killed holder its parent has not reaped yet).
 */
export function processIdentity(pid: number): { pid: number; start?: string } | undefined {
  if (!Number.isInteger(pid) || pid <= 0) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces and parentheses: fields are counted after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z' || fields[0] === 'X') return undefined;
    return { pid, start: fields[19] };
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT' || existsSync('/proc/self/stat')) return undefined;
  }
  // No /proc (not Linux): signal 0 says whether the pid exists.
  try {
    process.kill(pid, 0);
    return { pid };
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM' ? { pid } : undefined;
  }
}

/** The live holder named by a lock file's `<pid> <start>` line, if that process still runs. */
export function liveHolder(line: string): number | undefined {
  const [pidText, start] = line.trim().split(/\s+/);
  const pid = Number(pidText);
  const alive = processIdentity(pid);
  if (!alive) return undefined;
  // A lock written without a start time (older Slipway) trusts the pid alone.
  if (start !== undefined && alive.start !== undefined && alive.start !== start) return undefined;
  return pid;
}

/**
 * PGlite is one process's database: two processes opening the same folder would corrupt it.
 * A lock file names the holder by pid and start time; a holder that died (even by SIGKILL, even
 * before it was reaped) or whose pid now belongs to another process is stale and taken over.
 * The check-and-write runs under a short file lock, so two processes starting at once cannot
 * both take a stale lock.
 */
async function lockPglite(dataDir: string): Promise<() => void> {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // The billing database holds token hashes and the holder's socket: the operator's only.
  chmodSync(dataDir, 0o700);
  const lock = path.join(dataDir, LOCK_FILE);
  const me = processIdentity(process.pid);
  const line = `${process.pid} ${me?.start ?? ''}`.trim();
  await withFileLock(lock, async () => {
    let current = '';
    try {
      current = readFileSync(lock, 'utf8');
    } catch {
      /* no holder */
    }
    const holder = current ? liveHolder(current) : undefined;
    if (holder !== undefined && holder !== process.pid) throw new BillingDbInUseError(dataDir, holder);
    writeFileSync(lock, `${line}\n`, { mode: 0o600 });
  });
  return () => {
    // Only our own line is removed: a process that took over a lock it found stale keeps its own.
    try {
      if (readFileSync(lock, 'utf8').trim() === line) rmSync(lock, { force: true });
    } catch {
      /* gone already */
    }
  };
}

/** PGlite in `dataDir` (created when missing), or in memory when dataDir is undefined. */
export async function openPglite(dataDir?: string): Promise<Db> {
  const { PGlite } = await import('@electric-sql/pglite');
  const unlock = dataDir ? await lockPglite(dataDir) : () => undefined;
  const db = await PGlite.create(dataDir).catch((e) => {
    unlock();
    throw e;
  });
  type Pg = Pick<typeof db, 'query'>;
  const run = async <T>(q: Pg, sql: string, params?: unknown[]): Promise<QueryResult<T>> => {
    const r = await q.query<T>(sql, params);
    return { rows: r.rows, rowCount: r.affectedRows ?? r.rows.length };
  };
  return {
    engine: 'pglite',
    query: (sql, params) => run(db, sql, params),
    transaction: (fn) =>
      db.transaction((tx) =>
        fn({
          query: (sql, params) => run(tx, sql, params),
          exec: async (sql) => {
            await tx.exec(sql);
          },
        }),
      ),
    async exec(sql) {
      await db.exec(sql);
    },
    close: async () => {
      await db.close();
      unlock();
    },
  };
}

/** The embedded billing database's folder under the Slipway data folder. */
export const BILLING_DIR = 'billing';

/**
 * The billing database for this process: DATABASE_URL when set, else the embedded PGlite under
 * the Slipway data folder.
 */
export async function openDatabase(opts: { databaseUrl?: string; dataDir: string }): Promise<Db> {
  if (opts.databaseUrl) return openPostgres(opts.databaseUrl);
  const dir = path.join(opts.dataDir, BILLING_DIR);
  // Before 0.2 the folder was `ledger/` (a word now kept for the recovery ledger): moved once.
  await fs.rename(path.join(opts.dataDir, 'ledger'), dir).catch((e: NodeJS.ErrnoException) => {
    if (e.code !== 'ENOENT' && e.code !== 'EEXIST' && e.code !== 'ENOTEMPTY') throw e;
  });
  return openPglite(dir);
}

/**
 * The billing database from the environment (DATABASE_URL, else PGlite under SLIPWAY_HOME), migrated.
 * `viaHolder`: when another process holds the embedded billing database (`slipway api`), statements go
 * through that process's billing socket instead (socket.ts; it migrated the billing database it serves).
 */
export async function openBillingDb(opts: { databaseUrl?: string; dataDir: string; viaHolder?: boolean }): Promise<Db> {
  let db: Db;
  try {
    db = await openDatabase(opts);
  } catch (e) {
    if (!(e instanceof BillingDbInUseError) || !opts.viaHolder) throw e;
    return connectToHolder(e);
  }
  try {
    await migrate(db);
  } catch (e) {
    await db.close();
    throw e;
  }
  return db;
}

async function connectToHolder(inUse: BillingDbInUseError): Promise<Db> {
  const remote = connectBillingSocket(billingSocketPath(inUse.dir));
  try {
    await remote.query('SELECT 1');
  } catch (e) {
    throw new BillingDbInUseError(inUse.dir, inUse.pid, `it does not answer on its billing socket (${(e as Error).message}); stop it first, or set DATABASE_URL to share a Postgres server`);
  }
  return remote;
}
