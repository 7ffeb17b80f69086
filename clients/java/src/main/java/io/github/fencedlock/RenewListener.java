package io.github.fencedlock;

/** Told after each renew of the keepalive that succeeded. It runs on the keepalive thread: keep it short. */
@FunctionalInterface
public interface RenewListener {
  void onRenewed(Lease lease);
}
