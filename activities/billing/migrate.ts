/**
 * Versioned migrations: `migrations/NNNN_name.sql`, applied in order on start, each once.
 * A transaction-scoped advisory lock serialises processes starting at the same time; a
 * checksum catches a migration edited after it was applied.
 */
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import type { Db } from './db';

export const MIGRATIONS_DIR = path.join(__dirname, 'migrations');
/** Arbitrary constant: the advisory lock key for migrations. */
const MIGRATION_LOCK = 7_247_101;

export interface Migration {
  version: number;
  name: string;
  sql: string;
  checksum: string;
}

export function loadMigrations(dir = MIGRATIONS_DIR): Migration[] {
  const files = readdirSync(dir).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort();
  return files.map((file, i) => {
    const version = Number(file.slice(0, 4));
    if (version !== i + 1) throw new Error(`migrations must be numbered 0001, 0002, ... without gaps; found ${file}`);
    const sql = readFileSync(path.join(dir, file), 'utf8');
    return { version, name: file.slice(5, -4), sql, checksum: createHash('sha256').update(sql).digest('hex') };
  });
}

/** Applies pending migrations; returns the versions applied now. */
export async function migrate(db: Db, migrations = loadMigrations()): Promise<number[]> {
  await db.exec(`CREATE TABLE IF NOT EXISTS slipway_migrations (
    version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`);
  return db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock($1)', [MIGRATION_LOCK]);
    const { rows } = await tx.query<{ version: number; checksum: string }>('SELECT version, checksum FROM slipway_migrations');
    const applied = new Map(rows.map((r) => [r.version, r.checksum]));
    const done: number[] = [];
    for (const m of migrations) {
      const seen = applied.get(m.version);
      if (seen !== undefined) {
        if (seen !== m.checksum) throw new Error(`migration ${m.version}_${m.name} changed after it was applied; add a new migration instead`);
        continue;
      }
      await tx.exec(m.sql);
      await tx.query('INSERT INTO slipway_migrations (version, name, checksum) VALUES ($1, $2, $3)', [m.version, m.name, m.checksum]);
      done.push(m.version);
    }
    const newest = Math.max(0, ...migrations.map((m) => m.version));
    const ahead = [...applied.keys()].filter((v) => v > newest);
    if (ahead.length > 0) throw new Error(`the database has migrations this Slipway does not know (${ahead.join(', ')}); upgrade Slipway`);
    return done;
  });
}
