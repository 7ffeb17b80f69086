"""Shared setup of the security and hostile-input tests (docs/design.md, "Security").

A test module gets its fixtures with

    from harness.security import security_fixtures
    sec, su = security_fixtures("tag")

`sec` (module scope) is a `SecurityEnv`: a database with the extension on the
shared `cluster` of tests/integration/conftest.py (its `db` fixture), or, when
that fixture is not there, on a cluster of its own (Cluster('it_security', 5510)).
It creates these LOGIN roles (cluster-wide, so prefixed and dropped afterwards):

- APP_A, APP_B: EXECUTE on every API function (force release included, so that
  its operator check is what refuses them) and SELECT on the view: two
  ordinary applications.
- MEMBER_A: a member of APP_A (INHERIT), nothing granted of its own.
- NOEXEC: may connect and use schema public, nothing else.
- OPMEMBER: member of the NOLOGIN role OPS, which the database names in
  fenced_lock.operator_role (ALTER DATABASE ... SET, by the superuser).
- TABOWNER: owns the guarded tables (schema `guarded`), may create triggers
  with fenced_lock_guard.
- WRITER: INSERT/UPDATE/DELETE/SELECT on the guarded tables, not their owner.
- EVIL: may create schemas in the database; plants hostile objects.
"""

import psycopg
import pytest
from psycopg import sql

from harness.api import FORCE_RELEASE, GUARD, LEASE_FUNCTIONS
from harness.cluster import Cluster

OWN_CLUSTER = ("it_security", 5510)

API = LEASE_FUNCTIONS + [FORCE_RELEASE]

# docs/reference.md, "SQLSTATEs": every SQLSTATE the extension may raise.
SPEC_SQLSTATES = {"FL001", "FL002", "FL003", "55P03", "22004", "22023", "42501", "39P01", "42703", "42804"}

LONG = "interval '10 minutes'"


def _lookup(request, name):
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        return None


class SecurityEnv:
    def __init__(self, cluster, dbname, tag):
        self.cluster = cluster
        self.db = dbname
        p = f"flsec_{tag}_"
        self.APP_A, self.APP_B, self.MEMBER_A = p + "app_a", p + "app_b", p + "member_a"
        self.NOEXEC, self.OPS, self.OPMEMBER = p + "noexec", p + "ops", p + "opmember"
        self.TABOWNER, self.WRITER, self.EVIL = p + "tabowner", p + "writer", p + "evil"
        self.roles = [self.APP_A, self.APP_B, self.MEMBER_A, self.NOEXEC, self.OPS,
                      self.OPMEMBER, self.TABOWNER, self.WRITER, self.EVIL]

    # -- connections ------------------------------------------------------------

    def connect(self, role="postgres", dbname=None, **kw):
        return self.cluster.connect(dbname or self.db, user=role, **kw)

    # -- setup ------------------------------------------------------------------

    def setup(self):
        self.drop_roles()
        I = sql.Identifier
        with self.connect() as su:
            for r in self.roles:
                login = "NOLOGIN" if r == self.OPS else "LOGIN"
                su.execute(sql.SQL("CREATE ROLE {} " + login).format(I(r)))
            su.execute(sql.SQL("GRANT {} TO {}").format(I(self.APP_A), I(self.MEMBER_A)))
            su.execute(sql.SQL("GRANT {} TO {}").format(I(self.OPS), I(self.OPMEMBER)))
            grantees = [self.APP_A, self.APP_B, self.OPS, self.TABOWNER, self.WRITER, self.EVIL]
            for g in grantees:
                for f in API:
                    su.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(f), I(g)))
                su.execute(sql.SQL("GRANT SELECT ON fenced_lock_leases TO {}").format(I(g)))
            for g in [self.TABOWNER, self.EVIL]:
                su.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(GUARD), I(g)))
            su.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(I(self.db), I(self.EVIL)))
            su.execute(sql.SQL("CREATE SCHEMA guarded AUTHORIZATION {}").format(I(self.TABOWNER)))
            su.execute(sql.SQL("GRANT USAGE ON SCHEMA guarded TO {}, {}").format(
                I(self.WRITER), I(self.EVIL)))
            su.execute(sql.SQL("ALTER DATABASE {} SET fenced_lock.operator_role = {}").format(
                I(self.db), sql.Literal(self.OPS)))

    def drop_roles(self):
        with self.cluster.connect() as su:
            present = {r for (r,) in su.execute(
                "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (self.roles,)).fetchall()}
            dbs = [d for (d,) in su.execute(
                "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate").fetchall()]
            owned = [d for (d,) in su.execute(
                "SELECT datname FROM pg_database WHERE datdba::regrole::text = ANY(%s)",
                (list(present),)).fetchall()]
            for d in owned:
                su.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(d)))
                dbs.remove(d)
        if not present:
            return
        for d in dbs:
            try:
                with self.cluster.connect(d) as c:
                    c.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(
                        sql.SQL(", ").join(sql.Identifier(r) for r in present)))
            except psycopg.Error:
                pass
        with self.cluster.connect() as su:
            for r in self.roles:
                su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(r)))


def security_fixtures(tag):
    """The `sec` (module scope) and `su` (a superuser connection to its
    database, per test) fixtures of a test module; `tag` keeps the roles of
    two modules apart."""

    @pytest.fixture(scope="module")
    def sec(request):
        yield from security_env(request, tag)

    @pytest.fixture
    def su(sec):
        with sec.connect() as c:
            yield c

    return sec, su


def security_env(request, tag):
    """Body of the `sec` fixture of a module: yield a ready SecurityEnv."""
    cluster = _lookup(request, "cluster")
    own = None
    if cluster is not None:
        dbname = _lookup(request, "db")
    else:
        own = Cluster(*OWN_CLUSTER).init().start()
        cluster = own
        dbname = cluster.create_database(f"it_security_{tag}")
    env = SecurityEnv(cluster, dbname, tag)
    try:
        env.setup()
        yield env
    finally:
        try:
            env.drop_roles()
        finally:
            if own is not None:
                own.stop(check=False)


# -- small helpers ---------------------------------------------------------------


def sqlstate(conn, query, params=None):
    """Run `query`; None if it succeeded, else the SQLSTATE it failed with."""
    try:
        conn.execute(query, params)
        return None
    except psycopg.Error as e:
        return e.sqlstate


def error(conn, query, params=None):
    """Run `query`, which must fail; return the psycopg error."""
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query, params)
    return info.value


def one(conn, query, params=None):
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def lease_record(su, name):
    """The stored lease record of `name` (read as superuser), or None."""
    return su.execute(
        "SELECT token, holder, owner::text, acquired_at, expires_at, ttl "
        "FROM fenced_lock_internal.granted_leases WHERE name = %s", (name,)).fetchone()


def acquire(conn, name, ttl="10 minutes", holder=None):
    return one(conn, "SELECT fenced_lock_try_acquire(%s::text, %s::interval, %s::text)",
               (name, ttl, holder))
