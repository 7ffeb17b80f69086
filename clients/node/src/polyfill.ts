// `await using` compiled by TypeScript looks up Symbol.asyncDispose when the
// block is entered, and Lease names its method by the same symbol when the
// class is defined. Node 18.18+/20.4+ define the symbol themselves; older
// runtimes do not. Define it only when it is missing, as the registered
// symbol Node itself uses, so that every copy of this library (and any other
// library doing the same) agrees on one symbol, and never replace one that
// exists: a second, different symbol would make existing disposables
// invisible to `await using`.
const symbols = Symbol as unknown as { asyncDispose?: symbol; dispose?: symbol };
if (typeof symbols.asyncDispose !== 'symbol') {
  Object.defineProperty(Symbol, 'asyncDispose', {
    value: Symbol.for('nodejs.asyncDispose'),
    writable: false,
    enumerable: false,
    configurable: false,
  });
}
if (typeof symbols.dispose !== 'symbol') {
  Object.defineProperty(Symbol, 'dispose', {
    value: Symbol.for('nodejs.dispose'),
    writable: false,
    enumerable: false,
    configurable: false,
  });
}

export {};
