/** A fresh, migrated database per test file, on the run's real Postgres (or PGlite). */
import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { openPglite, openPostgres, type Db } from '../../activities/billing/db';
import { migrate } from '../../activities/billing/migrate';

export interface TestDatabase {
  db: Db;
  url: string;
  drop(): Promise<void>;
}

export async function freshPostgres(): Promise<TestDatabase> {
  const admin = inject('postgresUrl');
  if (!admin) throw new Error(inject('postgresError') || 'no test Postgres');
  const name = `slipway_t_${randomBytes(6).toString('hex')}`;
  const adminDb = openPostgres(admin, { max: 1 });
  await adminDb.exec(`CREATE DATABASE ${name}`);
  await adminDb.close();
  const url = new URL(admin);
  url.pathname = `/${name}`;
  const db = openPostgres(url.toString());
  await migrate(db);
  return {
    db,
    url: url.toString(),
    async drop() {
      await db.close();
      const again = openPostgres(admin, { max: 1 });
      await again.exec(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => undefined);
      await again.close();
    },
  };
}

export async function freshPglite(): Promise<TestDatabase> {
  const db = await openPglite();
  await migrate(db);
  return { db, url: 'pglite://memory', drop: () => db.close() };
}
