"""The soak's database: the inventory of README's pattern, guarded per item,
and what the independent checker needs recorded next to it.

- `inventory(item_id, stock, fence_token, last_sale, stamped_at)`: guarded by
  `fenced_lock_guard('inv:{item_id}', 'fence_token')`. A BEFORE trigger named
  `aa_stamp` fires before the guard (triggers fire in name order) and stamps
  `stamped_at = clock_timestamp()`: a moment no later than the guard's
  decision, so "the stamp is before the lease ended" follows from "the guard
  accepted", and a stale write accepted by mistake shows as a stamp past the
  lease's end.
- `sale_audit`: one row per committed sale, written by an AFTER trigger in
  the sale's own transaction (so it exists exactly when the sale committed):
  the sale id the worker chose, the token, the stock replaced and the new
  one, the stamp, and the transaction id, whose commit timestamp
  (track_commit_timestamp = on) the checker reads.
- `soak_meta`: the number of items and the initial stock of each.
- From 0.3.0 on: `shelf_reads` (a count taken under a shared lease of the
  same `inv:{item}` name, guarded with the guard's 'shared' mode), and
  `pool_use` (one row per use of a permit of `pool:{k}`) — no guard on it:
  the checker counts permits from the history alone.

Workers log in as `soak_app`, which has only what README's "Granting access"
lists and the table privileges it needs; the checker reads as the superuser.
"""

APP = "soak_app"


def version_tuple(v):
    return tuple(int(x) for x in v.split(".")[:3])


def setup(conn, items, initial_stock, extversion):
    conn.execute("CREATE TABLE soak_meta (items int NOT NULL, initial_stock bigint NOT NULL, extversion text)")
    conn.execute("INSERT INTO soak_meta VALUES (%s, %s, %s)", (items, initial_stock, extversion))
    conn.execute(f"DO $$ BEGIN CREATE ROLE {APP} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    conn.execute(f"""
        DO $$ DECLARE f regprocedure; BEGIN
          FOR f IN SELECT p.oid FROM pg_proc p WHERE p.proname IN ('fenced_lock_try_acquire',
                   'fenced_lock_acquire', 'fenced_lock_renew', 'fenced_lock_release', 'fenced_lock_validate',
                   'fenced_lock_assert') AND p.pronamespace = 'public'::regnamespace LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO {APP}', f);
          END LOOP; END $$""")
    conn.execute(f"GRANT SELECT ON fenced_lock_leases TO {APP}")
    conn.execute("""
        CREATE TABLE inventory (item_id int PRIMARY KEY, stock bigint NOT NULL, fence_token bigint,
                                last_sale text, stamped_at timestamptz);
        CREATE TABLE sale_audit (id bigserial PRIMARY KEY, item_id int NOT NULL, sale_id text NOT NULL UNIQUE,
                                 token bigint, old_stock bigint, new_stock bigint, stamped_at timestamptz,
                                 xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id());
        CREATE FUNCTION soak_stamp() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $$
        BEGIN NEW.stamped_at := clock_timestamp(); RETURN NEW; END $$;
        CREATE FUNCTION soak_audit() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = pg_catalog AS $$
        BEGIN
            INSERT INTO public.sale_audit (item_id, sale_id, token, old_stock, new_stock, stamped_at)
            VALUES (NEW.item_id, NEW.last_sale, NEW.fence_token, OLD.stock, NEW.stock, NEW.stamped_at);
            RETURN NULL;
        END $$;
        CREATE TRIGGER aa_stamp BEFORE INSERT OR UPDATE ON inventory FOR EACH ROW EXECUTE FUNCTION soak_stamp();
        CREATE TRIGGER inventory_fence BEFORE INSERT OR UPDATE OR DELETE ON inventory
          FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inv:{item_id}', 'fence_token');
        CREATE TRIGGER zz_audit AFTER UPDATE ON inventory FOR EACH ROW EXECUTE FUNCTION soak_audit();
    """)
    # The initial rows are written before the guard exists for them: with the
    # guard on, an INSERT needs a lease; take one per item as the superuser.
    for i in range(items):
        t = conn.execute("SELECT fenced_lock_try_acquire(%s, '1 minute', 'setup')", (f"inv:{i}",)).fetchone()[0]
        conn.execute("INSERT INTO inventory (item_id, stock, fence_token, last_sale) VALUES (%s, %s, %s, 'initial')",
                     (i, initial_stock, t))
        conn.execute("SELECT fenced_lock_release(%s, %s)", (f"inv:{i}", t))
    conn.execute(f"GRANT SELECT, UPDATE ON inventory TO {APP}")
    if version_tuple(extversion) >= (0, 3, 0):
        conn.execute("""
            CREATE TABLE shelf_reads (id bigserial PRIMARY KEY, item_id int NOT NULL, reader text NOT NULL,
                                      observed bigint NOT NULL, fence_token bigint);
            CREATE TRIGGER shelf_fence BEFORE INSERT OR UPDATE OR DELETE ON shelf_reads
              FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('inv:{item_id}', 'fence_token', 'shared');
            CREATE TABLE pool_use (id bigserial PRIMARY KEY, pool int NOT NULL, worker text NOT NULL,
                                   token bigint NOT NULL);
        """)
        conn.execute(f"GRANT SELECT, INSERT ON shelf_reads, pool_use TO {APP}")
        conn.execute(f"GRANT USAGE ON SEQUENCE shelf_reads_id_seq, pool_use_id_seq TO {APP}")
