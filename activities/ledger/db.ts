/**
 * One small database interface over two engines: real Postgres (`pg`, via DATABASE_URL) and
 * the embedded default, PGlite (Postgres compiled to WebAssembly, in this process, data in a
 * folder). Both speak the same SQL, so the ledger and its migrations are written once.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { migrate } from './migrate';

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

export class LedgerInUseError extends Error {
  constructor(dir: string, pid: number) {
    super(`the embedded ledger in ${dir} is in use by process ${pid} (\`slipway api\`?); stop it first, or set DATABASE_URL to share a Postgres server`);
    this.name = 'LedgerInUseError';
  }
}

/**
 * PGlite is one process's database: two processes opening the same folder would corrupt it.
 * A pid lock file refuses the second one clearly; a stale lock (dead pid) is taken over.
 */
function lockPglite(dataDir: string): () => void {
  mkdirSync(dataDir, { recursive: true });
  const lock = path.join(dataDir, 'slipway.lock');
  try {
    const pid = Number(readFileSync(lock, 'utf8').trim());
    if (pid && pid !== process.pid) {
      try {
        process.kill(pid, 0);
        throw new LedgerInUseError(dataDir, pid);
      } catch (e) {
        if (e instanceof LedgerInUseError) throw e; // alive; ESRCH means stale
      }
    }
  } catch (e) {
    if (e instanceof LedgerInUseError) throw e;
  }
  writeFileSync(lock, `${process.pid}\n`);
  return () => rmSync(lock, { force: true });
}

/** PGlite in `dataDir` (created when missing), or in memory when dataDir is undefined. */
export async function openPglite(dataDir?: string): Promise<Db> {
  const { PGlite } = await import('@electric-sql/pglite');
  const unlock = dataDir ? lockPglite(dataDir) : () => undefined;
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

/**
 * The ledger database for this process: DATABASE_URL when set, else the embedded PGlite under
 * the Slipway data folder.
 */
export async function openDatabase(opts: { databaseUrl?: string; dataDir: string }): Promise<Db> {
  if (opts.databaseUrl) return openPostgres(opts.databaseUrl);
  return openPglite(path.join(opts.dataDir, 'ledger'));
}

/** The ledger from the environment (DATABASE_URL, else PGlite under SLIPWAY_HOME), migrated. */
export async function openLedger(opts: { databaseUrl?: string; dataDir: string }): Promise<Db> {
  const db = await openDatabase(opts);
  try {
    await migrate(db);
  } catch (e) {
    await db.close();
    throw e;
  }
  return db;
}
