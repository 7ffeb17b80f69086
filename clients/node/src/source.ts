import { readFileSync } from 'node:fs';
import pg from 'pg';
import type { ClientBase, ClientConfig, PoolConfig } from 'pg';
import { InvalidArgumentError, UsageError } from './errors';

/** What keepalive connections call themselves in pg_stat_activity. */
export const KEEPALIVE_APPLICATION_NAME = 'fenced_lock_keepalive';

/**
 * Opens a connected node-postgres client for the locker. `purpose` says what
 * it is for, so that a factory may name keepalive connections itself; the
 * locker closes it with `release()` when it has one (a pool's client), else
 * with `end()`.
 */
export type ConnectionFactory = (purpose: 'lease' | 'keepalive') => Promise<ClientBase>;

/** A connection string (URL or key=value), a pg.Pool, a pg client config, or a factory. */
export type LockerSource = string | pg.Pool | ClientConfig | ConnectionFactory;

/** A connection the locker holds, with what it has seen of its end. */
export interface Conn {
  readonly client: ClientBase;
  /** The connection reported an error or its end: it cannot be used again. */
  readonly dead: boolean;
  /** Called once when the connection dies while held. */
  onDead: (() => void) | null;
  /** Give it back (to its pool) or close it; with `destroy`, cut it first. Idempotent. */
  close(destroy?: boolean): Promise<void>;
}

export interface Source {
  open(purpose: 'lease' | 'keepalive', timeoutMs: number): Promise<Conn>;
  /** Keepalive connections are named with a SET after connecting (not in the startup packet). */
  readonly namesBySet: boolean;
  end(): Promise<void>;
}

type Closable = ClientBase & { release?: (err?: Error | boolean) => void; end?: () => Promise<void> };

/** Closes the socket at once: a connection that hangs does not answer a Terminate either. */
function destroySocket(client: ClientBase): void {
  // node-postgres has no public way to cut a connection; `connection.stream`
  // has been its socket since pg 7. Without it, end() below still runs.
  const stream = (client as unknown as { connection?: { stream?: { destroy?: () => void } } }).connection?.stream;
  try {
    stream?.destroy?.();
  } catch {
    /* already closed */
  }
}

async function endWithin(client: Closable, ms: number): Promise<void> {
  if (typeof client.end !== 'function') return;
  let timer: NodeJS.Timeout | undefined;
  const ended = client.end().catch(() => undefined);
  const timeout = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
  });
  const r = await Promise.race([ended, timeout]);
  clearTimeout(timer);
  if (r === 'timeout') destroySocket(client);
}

/**
 * The caller's own connection, watched while a lease uses it: closing it
 * only stops watching (the caller closes it).
 */
export function borrow(client: ClientBase): Conn {
  return wrap(client, true);
}

function wrap(client: ClientBase, borrowed = false, resetSql: string | null = null): Conn {
  let dead = false;
  let closed: Promise<void> | null = null;
  const conn: Conn = {
    client,
    get dead() {
      return dead;
    },
    onDead: null,
    close(destroy = false): Promise<void> {
      if (closed) return closed;
      closed = (async () => {
        const c = client as Closable;
        if (borrowed) {
          client.removeListener('error', onError);
          client.removeListener('end', onEnd);
          return;
        }
        if (destroy || dead) destroySocket(client);
        if (typeof c.release === 'function') {
          if (resetSql !== null && !destroy && !dead) {
            try {
              await client.query(resetSql);
            } catch {
              destroy = true;
            }
          }
          client.removeListener('error', onError);
          client.removeListener('end', onEnd);
          // A pool destroys a client given back with an error instead of
          // keeping it; a dead or cut connection must not be handed out again.
          c.release(destroy || dead ? true : undefined);
        } else {
          await endWithin(c, 2000);
          client.removeListener('error', onError);
          client.removeListener('end', onEnd);
        }
      })();
      return closed;
    },
  };
  const die = () => {
    if (dead) return;
    dead = true;
    const cb = conn.onDead;
    conn.onDead = null;
    cb?.();
  };
  // An idle node-postgres client emits 'error' when its server goes away
  // (pg_terminate_backend, a restart); with no listener that error would
  // kill the process. The connection is marked dead instead.
  const onError = () => die();
  const onEnd = () => die();
  client.on('error', onError);
  client.on('end', onEnd);
  return conn;
}

/** Resolves with what `p` gives within `ms`, else rejects; what it gives later is handed to `late`. */
function within<T>(p: Promise<T>, ms: number, what: string, late: (v: T) => void): Promise<T> {
  if (!Number.isFinite(ms)) return p;
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new Error(`${what}: no connection within ${Math.round(ms)} ms`));
    }, Math.max(1, ms));
    p.then(
      (v) => {
        clearTimeout(timer);
        if (done) late(v);
        else resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        if (!done) reject(e);
      },
    );
  });
}

async function nameKeepalive(client: ClientBase): Promise<void> {
  await client.query(`SET application_name = '${KEEPALIVE_APPLICATION_NAME}'`);
}

/** pg.Pool given by the caller: every connection comes from it and goes back to it. */
class PoolSource implements Source {
  readonly namesBySet = true;
  constructor(private readonly pool: pg.Pool, private readonly transactionPooling: boolean) {}

  async open(purpose: 'lease' | 'keepalive', timeoutMs: number): Promise<Conn> {
    const client = await within(this.pool.connect(), timeoutMs, 'pool.connect()', (c) => c.release());
    const named = purpose === 'keepalive' && !this.transactionPooling;
    // The pool's next user must not find the keepalive's name on its connection.
    const conn = wrap(client, false, named ? 'RESET application_name' : null);
    if (named) {
      try {
        await nameKeepalive(client);
      } catch (e) {
        await conn.close(true);
        throw e;
      }
    }
    return conn;
  }

  async end(): Promise<void> {
    // The caller's pool is the caller's to end.
  }
}

/** A factory given by the caller. */
class FactorySource implements Source {
  readonly namesBySet = true;
  constructor(private readonly factory: ConnectionFactory, private readonly transactionPooling: boolean) {}

  async open(purpose: 'lease' | 'keepalive', timeoutMs: number): Promise<Conn> {
    const late = (c: ClientBase) => {
      const x = c as Closable;
      if (typeof x.release === 'function') x.release();
      else void x.end?.().catch(() => undefined);
    };
    const client = await within(Promise.resolve().then(() => this.factory(purpose)), timeoutMs, 'connection factory', late);
    if (client === null || typeof client !== 'object' || typeof (client as ClientBase).query !== 'function') {
      throw new UsageError('the connection factory must return a connected node-postgres client');
    }
    const named = purpose === 'keepalive' && !this.transactionPooling;
    // A factory may hand out a pool's clients: those go back without the name.
    const conn = wrap(client, false, named ? 'RESET application_name' : null);
    if (named) {
      try {
        await nameKeepalive(client);
      } catch (e) {
        await conn.close(true);
        throw e;
      }
    }
    return conn;
  }

  async end(): Promise<void> {}
}

/**
 * A connection string or a client config: lease connections come from a pool
 * of the locker's own; keepalive connections are opened one by one and
 * closed when their lease ends, named in their startup packet (which
 * PgBouncer passes on in any pooling mode).
 */
class ConfigSource implements Source {
  readonly namesBySet = false;
  private readonly pool: pg.Pool;
  private readonly keepaliveConfig: ClientConfig;

  constructor(config: ClientConfig, poolSize: number) {
    const poolConfig: PoolConfig = {
      ...config,
      max: poolSize,
      idleTimeoutMillis: 10_000,
      // The locker's idle connections must not keep a process alive that has
      // nothing else to do.
      allowExitOnIdle: true,
    };
    this.pool = new pg.Pool(poolConfig);
    // An idle pooled connection that dies emits 'error' on the pool; the pool
    // drops it, and the next lease gets a new one.
    this.pool.on('error', () => undefined);
    this.keepaliveConfig = withApplicationName(config, KEEPALIVE_APPLICATION_NAME);
  }

  async open(purpose: 'lease' | 'keepalive', timeoutMs: number): Promise<Conn> {
    if (purpose === 'lease') {
      const client = await within(this.pool.connect(), timeoutMs, 'connect', (c) => c.release());
      return wrap(client);
    }
    const client = new pg.Client({
      ...this.keepaliveConfig,
      connectionTimeoutMillis: Math.max(1, Math.round(timeoutMs)),
      keepAlive: true,
    });
    client.on('error', () => undefined);
    await client.connect();
    return wrap(client);
  }

  async end(): Promise<void> {
    await this.pool.end();
  }
}

function withApplicationName(config: ClientConfig, name: string): ClientConfig {
  const out: ClientConfig = { ...config, application_name: name };
  if (typeof config.connectionString === 'string') {
    // Parameters of the connection string win over the config's fields in
    // node-postgres, so the name is put into the string itself.
    const url = new URL(config.connectionString);
    url.searchParams.set('application_name', name);
    out.connectionString = url.toString();
  }
  return out;
}

function isPool(x: unknown): x is pg.Pool {
  if (x instanceof pg.Pool) return true;
  // Another copy of pg (the caller's) has its own Pool class.
  const p = x as { connect?: unknown; end?: unknown; totalCount?: unknown; idleCount?: unknown } | null;
  return (
    p !== null && typeof p === 'object' && typeof p.connect === 'function' && typeof p.end === 'function' &&
    typeof p.totalCount === 'number' && typeof p.idleCount === 'number'
  );
}

export function makeSource(source: unknown, transactionPooling: boolean, poolSize: number): Source {
  if (typeof source === 'string') {
    if (source.trim().length === 0) throw new InvalidArgumentError('invalid argument "source": an empty connection string', 'source');
    return new ConfigSource(parseConnectionString(source), poolSize);
  }
  if (typeof source === 'function') return new FactorySource(source as ConnectionFactory, transactionPooling);
  if (isPool(source)) return new PoolSource(source, transactionPooling);
  if (source !== null && typeof source === 'object' && !Array.isArray(source)) {
    const c = source as { query?: unknown; connect?: unknown };
    if (typeof c.query === 'function') {
      throw new InvalidArgumentError(
        'invalid argument "source": a single client cannot serve a locker (each lease and its keepalive need connections of their own); pass a pg.Pool, a connection string or a factory, and give a client to acquire() as options.client',
        'source',
      );
    }
    const config = source as ClientConfig;
    if (config.connectionString !== undefined && typeof config.connectionString === 'string' && !isUrl(config.connectionString)) {
      const { connectionString, ...rest } = config;
      return new ConfigSource({ ...parseConnectionString(connectionString), ...rest }, poolSize);
    }
    return new ConfigSource({ ...config }, poolSize);
  }
  throw new InvalidArgumentError(
    `invalid argument "source": must be a connection string, a pg.Pool, a client config or a factory, got ${source === null ? 'null' : typeof source}`,
    'source',
  );
}

function isUrl(s: string): boolean {
  return /^postgres(ql)?:\/\//i.test(s.trim());
}

/**
 * A `postgresql://` URL (handed to node-postgres as it is) or a libpq
 * `key=value` string, turned into a client config. Unknown keywords are
 * refused, as libpq does, rather than dropped.
 */
export function parseConnectionString(s: string): ClientConfig {
  if (isUrl(s)) {
    try {
      new URL(s.trim());
    } catch {
      throw new InvalidArgumentError('invalid argument "source": not a valid postgresql:// URL', 'source');
    }
    return { connectionString: s.trim() };
  }
  const pairs = parseKeyValue(s);
  const config: ClientConfig & Record<string, unknown> = {};
  let sslmode: string | undefined;
  const ssl: { ca?: string; cert?: string; key?: string } = {};
  for (const [key, value] of pairs) {
    switch (key) {
      case 'host':
      case 'hostaddr':
        config.host = value;
        break;
      case 'port': {
        const port = Number(value);
        if (!Number.isInteger(port) || port < 1 || port > 65535) {
          throw new InvalidArgumentError(`invalid argument "source": port ${JSON.stringify(value)} is not a port number`, 'source');
        }
        config.port = port;
        break;
      }
      case 'dbname':
        config.database = value;
        break;
      case 'user':
        config.user = value;
        break;
      case 'password':
        config.password = value;
        break;
      case 'application_name':
        config.application_name = value;
        break;
      case 'fallback_application_name':
        config.fallback_application_name = value;
        break;
      case 'options':
        config.options = value;
        break;
      case 'connect_timeout': {
        const secs = Number(value);
        if (!Number.isFinite(secs) || secs < 0) {
          throw new InvalidArgumentError(`invalid argument "source": connect_timeout ${JSON.stringify(value)} is not a number of seconds`, 'source');
        }
        if (secs > 0) config.connectionTimeoutMillis = Math.round(secs * 1000);
        break;
      }
      case 'client_encoding':
        if (!/^utf-?8$/i.test(value)) {
          throw new InvalidArgumentError('invalid argument "source": node-postgres speaks UTF8 only (client_encoding)', 'source');
        }
        break;
      case 'keepalives':
        config.keepAlive = value !== '0';
        break;
      case 'keepalives_idle':
        config.keepAliveInitialDelayMillis = Number(value) * 1000;
        break;
      case 'sslmode':
        sslmode = value;
        break;
      case 'sslrootcert':
        ssl.ca = readFileSync(value, 'utf8');
        break;
      case 'sslcert':
        ssl.cert = readFileSync(value, 'utf8');
        break;
      case 'sslkey':
        ssl.key = readFileSync(value, 'utf8');
        break;
      default:
        throw new InvalidArgumentError(`invalid argument "source": unknown connection option ${JSON.stringify(key)}`, 'source');
    }
  }
  switch (sslmode) {
    case undefined:
    case 'disable':
    case 'allow':
    case 'prefer':
      // node-postgres has no "try TLS, fall back to plain": it is off unless required.
      if (ssl.ca || ssl.cert) config.ssl = { ...ssl };
      break;
    case 'require':
      config.ssl = { ...ssl, rejectUnauthorized: false };
      break;
    case 'verify-ca':
    case 'verify-full':
      config.ssl = { ...ssl, rejectUnauthorized: true };
      break;
    default:
      throw new InvalidArgumentError(`invalid argument "source": unknown sslmode ${JSON.stringify(sslmode)}`, 'source');
  }
  return config;
}

function parseKeyValue(s: string): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  let i = 0;
  const n = s.length;
  const space = (c: string) => c === ' ' || c === '\t' || c === '\n' || c === '\r';
  const bad = (why: string) => new InvalidArgumentError(`invalid argument "source": ${why} in the connection string`, 'source');
  while (true) {
    while (i < n && space(s[i]!)) i++;
    if (i >= n) break;
    let key = '';
    while (i < n && s[i] !== '=' && !space(s[i]!)) key += s[i++];
    while (i < n && space(s[i]!)) i++;
    if (s[i] !== '=' || key.length === 0) throw bad(`missing "=" after ${JSON.stringify(key)}`);
    i++;
    while (i < n && space(s[i]!)) i++;
    let value = '';
    if (s[i] === "'") {
      i++;
      let closed = false;
      while (i < n) {
        const c = s[i]!;
        if (c === '\\' && i + 1 < n) {
          value += s[i + 1];
          i += 2;
        } else if (c === "'") {
          i++;
          closed = true;
          break;
        } else {
          value += c;
          i++;
        }
      }
      if (!closed) throw bad('an unterminated quoted value');
    } else {
      while (i < n && !space(s[i]!)) {
        if (s[i] === '\\' && i + 1 < n) {
          value += s[i + 1];
          i += 2;
        } else value += s[i++];
      }
    }
    out.push([key, value]);
  }
  if (out.length === 0) throw bad('no key=value pair');
  return out;
}
