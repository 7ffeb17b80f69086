package io.github.fencedlock;

import java.sql.Connection;
import java.sql.SQLException;

/**
 * Opens a new connection for the locker: the lease's own connection (when the caller passes
 * none) and each keepalive's. The connections must log in as a role that may renew and release
 * the leases it takes (the same role, or a member of it).
 */
@FunctionalInterface
public interface ConnectionFactory {
  Connection connect() throws SQLException;
}
