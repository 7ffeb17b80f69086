// What every test file of the suite shares: the database (one per file,
// fl_client_node_FILE, created from FL_DSN), superuser checks from the
// server's side, the example programs run as child processes, and bounded
// waits.
import { ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { createInterface } from 'node:readline';
import pg from 'pg';
import type { ClientBase } from 'pg';
import type { ConnectionFactory, Lease, LeaseLostError } from 'fenced-lock';

/**
 * This test file's database, fl_client_node_FILE (FILE: the file's name
 * without .test.js). node --test runs the files at once, each in a process
 * of its own, and several tests count the keepalive connections of their
 * database, which must all be their own file's.
 */
export const DB = `fl_client_node_${path.basename(process.argv[1] ?? 'db', '.js').replace(/\.test$/, '').replace(/[^A-Za-z0-9]/g, '_')}`;
/** A role with no EXECUTE on the extension's functions. */
export const ROLE_NOEXEC = 'fl_client_node_noexec';
/** A role that may use the functions (and so hold leases of its own). */
export const ROLE_APP = 'fl_client_node_app';

function adminDsn(): string {
  const dsn = process.env.FL_DSN;
  if (!dsn) throw new Error('FL_DSN must be a superuser postgresql:// URL of database postgres');
  return dsn;
}

/** FL_DSN pointed at another database, and optionally another user. */
export function dsnFor(database: string, user?: string): string {
  const url = new URL(adminDsn());
  url.pathname = `/${database}`;
  if (user !== undefined) {
    url.username = user;
    url.password = '';
  }
  return url.toString();
}

/** The suite's database, as the superuser. */
export const dsn = (): string => dsnFor(DB);

export async function connect(connectionString = dsn()): Promise<pg.Client> {
  const c = new pg.Client({ connectionString });
  c.on('error', () => undefined);
  await c.connect();
  return c;
}

/**
 * Creates the database, the extension, the guarded tables and the roles if
 * they are missing (test.sh drops them all at the end). Idempotent, so that
 * one test file can also be run alone.
 */
export async function ensureDatabase(): Promise<void> {
  await ensureRoles();
  const root = await connect(adminDsn());
  try {
    const r = await root.query('SELECT 1 FROM pg_database WHERE datname = $1', [DB]);
    if (r.rowCount === 0) await root.query(`CREATE DATABASE ${DB}`);
  } finally {
    await root.end();
  }
  const c = await connect();
  try {
    await c.query('CREATE EXTENSION IF NOT EXISTS fenced_lock');
    const t = await c.query("SELECT 1 FROM pg_class WHERE relname = 'fenced' AND relkind = 'r'");
    if (t.rowCount === 0) {
      // Rows are put in before the guard exists: afterwards every write needs a live token.
      await c.query(`
        CREATE TABLE inventory (item_id int PRIMARY KEY, stock int NOT NULL, fence_token bigint);
        INSERT INTO inventory SELECT g, 100, NULL FROM generate_series(1, 20) g;
        CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory
          FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inventory:{item_id}', 'fence_token');
        CREATE TABLE fenced (id int PRIMARY KEY, fence_token bigint);
        INSERT INTO fenced SELECT g, NULL FROM generate_series(1, 1000) g;
        CREATE TRIGGER fenced_fence BEFORE INSERT OR UPDATE OR DELETE ON fenced
          FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('row:{id}', 'fence_token');
      `);
      await c.query(`GRANT USAGE ON SCHEMA public TO ${ROLE_APP}`);
      await c.query(`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO ${ROLE_APP}`);
      await c.query(`GRANT SELECT, UPDATE ON inventory, fenced TO ${ROLE_APP}`);
    }
  } finally {
    await c.end();
  }
}

/** Drops every database of the suite (fl_client_node_*) and its roles. */
export async function dropDatabases(): Promise<void> {
  const root = await connect(adminDsn());
  try {
    const r = await root.query("SELECT datname FROM pg_database WHERE datname LIKE 'fl\\_client\\_node\\_%'");
    for (const row of r.rows) await root.query(`DROP DATABASE IF EXISTS ${row.datname} WITH (FORCE)`);
    for (const role of [ROLE_NOEXEC, ROLE_APP]) await root.query(`DROP ROLE IF EXISTS ${role}`);
  } finally {
    await root.end();
  }
}

/** The roles the files share (cluster-wide): created once, before the files start. */
export async function ensureRoles(): Promise<void> {
  const root = await connect(adminDsn());
  try {
    for (const role of [ROLE_NOEXEC, ROLE_APP]) {
      const x = await root.query('SELECT 1 FROM pg_roles WHERE rolname = $1', [role]);
      if (x.rowCount === 0) await root.query(`CREATE ROLE ${role} LOGIN`);
    }
  } finally {
    await root.end();
  }
}

/**
 * Sets a guarded row as the superuser, around the guard (a replica session
 * fires no ordinary triggers): resets between tests, never a test of the guard.
 */
export async function resetRow(c: ClientBase, sql: string, params: unknown[] = []): Promise<void> {
  await c.query('BEGIN');
  await c.query('SET LOCAL session_replication_role = replica');
  await c.query(sql, params);
  await c.query('COMMIT');
}

export async function validate(c: ClientBase, name: string, token: bigint): Promise<boolean> {
  const r = await c.query('SELECT fenced_lock_validate($1, $2::bigint) AS v', [name, token.toString()]);
  return r.rows[0].v === true;
}

/** The keepalive connections of this database, from pg_stat_activity. */
export async function keepalivePids(c: ClientBase): Promise<number[]> {
  const r = await c.query(
    "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'fenced_lock_keepalive' ORDER BY pid",
    [DB],
  );
  return r.rows.map((x) => x.pid as number);
}

/** Records what a lease signals, with when. */
export function watch(lease: Lease) {
  const seen = { renewed: [] as number[], lost: [] as Array<{ at: number; reason: LeaseLostError }>, errors: [] as unknown[] };
  lease.on('renewed', () => seen.renewed.push(performance.now()));
  lease.on('lost', (reason) => seen.lost.push({ at: performance.now(), reason }));
  lease.on('keepaliveError', (e) => seen.errors.push(e));
  return seen;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `check` until it returns something truthy; fails after `ms` (a bound, never a speed claim). */
export async function waitFor<T>(what: string, ms: number, check: () => Promise<T> | T, every = 25): Promise<T> {
  const until = performance.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (performance.now() > until) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(every);
  }
}

/** Lock names no other test (or earlier run) used. */
let seq = 0;
export function uniqueName(prefix: string): string {
  return `${prefix}:${process.pid}:${Date.now()}:${++seq}`;
}

let rowSeq = 0;
/** A row of `fenced` for one test: ids by test file, so that files do not share rows. */
export function rowIds(fileBase: number): () => number {
  return () => fileBase + ++rowSeq;
}

// ---- counting what is sent ----------------------------------------------

export interface Spy {
  /** Every query text sent on a spied client, in order. */
  readonly queries: string[];
  /** How many connections the factory opened. */
  opened: number;
  readonly factory: ConnectionFactory;
  /** Wraps a client so that its queries are counted. */
  watch<C extends ClientBase>(client: C): C;
  closeAll(): Promise<void>;
}

export function spy(connectionString = dsn()): Spy {
  const queries: string[] = [];
  const clients: pg.Client[] = [];
  const s: Spy = {
    queries,
    opened: 0,
    factory: async () => {
      s.opened++;
      const c = new pg.Client({ connectionString });
      c.on('error', () => undefined);
      await c.connect();
      clients.push(c);
      return s.watch(c);
    },
    watch<C extends ClientBase>(client: C): C {
      const original = client.query.bind(client) as (...a: unknown[]) => unknown;
      (client as unknown as { query: unknown }).query = (...args: unknown[]) => {
        const q = args[0];
        queries.push(typeof q === 'string' ? q : String((q as { text?: string })?.text ?? q));
        return original(...args);
      };
      return client;
    },
    async closeAll() {
      for (const c of clients) await c.end().catch(() => undefined);
    },
  };
  return s;
}

// ---- the examples as child processes ------------------------------------

const ROOT = path.resolve(__dirname, '..', '..');
const children = new Set<ChildProcess>();

export interface Event {
  event: string;
  token?: number;
  [k: string]: unknown;
  /** performance.now() when the line arrived. */
  at: number;
}

export class Example {
  readonly events: Event[] = [];
  readonly stderr: string[] = [];
  readonly exited: Promise<number | null>;
  readonly child: ChildProcess;
  #waiters: Array<() => void> = [];

  constructor(name: 'hold' | 'inventory', args: string[], env: Record<string, string> = {}) {
    this.child = spawn(process.execPath, [path.join(ROOT, 'build', 'examples', `${name}.js`), ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.add(this.child);
    createInterface({ input: this.child.stdout! }).on('line', (line) => {
      const at = performance.now();
      let parsed: Record<string, unknown>;
      try {
        parsed = JSON.parse(line);
      } catch {
        parsed = { event: 'not-json', line };
      }
      this.events.push({ ...(parsed as { event: string }), at });
      for (const w of this.#waiters.splice(0)) w();
    });
    createInterface({ input: this.child.stderr! }).on('line', (line) => this.stderr.push(line));
    this.exited = once(this.child, 'exit').then(([code]) => {
      children.delete(this.child);
      for (const w of this.#waiters.splice(0)) w();
      return code as number | null;
    });
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** The first event matching, waiting at most `ms`. */
  async next(pred: (e: Event) => boolean, ms: number, what = 'an event'): Promise<Event> {
    const until = performance.now() + ms;
    for (;;) {
      const e = this.events.find(pred);
      if (e) return e;
      if (this.child.exitCode !== null || this.child.signalCode !== null) {
        throw new Error(`example exited (${this.child.exitCode}) before ${what}; stderr:\n${this.stderr.join('\n')}`);
      }
      const left = until - performance.now();
      if (left <= 0) throw new Error(`timed out after ${ms} ms waiting for ${what}; events: ${JSON.stringify(this.events)}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.#waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  async exitCode(ms: number): Promise<number | null> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<'timeout'>((r) => {
      timer = setTimeout(() => r('timeout'), ms);
    });
    const r = await Promise.race([this.exited, timeout]);
    clearTimeout(timer);
    if (r === 'timeout') throw new Error(`example still running after ${ms} ms; events: ${JSON.stringify(this.events)}`);
    return r;
  }

  signal(sig: NodeJS.Signals): void {
    this.child.kill(sig);
  }
}

/** Kills every example still running (a stopped one is continued first, so that it dies). */
export function killChildren(): void {
  for (const c of children) {
    try {
      c.kill('SIGCONT');
      c.kill('SIGKILL');
    } catch {
      /* gone */
    }
  }
  children.clear();
}

process.on('exit', killChildren);
