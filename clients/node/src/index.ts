import './polyfill';

export { Locker } from './locker';
export { Lease } from './lease';
export type { LeaseEvents } from './lease';
export type { LeaseOptions, AcquireOptions, WithLockOptions, LockerOptions } from './args';
export type { ConnectionFactory, LockerSource } from './source';
export { KEEPALIVE_APPLICATION_NAME } from './source';
export {
  FencedLockError,
  StaleTokenError,
  MissingTokenError,
  ModeConflictError,
  WaitTimeoutError,
  ReadOnlyError,
  NotAllowedError,
  InvalidArgumentError,
  LeaseLostError,
  UsageError,
  mapError,
  isStaleToken,
  sqlstateOf,
} from './errors';
