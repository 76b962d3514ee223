import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { inject } from 'vitest';

/** The shared test cluster's admin URL, or '' when none could start (see pg-cluster.ts). */
export function pgAvailable(): boolean {
  const url = inject('pgUrl');
  if (!url) {
    // Visible in the test output: a skipped PostgreSQL variant is never silent.
    console.warn(`[keygate tests] PostgreSQL tests skipped: ${inject('pgSkipReason') || 'no server'}`);
  }
  return Boolean(url);
}

/** Creates a fresh, empty database on the test cluster and returns its URL. */
export async function freshPgDatabase(): Promise<string> {
  const admin = inject('pgUrl');
  const name = `kg_${randomBytes(6).toString('hex')}`;
  const client = new pg.Client({ connectionString: admin });
  await client.connect();
  try {
    await client.query(`CREATE DATABASE ${name}`);
  } finally {
    await client.end();
  }
  const url = new URL(admin);
  url.pathname = `/${name}`;
  return url.toString();
}
