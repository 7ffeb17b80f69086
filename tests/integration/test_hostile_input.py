"""docs/design.md, "Security": "No function is open to search_path tricks or SQL
injection through a lock name, a holder or a template value", and
docs/reference.md, "SQLSTATEs" for every odd value: each call either works
exactly or fails with the SQLSTATE the reference names.

Run: /usr/bin/python3 -m pytest -q tests/integration/test_hostile_input.py
"""

import os
import random
import time

import psycopg
import pytest
from psycopg import sql

from harness.security import (
    SPEC_SQLSTATES,
    acquire,
    error,
    lease_record,
    one,
    security_fixtures,
    sqlstate,
)

I = sql.Identifier


sec, su = security_fixtures("hos")


@pytest.fixture(scope="module")
def victim(sec):
    """A table that injected SQL would like to drop."""
    with sec.connect() as su:
        su.execute("CREATE TABLE public.victim (x int)")
        su.execute("INSERT INTO public.victim VALUES (42)")
    yield "victim"


def victim_intact(su):
    return su.execute("SELECT x FROM public.victim").fetchall() == [(42,)]


# == search_path ================================================================

HOSTILE_FUNCTIONS = [
    # (signature, return type, value returned)
    ("nextval(regclass)", "bigint", "1"),
    ("nextval(text)", "bigint", "1"),
    ("currval(regclass)", "bigint", "1"),
    ("setval(regclass, bigint)", "bigint", "1"),
    ("setval(regclass, bigint, boolean)", "bigint", "1"),
    ("clock_timestamp()", "timestamptz", "'2000-01-01'"),
    ("now()", "timestamptz", "'2000-01-01'"),
    ("statement_timestamp()", "timestamptz", "'2000-01-01'"),
    ("transaction_timestamp()", "timestamptz", "'2000-01-01'"),
    ("hashtext(text)", "integer", "0"),
    ("hashtextextended(text, bigint)", "bigint", "0"),
    ("octet_length(text)", "integer", "1"),
    ("length(text)", "integer", "1"),
    ("lower(text)", "text", "'x'"),
    ("upper(text)", "text", "'x'"),
    ('"coalesce"(interval, interval)', "interval", "'1000 years'"),
    ('"coalesce"(bigint, bigint)', "bigint", "1"),
    ("pg_advisory_xact_lock(integer, integer)", "void", None),
    ("pg_advisory_xact_lock_shared(integer, integer)", "void", None),
    ("pg_try_advisory_xact_lock(integer, integer)", "boolean", "true"),
    ("may_see(regrole)", "boolean", "true"),
    ("pg_has_role(name, name, text)", "boolean", "true"),
    ("has_table_privilege(text, text)", "boolean", "true"),
    ("texteq(text, text)", "boolean", "true"),
    ("int8eq(bigint, bigint)", "boolean", "true"),
    ("set_config(text, text, boolean)", "text", "'x'"),
    ("current_setting(text)", "text", "'x'"),
    ("quote_literal(text)", "text", "'x'"),
    ("format(text, text)", "text", "'x'"),
]

# (operator, left type, right type, returns, value): every answer is wrong on purpose
HOSTILE_OPERATORS = [
    ("=", "text", "text", "boolean", "true"),
    ("<>", "text", "text", "boolean", "false"),
    ("=", "bigint", "bigint", "boolean", "true"),
    ("<>", "bigint", "bigint", "boolean", "false"),
    ("<", "bigint", "bigint", "boolean", "true"),
    (">", "bigint", "bigint", "boolean", "true"),
    ("<=", "bigint", "bigint", "boolean", "true"),
    (">=", "bigint", "bigint", "boolean", "true"),
    ("=", "timestamptz", "timestamptz", "boolean", "true"),
    ("<", "timestamptz", "timestamptz", "boolean", "true"),
    (">", "timestamptz", "timestamptz", "boolean", "true"),
    ("<=", "timestamptz", "timestamptz", "boolean", "true"),
    (">=", "timestamptz", "timestamptz", "boolean", "true"),
    ("+", "timestamptz", "interval", "timestamptz", "'2999-01-01'"),
    ("-", "timestamptz", "interval", "timestamptz", "'1999-01-01'"),
    ("=", "interval", "interval", "boolean", "true"),
    ("||", "text", "text", "text", "'x'"),
    ("=", "oid", "oid", "boolean", "true"),
]

# composite types named like the catalog types the extension uses
HOSTILE_TYPES = ["text", "int8", "int4", "regrole", "regclass", "timestamptz", "oid"]


def literal(text):
    return "'" + text.replace("'", "''") + "'"


def hostile_schema_ddl(schema, log_fn):
    """DDL planting every hostile object in `schema`; each logs through `log_fn`."""
    out = []
    for sig, ret, val in HOSTILE_FUNCTIONS:
        body = f"PERFORM {log_fn}({literal(sig)}); "
        body += "RETURN;" if val is None else f"RETURN {val};"
        out.append(f"CREATE FUNCTION {schema}.{sig} RETURNS {ret} LANGUAGE plpgsql AS $f$ BEGIN {body} END $f$")
    for i, (op, left, right, ret, val) in enumerate(HOSTILE_OPERATORS):
        fn = f"{schema}.op_{i}"
        what = literal(f"operator {op}({left}, {right})")
        out.append(f"CREATE FUNCTION {fn}(a {left}, b {right}) RETURNS {ret} LANGUAGE plpgsql AS "
                   f"$f$ BEGIN PERFORM {log_fn}({what}); RETURN {val}; END $f$")
        out.append(f"CREATE OPERATOR {schema}.{op} (leftarg = {left}, rightarg = {right}, function = {fn})")
    return out


@pytest.fixture(scope="module")
def evil(sec):
    """EVIL's schema `evil`: hostile functions, operators, types and look-alike
    tables; every hostile function records its call in evil.calls (and raises
    a NOTICE). The guarded table guarded.sp ('sp:{id}') is writable by EVIL."""
    with sec.connect(sec.EVIL) as e:
        e.execute("CREATE SCHEMA evil")
        e.execute("GRANT USAGE ON SCHEMA evil TO PUBLIC")
        e.execute("CREATE TABLE evil.calls (fn text, as_user text, at timestamptz DEFAULT clock_timestamp())")
        e.execute("GRANT SELECT, INSERT ON evil.calls TO PUBLIC")
        e.execute("CREATE FUNCTION evil.hit(fn text) RETURNS void LANGUAGE plpgsql AS $f$ BEGIN "
                  "RAISE NOTICE 'HOSTILE % called as %', fn, current_user; "
                  "INSERT INTO evil.calls (fn, as_user) VALUES (fn, current_user); END $f$")
        for ddl in hostile_schema_ddl("evil", "evil.hit"):
            e.execute(ddl)
        e.execute("CREATE TABLE evil.leases (name text, token bigint, holder text, owner oid, "
                  "acquired_at timestamptz, expires_at timestamptz, ttl interval)")
        e.execute("INSERT INTO evil.leases SELECT 'sp:' || g, 1, 'h', 0, now(), now() + '1 day', '1 day' "
                  "FROM generate_series(0, 200) g")
        e.execute("CREATE SEQUENCE evil.token_seq START 900000000000")
        e.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON evil.leases TO PUBLIC")
        e.execute("GRANT ALL ON SEQUENCE evil.token_seq TO PUBLIC")
        for t in HOSTILE_TYPES:
            e.execute(f"CREATE TYPE evil.{t} AS (hostile int)")
    with sec.connect(sec.TABOWNER) as o:
        o.execute("CREATE TABLE guarded.sp (id int PRIMARY KEY, qty int, fence_token bigint)")
        o.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.sp "
                  "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard('sp:{id}')")
        o.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON guarded.sp TO {}").format(I(sec.EVIL)))
    with sec.connect(sec.APP_A) as a:  # a lease EVIL must not see the token of
        foreign = acquire(a, "sp:foreign", holder="secret")
    yield foreign


TEMP_OBJECTS = [
    "CREATE TEMP TABLE leases (name text, token bigint, holder text, owner oid, "
    "acquired_at timestamptz, expires_at timestamptz, ttl interval)",
    "INSERT INTO leases SELECT 'sp:' || g, 1, 'h', 0, now(), now() + '1 day', '1 day' FROM generate_series(0, 200) g",
    "CREATE TEMP SEQUENCE token_seq START 800000000000",
    "CREATE TEMP TABLE fenced_lock_internal (x int)",
] + hostile_schema_ddl("pg_temp", "evil.hit")

SEARCH_PATHS = [
    "evil, public, pg_catalog",
    "evil, pg_catalog, public",
    "pg_temp, evil, public, pg_catalog",
    "evil, pg_temp, public",
    '"$user", evil, public, pg_catalog',
]


def run_every_function(c, role, name, row_id, foreign, floor):
    """Use every function, the guard and the view on `name` in connection `c`
    (whose search_path is hostile); check each answer. No casts or operators
    of our own here: they would resolve in the hostile schema too."""
    t = one(c, "SELECT fenced_lock_try_acquire(%s, '10 minutes', 'h')", (name,))
    assert floor < t < 800000000000
    assert one(c, "SELECT fenced_lock_try_acquire(%s, '10 minutes', 'h')", (name,)) == t
    assert one(c, "SELECT fenced_lock_try_acquire(%s, '10 minutes', 'someone else')", (name,)) is None
    assert one(c, "SELECT fenced_lock_validate(%s, %s)", (name, t)) is True
    assert one(c, "SELECT fenced_lock_validate(%s, %s)", (name, t + 1000)) is False
    c.execute("SELECT fenced_lock_assert(%s, %s)", (name, t))
    assert sqlstate(c, "SELECT fenced_lock_assert(%s, %s)", (name, t + 1000)) == "FL001"
    assert one(c, "SELECT fenced_lock_renew(%s, %s, '20 minutes')", (name, t)) is True
    assert one(c, "SELECT fenced_lock_renew(%s, %s)", (name, t + 1000)) is False
    assert sqlstate(c, "SELECT fenced_lock_renew(%s, %s, '2 days')", (name, t)) == "22023"
    # the guard
    c.execute("INSERT INTO guarded.sp VALUES (%s, 1, %s)", (row_id, t))
    assert sqlstate(c, "UPDATE guarded.sp SET qty = 2, fence_token = %s WHERE id OPERATOR(pg_catalog.=) %s",
                    (t + 1000, row_id)) == "FL001"
    assert sqlstate(c, "INSERT INTO guarded.sp VALUES (%s, 1, NULL)", (row_id + 100000,)) == "FL002"
    assert sqlstate(c, "DELETE FROM guarded.sp WHERE id OPERATOR(pg_catalog.=) %s", (row_id,)) == "FL002"
    # the view
    view = {r[0]: r[1:] for r in c.execute(
        "SELECT name, token, holder, live FROM public.fenced_lock_leases").fetchall()}
    assert view[name] == (t, "h", True)
    if role != "postgres":
        assert view["sp:foreign"] == (None, None, True)
    else:
        assert view["sp:foreign"] == (foreign, "secret", True)
    # delete under an assert, release, wait-acquire, force release
    c.execute("BEGIN")
    c.execute("SELECT fenced_lock_assert(%s, %s)", (name, t))
    c.execute("DELETE FROM guarded.sp WHERE id OPERATOR(pg_catalog.=) %s", (row_id,))
    c.execute("COMMIT")
    assert one(c, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True
    assert one(c, "SELECT fenced_lock_release(%s, %s)", (name, t)) is False
    t2 = one(c, "SELECT fenced_lock_acquire(%s, '10 minutes', '1 second')", (name,))
    assert t2 > t
    if role == "postgres":
        assert one(c, "SELECT fenced_lock_force_release(%s)", (name,)) is True
    else:
        assert sqlstate(c, "SELECT fenced_lock_force_release(%s)", (name,)) == "42501"
        assert one(c, "SELECT fenced_lock_release(%s, %s)", (name, t2)) is True
    return t, t2


@pytest.mark.parametrize("path", SEARCH_PATHS)
@pytest.mark.parametrize("who", ["evil", "superuser"])
def test_hostile_search_path_objects_are_never_called(sec, su, evil, path, who):
    role = sec.EVIL if who == "evil" else "postgres"
    row_id = SEARCH_PATHS.index(path) * 10 + (who == "superuser")
    name = f"sp:{row_id}"
    evil_rows = one(su, "SELECT count(*) FROM evil.leases")
    evil_seq = one(su, "SELECT last_value FROM evil.token_seq")
    floor = one(su, "SELECT last_value FROM fenced_lock_internal.token_seq")
    notices = []
    with sec.connect(role) as c:  # a fresh backend: the extension plans its SQL under this path
        c.add_notice_handler(lambda d: notices.append(d.message_primary))
        if "pg_temp" in path:
            for ddl in TEMP_OBJECTS:
                c.execute(ddl)
        c.execute(f"SET search_path = {path}")
        run_every_function(c, role, name, row_id, evil, floor)
    assert one(su, "SELECT count(*) FROM evil.calls") == 0, su.execute("SELECT * FROM evil.calls").fetchall()
    assert [n for n in notices if "HOSTILE" in n] == []
    assert one(su, "SELECT count(*) FROM evil.leases") == evil_rows
    assert one(su, "SELECT last_value FROM evil.token_seq") == evil_seq
    assert lease_record(su, name) is None


def test_hostile_objects_would_have_been_noticed(sec, su, evil):
    """The trap works: a query that does use the shadowed operator is logged."""
    with sec.connect(sec.EVIL) as c:
        c.execute("SET search_path = evil, public, pg_catalog")
        assert one(c, "SELECT 'a'::pg_catalog.text = 'b'::pg_catalog.text") is True
    try:
        assert one(su, "SELECT count(*) FROM evil.calls") == 1
    finally:
        su.execute("DELETE FROM evil.calls")


# == injection through values ===================================================

HOSTILE_STRINGS = [
    "'; DROP TABLE victim; --",
    '"; DROP TABLE victim; --',
    "x' OR '1'='1",
    "$$; DROP TABLE victim; $$",
    "$f$ $$ $_$",
    "back\\slash \\\\ \\' \\n \\x41 \\0",
    "E'\\x41'",
    "%s %d %n %x %% %",
    "{id}",
    "{k}",
    "{{",
    "}}",
    "{",
    "}",
    "{{k}}",
    "line1\nline2\r\n\ttab",
    "".join(chr(c) for c in range(1, 32)) + "\x7f",
    "ünïcødé ✓ 日本語 🔒",
    "\u202e reversed \u200b zero width \ufeff",
    " leading and trailing spaces ",
    "NULL",
    "null",
    "DEFAULT",
    "a" * 512,
    "é" * 256,
    "名" * 170 + "ab",
    "🔒" * 128,
    ";" * 100 + "--" * 100,
]


@pytest.mark.parametrize("name", HOSTILE_STRINGS, ids=range(len(HOSTILE_STRINGS)))
def test_hostile_lock_names_are_kept_byte_for_byte(sec, su, victim, name):
    assert len(name.encode()) <= 512
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, name, holder=name)
        assert t is not None
        assert acquire(a, name, holder=name) == t
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (name, t)) is True
        a.execute("SELECT fenced_lock_assert(%s, %s)", (name, t))
        assert one(a, "SELECT fenced_lock_renew(%s, %s)", (name, t)) is True
        rows = [r for r in a.execute("SELECT name, token, holder FROM fenced_lock_leases").fetchall()
                if r[0] == name]
        assert rows == [(name, t, name)]
        stored = su.execute("SELECT convert_to(name, 'UTF8'), convert_to(holder, 'UTF8') "
                            "FROM fenced_lock_internal.granted_leases WHERE name = %s", (name,)).fetchall()
        assert stored == [(name.encode(), name.encode())]
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True
    assert lease_record(su, name) is None
    assert victim_intact(su)


def test_names_differing_only_in_invisible_ways_are_different_locks(sec, su):
    names = ["same", "same ", " same", "Same", "same\n", "same\t", "sam\u0065\u0301", "samé", "same\u200b"]
    with sec.connect(sec.APP_A) as a:
        tokens = [acquire(a, n) for n in names]
        assert None not in tokens and len(set(tokens)) == len(names)
        for n, t in zip(names, tokens):
            assert one(a, "SELECT fenced_lock_release(%s, %s)", (n, t)) is True


def test_holders_are_matched_byte_for_byte(sec, su):
    name = "hostile:holder"
    with sec.connect(sec.APP_A) as a:
        for h in HOSTILE_STRINGS:
            t = acquire(a, name, holder=h)
            assert t is not None
            assert acquire(a, name, holder=h) == t  # retry-safe acquire
            near = [h[:-1] or "x", h[:-1] + ("y" if h.endswith("x") else "x")]
            if len(h.encode()) < 512:
                near.append(h + " ")
            for other in near:  # one byte off is another holder
                assert acquire(a, name, holder=other) is None, other
            assert one(a, "SELECT holder FROM fenced_lock_leases WHERE name = %s", (name,)) == h
            assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True
        t = acquire(a, name, holder="")  # the empty holder is a holder
        assert acquire(a, name, holder="") == t
        assert acquire(a, name) is None  # NULL never matches
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True


@pytest.fixture(scope="module")
def template_tables(sec):
    """guarded.tv guarded by 'tv:{k}', guarded.tb by 'b{{x}}:{k}' (literal braces)."""
    with sec.connect(sec.TABOWNER) as o:
        for t, template in [("tv", "tv:{k}"), ("tb", "b{{x}}:{k}")]:
            o.execute(sql.SQL("CREATE TABLE guarded.{} (k text PRIMARY KEY, v int, fence_token bigint)").format(I(t)))
            o.execute(sql.SQL("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.{} "
                              "FOR EACH ROW EXECUTE FUNCTION public.fenced_lock_guard({})").format(
                I(t), sql.Literal(template)))
            o.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON guarded.{} TO {}").format(I(t), I(sec.WRITER)))
    return {"tv": "tv:", "tb": "b{x}:"}


@pytest.mark.parametrize("value", [s for s in HOSTILE_STRINGS if len(s.encode()) <= 505],
                         ids=range(len([s for s in HOSTILE_STRINGS if len(s.encode()) <= 505])))
@pytest.mark.parametrize("table", ["tv", "tb"])
def test_template_values_name_the_lock_exactly(sec, su, victim, template_tables, table, value):
    name = template_tables[table] + value
    t = I(table)
    with sec.connect(sec.WRITER) as w:
        tok = acquire(w, name)
        other = acquire(w, name + "x")  # a live lease of a neighbouring name
        assert sqlstate(w, sql.SQL("INSERT INTO guarded.{} VALUES (%s, 1, %s)").format(t), (value, other)) == "FL001"
        w.execute(sql.SQL("INSERT INTO guarded.{} VALUES (%s, 1, %s)").format(t), (value, tok))
        w.execute(sql.SQL("UPDATE guarded.{} SET v = 2 WHERE k = %s").format(t), (value,))
        assert sqlstate(w, sql.SQL("DELETE FROM guarded.{} WHERE k = %s").format(t), (value,)) == "FL002"
        w.execute("BEGIN")
        w.execute("SELECT fenced_lock_assert(%s, %s)", (name, tok))
        w.execute(sql.SQL("DELETE FROM guarded.{} WHERE k = %s").format(t), (value,))
        w.execute("COMMIT")
        assert one(w, "SELECT fenced_lock_release(%s, %s)", (name, tok)) is True
        assert one(w, "SELECT fenced_lock_release(%s, %s)", (name + "x", other)) is True
    assert one(su, sql.SQL("SELECT count(*) FROM guarded.{}").format(t)) == 0
    assert victim_intact(su)


@pytest.mark.parametrize("value,code", [
    ("x" * 509, None),         # 'tv:' + 509 = 512 bytes
    ("x" * 510, "22023"),      # 513 bytes
    ("名" * 169 + "ab", None),  # 3 + 507 + 2 = 512
    ("名" * 170, "22023"),      # 3 + 510 = 513
    ("", None),                # 'tv:' alone is a fine name
])
def test_template_value_that_makes_the_name_too_long_is_refused(sec, su, template_tables, value, code):
    name = "tv:" + value
    with sec.connect(sec.WRITER) as w:
        tok = acquire(w, name) if code is None else 1
        assert sqlstate(w, "INSERT INTO guarded.tv VALUES (%s, 1, %s)", (value, tok)) == code
        if code is None:
            w.execute("BEGIN")
            w.execute("SELECT fenced_lock_assert(%s, %s)", (name, tok))
            w.execute("DELETE FROM guarded.tv")
            w.execute("COMMIT")
            assert one(w, "SELECT fenced_lock_release(%s, %s)", (name, tok)) is True
    assert one(su, "SELECT count(*) FROM guarded.tv") == 0


def test_template_column_names_with_quotes_and_spaces_are_matched_exactly(sec, su):
    with sec.connect(sec.TABOWNER) as o:
        o.execute('CREATE TABLE guarded.odd ("o\'rly ""x""" text PRIMARY KEY, "tok\'en ""t""" bigint)')
        o.execute("CREATE TRIGGER fence BEFORE INSERT OR UPDATE OR DELETE ON guarded.odd FOR EACH ROW "
                  "EXECUTE FUNCTION public.fenced_lock_guard('odd:{o''rly \"x\"}', 'tok''en \"t\"')")
        tok = acquire(o, "odd:v'1")
        assert sqlstate(o, "INSERT INTO guarded.odd VALUES (%s, NULL)", ("v'1",)) == "FL002"
        assert sqlstate(o, "INSERT INTO guarded.odd VALUES (%s, %s)", ("v'1", tok + 1000)) == "FL001"
        o.execute("INSERT INTO guarded.odd VALUES (%s, %s)", ("v'1", tok))
    assert one(su, "SELECT count(*) FROM guarded.odd") == 1


def test_error_messages_quote_hostile_names_literally(sec):
    name = "%s%n%x%p %d\nnext line 'quoted' \"double\""
    with sec.connect(sec.APP_A) as a:
        e = error(a, "SELECT fenced_lock_assert(%s, %s)", (name, 12345))
        assert e.sqlstate == "FL001"
        assert f'"{name}"' in e.diag.message_primary
        assert "12345" in e.diag.message_primary
        huge = "%n" * 500_000
        for q, params in [("SELECT fenced_lock_try_acquire(%s)", (huge,)),
                          ("SELECT fenced_lock_validate(%s, 1)", (huge,)),
                          ("SELECT fenced_lock_try_acquire('hostile:huge-holder', '1 minute', %s)", (huge,))]:
            e = error(a, q, params)
            assert e.sqlstate == "22023"
            assert len(e.diag.message_primary) < 400  # never echoes a megabyte back
        assert a.execute("SELECT 1").fetchone() == (1,)


# == limits and extremes ========================================================

# (call, its SQLSTATE for a valid name that this very session holds without a
# holder: an acquire would wait for its own lease, FL003)
NAME_CALLS = [
    ("SELECT fenced_lock_try_acquire(%s, '1 minute')", None),
    ("SELECT fenced_lock_acquire(%s, '1 minute', '0')", "FL003"),
    ("SELECT fenced_lock_renew(%s, 1)", None),
    ("SELECT fenced_lock_release(%s, 1)", None),
    ("SELECT fenced_lock_validate(%s, 1)", None),
    ("SELECT fenced_lock_assert(%s, 1)", "FL001"),
    ("SELECT fenced_lock_force_release(%s)", None),
]


@pytest.mark.parametrize("name,ok", [
    ("a" * 512, True),
    ("a" * 513, False),
    ("é" * 256, True),                # 512 bytes of 2-byte characters
    ("é" * 256 + "a", False),
    ("名" * 170 + "ab", True),         # 510 + 2 = 512 bytes
    ("名" * 171, False),               # 513 bytes, 171 characters
    ("名" * 170 + "a" * 3, False),
    ("🔒" * 128, True),
    ("🔒" * 128 + "a", False),
    ("", False),
], ids=["512_ascii", "513_ascii", "256x2byte", "256x2byte+1", "170x3byte+2", "171x3byte",
        "170x3byte+3", "128x4byte", "128x4byte+1", "empty"])
def test_lock_name_is_at_most_512_bytes_for_every_function(sec, su, name, ok):
    with sec.connect() as c:
        for q, ok_code in NAME_CALLS:
            assert sqlstate(c, q, (name,)) == (ok_code if ok else "22023"), q
            if ok and "try_acquire" in q:
                assert one(su, "SELECT convert_to(name, 'UTF8') FROM fenced_lock_internal.granted_leases "
                               "WHERE name = %s", (name,)) == name.encode()
        assert lease_record(su, name) is None  # force released, or never taken


def test_null_arguments_are_22004(sec):
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, "hostile:nulls")
        for q in ["SELECT fenced_lock_try_acquire(NULL)",
                  "SELECT fenced_lock_try_acquire('hostile:nulls', NULL)",
                  "SELECT fenced_lock_acquire(NULL, '1 minute', '0')",
                  "SELECT fenced_lock_acquire('hostile:nulls2', NULL, '0')",
                  "SELECT fenced_lock_renew(NULL, 1)",
                  "SELECT fenced_lock_renew('hostile:nulls', NULL)",
                  "SELECT fenced_lock_release(NULL, 1)",
                  "SELECT fenced_lock_release('hostile:nulls', NULL)",
                  "SELECT fenced_lock_validate(NULL, 1)",
                  "SELECT fenced_lock_validate('hostile:nulls', NULL)",
                  "SELECT fenced_lock_assert(NULL, 1)",
                  "SELECT fenced_lock_assert('hostile:nulls', NULL)",
                  "SELECT fenced_lock_force_release(NULL)"]:
            assert sqlstate(a, q) == "22004", q
        # NULL holder, wait and renew ttl are allowed
        assert one(a, "SELECT fenced_lock_renew('hostile:nulls', %s, NULL)", (t,)) is True
        assert one(a, "SELECT fenced_lock_release('hostile:nulls', %s)", (t,)) is True
        t = one(a, "SELECT fenced_lock_acquire('hostile:nulls', '1 minute', NULL, NULL)")
        assert one(a, "SELECT fenced_lock_release('hostile:nulls', %s)", (t,)) is True
    with sec.connect() as c:
        assert sqlstate(c, "SELECT fenced_lock_force_release(NULL)") == "22004"
        assert sqlstate(c, "SELECT fenced_lock_force_release('hostile:nulls')") is None


def test_holder_is_at_most_512_bytes(sec):
    with sec.connect(sec.APP_A) as a:
        for holder, ok in [("h" * 512, True), ("h" * 513, False), ("名" * 170 + "ab", True),
                           ("名" * 171, False), ("", True)]:
            q = "SELECT fenced_lock_try_acquire('hostile:holder-limit', '1 minute', %s)"
            if ok:
                t = one(a, q, (holder,))
                assert one(a, "SELECT fenced_lock_release('hostile:holder-limit', %s)", (t,)) is True
            else:
                assert sqlstate(a, q, (holder,)) == "22023"
                assert sqlstate(a, "SELECT fenced_lock_acquire('hostile:holder-limit', '1 minute', '0', %s)",
                                (holder,)) == "22023"


TTLS = [
    # (interval, accepted with the default fenced_lock.max_ttl of 1 day)
    ("1 microsecond", True),
    ("1 day", True),
    ("1 mon -29 days", True),          # 30 - 29 = 1 day
    ("-1 mon 31 days", True),          # -30 + 31 = 1 day
    ("-1 mon 30 days 1 second", True),
    ("23:59:59.999999", True),
    ("1 day 1 microsecond", False),
    ("1 mon -29 days 1 microsecond", False),
    ("1 mon", False),
    ("86401 seconds", False),
    ("178000000 years", False),
    ("-178000000 years", False),
    ("2147483647 days", False),
    ("-2147483648 days 2147483647 mons", False),
    ("0", False),
    ("-1 microsecond", False),
    ("1 day -86400 seconds", False),
    ("1 mon -30 days", False),
    ("-1 mon", False),
]


@pytest.mark.parametrize("ttl,ok", TTLS, ids=[t for t, _ in TTLS])
def test_ttl_extremes_are_granted_or_refused_with_22023(sec, su, ttl, ok):
    name = "hostile:ttl:" + ttl
    with sec.connect(sec.APP_A) as a:
        for q in ["SELECT fenced_lock_try_acquire(%s, %s::interval)",
                  "SELECT fenced_lock_acquire(%s, %s::interval, '1 second')"]:
            code = sqlstate(a, q, (name, ttl))
            if ok:
                assert code is None, q
                rec = lease_record(su, name)
                assert rec is not None and rec[0] > 0
                live = one(a, "SELECT fenced_lock_validate(%s, %s)", (name, rec[0]))
                assert live is (ttl != "1 microsecond")
                one(a, "SELECT fenced_lock_release(%s, %s)", (name, rec[0]))
            else:
                assert code == "22023", q
                assert lease_record(su, name) is None
        # renew checks its ttl the same way
        t = acquire(a, name)
        code = sqlstate(a, "SELECT fenced_lock_renew(%s, %s, %s::interval)", (name, t, ttl))
        assert code == (None if ok else "22023")
        one(a, "SELECT fenced_lock_release(%s, %s)", (name, t))


def test_one_microsecond_lease_is_taken_over_at_once(sec, su):
    name = "hostile:1us"
    with sec.connect(sec.APP_A) as a:
        t1 = one(a, "SELECT fenced_lock_try_acquire(%s, '1 microsecond', 'w')", (name,))
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (name, t1)) is False
        assert one(a, "SELECT fenced_lock_renew(%s, %s)", (name, t1)) is False  # never revived
        assert one(a, "SELECT live FROM fenced_lock_leases WHERE name = %s", (name,)) is False
    with sec.connect(sec.APP_B) as b:
        t2 = acquire(b, name, holder="w")
        assert t2 > t1
        assert one(b, "SELECT fenced_lock_release(%s, %s)", (name, t2)) is True


@pytest.mark.parametrize("wait,code", [
    ("-1 microsecond", "22023"),
    ("-178000000 years", "22023"),
    ("1 mon -31 days", "22023"),
    ("0", None),
    ("178000000 years", None),
    ("-1 mon 31 days", None),
])
def test_wait_extremes_on_a_free_lock(sec, su, wait, code):
    name = "hostile:wait:" + wait
    with sec.connect(sec.APP_A) as a:
        assert sqlstate(a, "SELECT fenced_lock_acquire(%s, '1 minute', %s::interval)", (name, wait)) == code
        rec = lease_record(su, name)
        assert (rec is not None) == (code is None)
        if rec:
            assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, rec[0])) is True


def test_zero_wait_on_a_held_lock_is_55P03(sec, su):
    name = "hostile:wait-busy"
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, name)
    with sec.connect(sec.APP_B) as b:
        for wait in ["0", "1 microsecond"]:
            assert sqlstate(b, "SELECT fenced_lock_acquire(%s, '1 minute', %s::interval)", (name, wait)) == "55P03"
    assert lease_record(su, name)[0] == t


def test_tokens_of_zero_or_less_are_22023_and_the_largest_is_simply_not_live(sec, su):
    name = "hostile:tokens"
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, name)
        for bad in [0, -1, -9223372036854775808]:
            for q in ["SELECT fenced_lock_renew(%s, %s)", "SELECT fenced_lock_release(%s, %s)",
                      "SELECT fenced_lock_validate(%s, %s)", "SELECT fenced_lock_assert(%s, %s)"]:
                assert sqlstate(a, q, (name, bad)) == "22023", (q, bad)
        top = 9223372036854775807
        assert one(a, "SELECT fenced_lock_renew(%s, %s)", (name, top)) is False
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, top)) is False
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (name, top)) is False
        e = error(a, "SELECT fenced_lock_assert(%s, %s)", (name, top))
        assert e.sqlstate == "FL001" and str(top) in e.diag.message_primary and str(t) in e.diag.message_primary
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (name, t)) is True
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True


@pytest.mark.parametrize("query,code", [
    ("SELECT fenced_lock_release('x', 'abc')", "22P02"),
    ("SELECT fenced_lock_release('x', '9223372036854775808')", "22003"),
    ("SELECT fenced_lock_release('x', 'abc'::text)", "42883"),
    ("SELECT fenced_lock_release('x', 1.5)", "42883"),
    ("SELECT fenced_lock_release('x', 9223372036854775808)", "42883"),
    ("SELECT fenced_lock_try_acquire('x', 'forever')", "22007"),
    ("SELECT fenced_lock_try_acquire('x', 30)", "42883"),
    ("SELECT fenced_lock_try_acquire(42)", "42883"),
    ("SELECT fenced_lock_try_acquire('x', '30 seconds', 42)", "42883"),
    ("SELECT fenced_lock_acquire('x', '1 minute', 'soon')", "22007"),
    ("SELECT fenced_lock_validate('x', 1, 2)", "42883"),
    ("SELECT fenced_lock_validate('x'::bytea, 1)", "42883"),
])
def test_wrong_argument_types_are_refused_by_postgresql(sec, query, code):
    with sec.connect(sec.APP_A) as a:
        assert sqlstate(a, query) == code


# == randomized: every answer is consistent, every error is a documented one =====

def random_text(rng):
    alphabet = ["a", "b", "Z", "0", " ", "'", '"', "\\", "%", "{", "}", ";", "-", "\n", "\t", "\x01", "\x1f",
                "é", "ß", "名", "🔒", "\u202e", "$"]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))


class Model:
    """What the lease table must look like, as far as the test can know it."""

    def __init__(self, roles):
        self.live = {}  # name -> (token, holder, owner)
        self.tokens = []
        self.roles = roles

    def acts_for(self, role, owner):
        return role == owner or (role == self.roles["member_a"] and owner == self.roles["app_a"])


def test_random_calls_keep_a_consistent_state_and_raise_only_spec_sqlstates(sec, su):
    seed = int(os.environ.get("FL_SEED", "20240607"))
    rng = random.Random(seed)
    roles = {"app_a": sec.APP_A, "app_b": sec.APP_B, "member_a": sec.MEMBER_A}
    conns = {r: sec.connect(r) for r in roles.values()}
    conns["postgres"] = sec.connect()
    model = Model(roles)
    names = [f"prop:{i}:" + random_text(rng) for i in range(8)] + [
        "prop:" + "n" * 507,  # 512 bytes
        "prop:" + "n" * 508,  # 513 bytes
        "",
    ]
    holders = [None, "w1", "w2", "", "it's", "%s", "h" * 513, "名" * 171]
    ttls = {  # ttl -> True (long), False (expires at once), None (refused)
        "10 minutes": True, "1 day": True, "-1 mon 31 days": True, "1 hour 1 microsecond": True,
        "1 microsecond": False, "3 microseconds": False,
        "0": None, "-1 microsecond": None, "1 day 1 microsecond": None, "178000000 years": None, "1 mon": None,
    }
    edge_tokens = [0, -1, -9223372036854775808, 9223372036854775807, None]
    counts = {}
    outcomes = {}  # SQLSTATE (or None) -> how often

    def bad_name(n):
        return n is None or n == "" or len(n.encode()) > 512

    def expect_error(code, name, token=(), ttl=(), holder=None, ttl_required=False):
        """The SQLSTATE the reference dictates for these arguments, or None."""
        if name is None:
            return "22004"
        if bad_name(name):
            return "22023"
        if token != ():
            if token is None:
                return "22004"
            if token <= 0:
                return "22023"
        if ttl != ():
            if ttl is None and ttl_required:
                return "22004"
            if ttl is not None and ttls[ttl] is None:
                return "22023"
        if holder is not None and len(holder.encode()) > 512:
            return "22023"
        return None

    def call(conn, q, params):
        try:
            return None, one(conn, q, params)
        except psycopg.Error as e:
            return e.sqlstate, None

    try:
        for step in range(600):
            op = rng.choice(["try", "try", "acquire", "renew", "release", "validate", "assert", "force", "view"])
            role = rng.choice(list(roles.values()))
            c = conns[role]
            name = rng.choice(names) if rng.random() < 0.95 else rng.choice([None, "prop:r:" + random_text(rng)])
            live = model.live.get(name)
            r = rng.random()
            if live and r < 0.6:
                token = live[0]
            elif model.tokens and r < 0.8:
                token = rng.choice(model.tokens)
            else:
                token = rng.choice(edge_tokens + [rng.randint(1, 2**62)])
            ttl = rng.choice(list(ttls) + [None])
            holder = rng.choice(holders)
            ctx = (seed, step, op, role, name, token, ttl, holder)
            counts[op] = counts.get(op, 0) + 1

            if op in ("try", "acquire"):
                if op == "try":
                    code, got = call(c, "SELECT fenced_lock_try_acquire(%s, %s::interval, %s)", (name, ttl, holder))
                else:
                    code, got = call(c, "SELECT fenced_lock_acquire(%s, %s::interval, '0', %s)", (name, ttl, holder))
                want = expect_error(op, name, ttl=ttl, holder=holder, ttl_required=True)
                if want is None:
                    if live and holder is not None and holder == live[1] and model.acts_for(role, live[2]):
                        assert (code, got) == (None, live[0]), ctx
                        if not ttls[ttl]:
                            del model.live[name]
                    elif live:
                        # Each role works through one connection: the role that
                        # holds a lease without a holder, asking again without
                        # one, would wait for its own session's lease.
                        own = live[2] == role and live[1] is None and holder is None
                        waits = "FL003" if own else "55P03"
                        assert (code, got) == ((None, None) if op == "try" else (waits, None)), ctx
                    else:
                        assert code is None and got > max(model.tokens, default=0), (ctx, code, got)
                        model.tokens.append(got)
                        if ttls[ttl]:
                            model.live[name] = (got, holder, role)
                        else:
                            model.live.pop(name, None)
                else:
                    assert code == want, (ctx, code)
            elif op in ("renew", "release"):
                if op == "renew":
                    code, got = call(c, "SELECT fenced_lock_renew(%s, %s, %s::interval)", (name, token, ttl))
                    want = expect_error(op, name, token=token, ttl=ttl)
                else:
                    code, got = call(c, "SELECT fenced_lock_release(%s, %s)", (name, token))
                    want = expect_error(op, name, token=token)
                if want is None:
                    if live and token == live[0]:
                        if model.acts_for(role, live[2]):
                            assert (code, got) == (None, True), ctx
                            if op == "release" or (ttl is not None and not ttls[ttl]):
                                del model.live[name]
                        else:
                            assert code == "42501", (ctx, code)
                    else:
                        assert (code, got) == (None, False), ctx
                else:
                    assert code == want, (ctx, code)
            elif op in ("validate", "assert"):
                fn = "fenced_lock_validate" if op == "validate" else "fenced_lock_assert"
                code, got = call(c, f"SELECT {fn}(%s, %s)", (name, token))
                want = expect_error(op, name, token=token)
                is_live = bool(live) and token == live[0]
                if want is None:
                    if op == "validate":
                        assert (code, got) == (None, is_live), ctx
                    else:
                        assert code == (None if is_live else "FL001"), (ctx, code)
                else:
                    assert code == want, (ctx, code)
            elif op == "force":
                operator = rng.random() < 0.5
                cc = conns["postgres"] if operator else c
                code, got = call(cc, "SELECT fenced_lock_force_release(%s)", (name,))
                want = expect_error(op, name)
                if want is None and not operator:
                    want = "42501"
                if want is None:
                    assert (code, got) == (None, bool(live)), ctx
                    model.live.pop(name, None)
                else:
                    assert code == want, (ctx, code)
            else:  # the view, as seen by `role`
                code = None
                seen = {r[0]: r[1:] for r in c.execute(
                    "SELECT name, token, holder, owner::text, live FROM fenced_lock_leases "
                    "WHERE name LIKE 'prop:%'").fetchall()}
                for n, (tok, h, owner) in model.live.items():
                    visible = model.acts_for(role, owner)
                    assert seen[n] == ((tok, h) if visible else (None, None)) + (owner, True), (ctx, n)
                for n, row in seen.items():
                    if n not in model.live:
                        assert row[3] is False, (ctx, n, row)
            if op != "view":
                outcomes[code] = outcomes.get(code, 0) + 1
            if code is not None:
                assert code in SPEC_SQLSTATES, (ctx, code)
    finally:
        for conn in conns.values():
            conn.close()
    # the lease table agrees with the model, and tokens only ever grew
    stored = {r[0]: r[1:] for r in su.execute(
        "SELECT name, token, holder, owner::text FROM fenced_lock_internal.granted_leases "
        "WHERE name LIKE 'prop:%' AND expires_at > clock_timestamp()").fetchall()}
    assert stored == model.live
    assert model.tokens == sorted(model.tokens) and len(set(model.tokens)) == len(model.tokens)
    # the run was not vacuous: it granted, refused and failed in every way
    assert len(model.tokens) >= 10, model.tokens
    assert all(counts.get(op, 0) > 10 for op in ["try", "renew", "release", "validate", "assert", "force"]), counts
    assert {None, "22004", "22023", "42501", "FL001", "55P03"} <= set(outcomes), outcomes


# == 0.3.0: modes, several names, renew_all, proclaim ==========================
#
# Every odd argument of the 0.3.0 calls gets the SQLSTATE docs/reference.md
# names ("Modes", "Several names at once", "Leader election", "SQLSTATEs"),
# and a refused call changes nothing: the lease records (expiries and
# proclaimed values included) and the history are the same before and after.

from modes_support import grant_new_functions, lease_state  # noqa: E402


@pytest.fixture(scope="module")
def api030(sec):
    """APP_A and APP_B may call the 0.3.0 functions too."""
    with sec.connect() as su:
        grant_new_functions(su, sec.APP_A, sec.APP_B)
    return sec


@pytest.fixture
def bystander(sec, su, api030):
    """A live lease of APP_A (holder 'h', a proclaimed value) that every refused
    call below must leave exactly as it is."""
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, "hostile:030:bystander", holder="h")
        assert one(a, "SELECT fenced_lock_proclaim('hostile:030:bystander', %s, 'v')", (t,)) is True
    yield t
    su.execute("SELECT fenced_lock_force_release('hostile:030:bystander')")


def refused(su, conn, query, params=None):
    """Run `query`, which must fail; its SQLSTATE, after checking that the
    lease state did not change."""
    before = lease_state(su)
    code = sqlstate(conn, query, params)
    assert code is not None, query
    assert lease_state(su) == before, query
    return code


MODE_ARGUMENTS = [
    ("permits => 0", "22023"),
    ("permits => -1", "22023"),
    ("permits => -2147483648", "22023"),
    ("permits => NULL", "22004"),
    ("permits => 10001", "22023"),
    ("permits => 2147483647", "22023"),
    ("shared => NULL", "22004"),
    ("session_bound => NULL", "22004"),
    ("shared => true, permits => 2", "22023"),
    ("shared => true, permits => 10000", "22023"),
    ("shared => NULL, permits => NULL", "22004"),
    # the edges that are fine
    ("permits => 1", None),
    ("permits => 2", None),
    ("permits => 10000", None),
    ("shared => true, permits => 1", None),
    ("shared => false, permits => 3", None),
]


@pytest.mark.parametrize("args,code", MODE_ARGUMENTS, ids=[a for a, _ in MODE_ARGUMENTS])
def test_mode_arguments_out_of_range_or_null_get_their_sqlstate_and_change_nothing(sec, su, bystander, args, code):
    name = "hostile:030:mode:" + args
    with sec.connect(sec.APP_A) as a:
        for q in [f"SELECT fenced_lock_try_acquire(%s, '1 minute', 'h', {args})",
                  f"SELECT fenced_lock_acquire(%s, '1 minute', '1 second', 'h', {args})"]:
            if code is not None:
                assert refused(su, a, q, (name,)) == code, q
            else:
                t = one(a, q, (name,))
                assert t is not None, q
                assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True
    assert lease_record(su, name) is None


@pytest.mark.parametrize("held,asked", [
    ("permits => 3", "permits => 2"),
    ("permits => 3", "permits => 4"),
    ("permits => 3", "permits => 10000"),
    ("permits => 3", "shared => true"),
    ("permits => 3", "permits => 1"),
    ("shared => true", "permits => 2"),
    ("permits => 1", "permits => 2"),
])
def test_a_request_that_does_not_fit_a_live_name_is_FL003_at_once_and_changes_nothing(sec, su, bystander, held,
                                                                                      asked):
    """The count belongs to the name while any of its leases lives: another
    count, or another mode beside a semaphore, can never be granted by
    waiting (FL003 at once, from another role too)."""
    name = f"hostile:030:fit:{held}:{asked}"
    with sec.connect(sec.APP_A) as a, sec.connect(sec.APP_B) as b:
        t = one(a, f"SELECT fenced_lock_try_acquire(%s, '1 minute', 'a', {held})", (name,))
        assert t is not None
        for q in [f"SELECT fenced_lock_try_acquire(%s, '1 minute', 'b', {asked})",
                  f"SELECT fenced_lock_acquire(%s, '1 minute', '30 seconds', 'b', {asked})"]:
            t0 = time.monotonic()
            assert refused(su, b, q, (name,)) == "FL003", q
            assert time.monotonic() - t0 < 5, q
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True


NAMES_ARGUMENTS = [
    ("'{}'::text[]", "22023"),
    ("NULL::text[]", "22004"),
    ("ARRAY['hostile:030:n:a', NULL]", "22004"),
    ("ARRAY[NULL::text]", "22004"),
    ("ARRAY['hostile:030:n:a', 'hostile:030:n:b', 'hostile:030:n:a']", "22023"),
    ("ARRAY[ARRAY['hostile:030:n:a', 'hostile:030:n:b'], ARRAY['hostile:030:n:c', 'hostile:030:n:d']]", "22023"),
    ("ARRAY(SELECT 'hostile:030:n:' || g FROM generate_series(1, 1001) g)", "22023"),
    ("ARRAY['hostile:030:n:a', repeat('x', 513)]", "22023"),
    ("ARRAY['hostile:030:n:a', repeat('é', 257)]", "22023"),   # 257 characters, 514 bytes
    ("ARRAY['hostile:030:n:a', '']", "22023"),
    # the edges that are fine
    ("ARRAY(SELECT 'hostile:030:n:' || g FROM generate_series(1, 1000) g)", None),
    ("ARRAY['hostile:030:n:a', repeat('x', 512), repeat('é', 256)]", None),
    ("ARRAY['hostile:030:n:a', 'hostile:030:n:a ', 'hostile:030:n:A']", None),  # not duplicates: other bytes
    ("'[5:6]={hostile:030:n:a,hostile:030:n:b}'::text[]", None),
]


@pytest.mark.parametrize("names,code", NAMES_ARGUMENTS, ids=range(len(NAMES_ARGUMENTS)))
def test_names_arrays_that_are_empty_null_not_flat_too_long_or_with_duplicates_are_refused(sec, su, bystander,
                                                                                           names, code):
    with sec.connect(sec.APP_A) as a:
        for q in [f"SELECT fenced_lock_try_acquire_all({names}, '1 minute', 'h')",
                  f"SELECT fenced_lock_acquire_all({names}, '1 minute', '1 second', 'h')"]:
            if code is not None:
                assert refused(su, a, q) == code, q
            else:
                got = one(a, q)
                n = one(a, f"SELECT cardinality({names})")
                assert len(got) == n and len(set(got)) == n, q
                assert one(a, f"SELECT fenced_lock_release_all({names}, %s)", (got,)) == n
        # release_all checks the names the same way (tokens of the same length)
        if code is not None:
            tokens = "NULL::bigint[]" if names.startswith("NULL") else \
                f"array_fill(1::bigint, ARRAY[coalesce(cardinality({names}), 0)])"
            assert refused(su, a, f"SELECT fenced_lock_release_all({names}, {tokens})") == code


@pytest.mark.parametrize("tokens,code", [
    ("ARRAY[%(t)s]", "22023"),                    # shorter than names
    ("ARRAY[%(t)s, 1, 2]", "22023"),              # longer
    ("ARRAY[%(t)s, NULL]", "22004"),
    ("NULL::bigint[]", "22004"),
    ("'{}'::bigint[]", "22023"),
    ("ARRAY[%(t)s, 0]", "22023"),
    ("ARRAY[%(t)s, -1]", "22023"),
    ("ARRAY[ARRAY[%(t)s], ARRAY[1]]", "22023"),   # two-dimensional
])
def test_release_all_with_tokens_of_another_length_or_null_elements_releases_nothing(sec, su, bystander, tokens,
                                                                                     code):
    names = ["hostile:030:rel:a", "hostile:030:rel:b"]
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, names[0], holder="h")
        q = "SELECT fenced_lock_release_all(%(names)s, " + tokens + ")"
        assert refused(su, a, q, {"names": names, "t": t}) == code
        assert one(a, "SELECT fenced_lock_validate(%s, %s)", (names[0], t)) is True  # not released
        assert one(a, "SELECT fenced_lock_release_all(%s, %s)", (names, [t, t + 1000])) == 1


@pytest.mark.parametrize("value,code", [
    ("repeat('x', 4097)", "22023"),
    ("repeat('é', 2049)", "22023"),       # 2049 characters, 4098 bytes
    ("repeat('🔒', 1025)", "22023"),      # 4100 bytes
    ("NULL", "22004"),
    ("repeat('x', 4096)", None),
    ("repeat('é', 2048)", None),          # 4096 bytes
    ("''", None),
    ("'''; DROP TABLE victim; --'", None),
])
def test_proclaimed_value_over_4096_bytes_or_null_is_refused_and_the_old_value_stays(sec, su, victim, api030, value,
                                                                                     code):
    name = "hostile:030:proclaim"
    with sec.connect(sec.APP_A) as a:
        t = acquire(a, name, holder="h")
        assert one(a, "SELECT fenced_lock_proclaim(%s, %s, 'before')", (name, t)) is True
        q = f"SELECT fenced_lock_proclaim(%s, %s, {value})"
        if code is not None:
            assert refused(su, a, q, (name, t)) == code
            assert one(a, "SELECT value FROM fenced_lock_leader(%s)", (name,)) == "before"
        else:
            assert one(a, q, (name, t)) is True
            assert one(a, "SELECT value = " + value + " FROM fenced_lock_leader(%s)", (name,)) is True
        assert one(a, "SELECT fenced_lock_release(%s, %s)", (name, t)) is True
    assert victim_intact(su)


@pytest.mark.parametrize("ttl", ["0", "-1 microsecond", "-1 second", "1 day 1 microsecond", "2 days", "1 mon",
                                 "178000000 years", "-178000000 years"])
def test_renew_all_with_a_bad_ttl_is_22023_and_renews_nothing(sec, su, bystander, ttl):
    with sec.connect(sec.APP_A) as a:
        one(a, "SELECT fenced_lock_try_acquire('hostile:030:renew', '1 minute', 'r', true)")
        for holder in ("r", "h", None):
            assert refused(su, a, "SELECT fenced_lock_renew_all(%s, %s::interval)", (holder, ttl)) == "22023"
        assert one(a, "SELECT fenced_lock_renew_all('r', '1 day')") == 1  # the edge is fine
        assert one(a, "SELECT fenced_lock_renew_all(NULL, '1 day')") == 1


@pytest.mark.parametrize("query,code", [
    ("SELECT fenced_lock_renew_all(repeat('h', 513), '1 minute')", "22023"),
    ("SELECT fenced_lock_try_acquire_all(ARRAY['hostile:030:x'], NULL)", "22004"),
    ("SELECT fenced_lock_try_acquire_all(ARRAY['hostile:030:x'], '0')", "22023"),
    ("SELECT fenced_lock_try_acquire_all(ARRAY['hostile:030:x'], '1 minute', repeat('h', 513))", "22023"),
    ("SELECT fenced_lock_try_acquire_all(ARRAY['hostile:030:x'], '1 minute', 'h', NULL)", "22004"),
    ("SELECT fenced_lock_acquire_all(ARRAY['hostile:030:x'], '1 minute', '-1 microsecond')", "22023"),
    ("SELECT fenced_lock_acquire_all(ARRAY['hostile:030:x'], NULL, '1 second')", "22004"),
    ("SELECT fenced_lock_proclaim(NULL, 1, 'v')", "22004"),
    ("SELECT fenced_lock_proclaim('', 1, 'v')", "22023"),
    ("SELECT fenced_lock_proclaim(repeat('x', 513), 1, 'v')", "22023"),
    ("SELECT fenced_lock_proclaim('hostile:030:x', NULL, 'v')", "22004"),
    ("SELECT fenced_lock_proclaim('hostile:030:x', 0, 'v')", "22023"),
    ("SELECT fenced_lock_proclaim('hostile:030:x', -9223372036854775808, 'v')", "22023"),
    ("SELECT * FROM fenced_lock_leader(NULL)", "22004"),
    ("SELECT * FROM fenced_lock_leader('')", "22023"),
    ("SELECT * FROM fenced_lock_leader(repeat('x', 513))", "22023"),
])
def test_other_bad_arguments_of_the_030_functions_get_their_sqlstate(sec, su, bystander, query, code):
    with sec.connect(sec.APP_A) as a:
        assert refused(su, a, query) == code


def test_hostile_names_in_acquire_all_are_kept_byte_for_byte(sec, su, victim, api030):
    names = [s for s in HOSTILE_STRINGS if len(s.encode()) <= 512]
    with sec.connect(sec.APP_A) as a:
        tokens = one(a, "SELECT fenced_lock_acquire_all(%s, '1 minute', '1 second', %s)", (names, "'; DROP --"))
        assert len(tokens) == len(names) == len(set(tokens))
        stored = dict(su.execute("SELECT token, convert_to(name, 'UTF8') FROM fenced_lock_internal.granted_leases "
                                 "WHERE token = ANY(%s)", (tokens,)).fetchall())
        assert [stored[t] for t in tokens] == [n.encode() for n in names]
        assert one(a, "SELECT fenced_lock_try_acquire_all(%s, '1 minute', %s)", (names, "'; DROP --")) == tokens
        assert one(a, "SELECT fenced_lock_renew_all(%s)", ("'; DROP --",)) == len(names)
        assert one(a, "SELECT fenced_lock_release_all(%s, %s)", (names, tokens)) == len(names)
    assert victim_intact(su)
