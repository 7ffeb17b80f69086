// What the two conformance examples share (clients/README.md, "The
// conformance examples"): the command line, JSON lines on stdout, exit codes.
import { sqlstateOf } from 'fenced-lock';

export const EXIT_DONE = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;
export const EXIT_LOST = 3;

/** One JSON line on stdout (tokens are bigints, printed as JSON numbers). */
export function emit(event: Record<string, unknown>): void {
  const line = JSON.stringify(event, (_k, v) => (typeof v === 'bigint' ? `\u0000${v}\u0000` : v)).replace(
    /"\\u0000(\d+)\\u0000"/g,
    '$1',
  );
  // stdout is a pipe or a file here: Node writes those synchronously on
  // Linux, so a line is out before the process exits.
  process.stdout.write(line + '\n');
}

export interface Spec {
  /** Options taking a value, and whether they are required. */
  values: Record<string, boolean>;
  /** Options without a value. */
  flags: string[];
}

export class UsageExit extends Error {}

export function parseArgs(argv: string[], spec: Spec, usage: string): { values: Map<string, string>; flags: Set<string> } {
  const values = new Map<string, string>();
  const flags = new Set<string>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const eq = arg.indexOf('=');
    const key = arg.startsWith('--') && eq > 0 ? arg.slice(2, eq) : arg.startsWith('--') ? arg.slice(2) : null;
    if (key === null) fail(`unexpected argument ${JSON.stringify(arg)}`, usage);
    if (spec.flags.includes(key)) {
      if (eq > 0) fail(`--${key} takes no value`, usage);
      flags.add(key);
    } else if (key in spec.values) {
      let value: string | undefined;
      if (eq > 0) value = arg.slice(eq + 1);
      else {
        value = argv[++i];
        if (value === undefined) fail(`--${key} needs a value`, usage);
      }
      if (values.has(key)) fail(`--${key} given twice`, usage);
      values.set(key, value);
    } else {
      fail(`unknown option --${key}`, usage);
    }
  }
  for (const [key, required] of Object.entries(spec.values)) {
    if (required && !values.has(key)) fail(`--${key} is required`, usage);
  }
  return { values, flags };
}

/** A number on the command line; whether its value is acceptable is the library's to say. */
export function number(values: Map<string, string>, key: string, usage: string): number | undefined {
  const raw = values.get(key);
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n)) fail(`--${key} must be a number, got ${JSON.stringify(raw)}`, usage);
  return n;
}

export function fail(message: string, usage: string): never {
  process.stderr.write(`${message}\n${usage}\n`);
  throw new UsageExit(message);
}

/** Runs an example's main; maps what it throws to the contract's exit codes. */
export function run(main: () => Promise<number>): void {
  main().then(
    (code) => process.exit(code),
    (err: unknown) => {
      if (err instanceof UsageExit) process.exit(EXIT_USAGE);
      const sqlstate = sqlstateOf(err) ?? null;
      const message = err instanceof Error ? err.message : String(err);
      emit({ event: 'error', sqlstate, message });
      process.stderr.write(`${err instanceof Error && err.stack ? err.stack : message}\n`);
      process.exit(EXIT_FAILURE);
    },
  );
}
