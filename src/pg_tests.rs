//! In-process tests (`cargo pgrx test`): the SQL API against a real backend.
//! Each test runs in one transaction. Errors raised with our own SQLSTATEs reach
//! these tests through pgrx, which keeps the message but not the code; the
//! SQLSTATEs themselves are checked by the pg_regress and integration suites.
//!
//! pgrx runs every `#[pg_test]` as `tests.<name>()`, so they live in a
//! `#[pg_schema] mod tests`.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one_i64(q: &str) -> Option<i64> {
        Spi::get_one::<i64>(q).expect("query failed")
    }

    fn one_bool(q: &str) -> Option<bool> {
        Spi::get_one::<bool>(q).expect("query failed")
    }

    /// Tests run in parallel backends, and those that change the extension's
    /// tables must not deadlock with the others: they take both tables at
    /// once, in the order every lease change touches them (records, then
    /// history), before anything else.
    fn one_table_changer_at_a_time() {
        Spi::run(
            "LOCK TABLE fenced_lock_internal.granted_leases, fenced_lock_internal.lease_history \
             IN ACCESS EXCLUSIVE MODE",
        )
        .unwrap();
    }

    #[pg_test]
    fn try_acquire_grants_a_positive_token_and_records_the_lease() {
        let t = one_i64("SELECT fenced_lock_try_acquire('job:1', '30 seconds', 'w1')").unwrap();
        assert!(t > 0);
        let (token, holder) = Spi::get_two::<i64, String>(
            "SELECT token, holder FROM fenced_lock_leases WHERE name = 'job:1' AND live",
        )
        .unwrap();
        assert_eq!(token, Some(t));
        assert_eq!(holder.as_deref(), Some("w1"));
    }

    #[pg_test]
    fn a_live_lease_refuses_a_second_holder() {
        assert!(one_i64("SELECT fenced_lock_try_acquire('job:2', '30 seconds', 'a')").is_some());
        assert_eq!(one_i64("SELECT fenced_lock_try_acquire('job:2', '30 seconds', 'b')"), None);
        assert_eq!(one_i64("SELECT fenced_lock_try_acquire('job:2', '30 seconds')"), None);
    }

    #[pg_test]
    fn retry_by_the_same_holder_returns_the_same_token_and_extends() {
        let t = one_i64("SELECT fenced_lock_try_acquire('job:3', '1 second', 'w')").unwrap();
        let before = one_i64("SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM fenced_lock_leases WHERE name = 'job:3'").unwrap();
        let again = one_i64("SELECT fenced_lock_try_acquire('job:3', '1 hour', 'w')").unwrap();
        let after = one_i64("SELECT (extract(epoch FROM expires_at) * 1e6)::bigint FROM fenced_lock_leases WHERE name = 'job:3'").unwrap();
        assert_eq!(t, again);
        assert!(after > before + 3_000_000_000, "lease extended to an hour");
    }

    #[pg_test]
    fn tokens_strictly_increase_across_names() {
        let a = one_i64("SELECT fenced_lock_try_acquire('inc:a')").unwrap();
        let b = one_i64("SELECT fenced_lock_try_acquire('inc:b')").unwrap();
        assert!(fenced_release("inc:a", a));
        let c = one_i64("SELECT fenced_lock_try_acquire('inc:a')").unwrap();
        assert!(a < b && b < c);
    }

    fn fenced_release(name: &str, token: i64) -> bool {
        one_bool(&format!("SELECT fenced_lock_release('{name}', {token})")).unwrap()
    }

    #[pg_test]
    fn release_ends_the_lease_once() {
        let t = one_i64("SELECT fenced_lock_try_acquire('job:4')").unwrap();
        assert!(fenced_release("job:4", t));
        assert!(!fenced_release("job:4", t));
        assert_eq!(one_bool(&format!("SELECT fenced_lock_validate('job:4', {t})")), Some(false));
        assert_eq!(one_i64("SELECT count(*) FROM fenced_lock_leases WHERE name = 'job:4'"), Some(0));
    }

    #[pg_test]
    fn renew_keeps_the_token_and_null_ttl_reuses_the_original() {
        let t = one_i64("SELECT fenced_lock_try_acquire('job:5', '10 minutes')").unwrap();
        assert_eq!(one_bool(&format!("SELECT fenced_lock_renew('job:5', {t})")), Some(true));
        let left = one_i64("SELECT extract(epoch FROM expires_at - clock_timestamp())::bigint FROM fenced_lock_leases WHERE name = 'job:5'").unwrap();
        assert!((590..=600).contains(&left), "renewed for its own 10 minutes, got {left}s");
        assert_eq!(one_bool(&format!("SELECT fenced_lock_renew('job:5', {t}, '1 hour')")), Some(true));
        assert_eq!(one_i64("SELECT token FROM fenced_lock_leases WHERE name = 'job:5'"), Some(t));
        // NULL means the ttl the lease was granted with, not the last one used
        assert_eq!(one_bool(&format!("SELECT fenced_lock_renew('job:5', {t})")), Some(true));
        let left = one_i64("SELECT extract(epoch FROM expires_at - clock_timestamp())::bigint FROM fenced_lock_leases WHERE name = 'job:5'").unwrap();
        assert!((590..=600).contains(&left), "renewed for the original 10 minutes, got {left}s");
    }

    #[pg_test]
    fn an_expired_lease_is_never_revived() {
        let t = one_i64("SELECT fenced_lock_try_acquire('job:6', '20 milliseconds')").unwrap();
        Spi::run("SELECT pg_sleep(0.05)").unwrap();
        assert_eq!(one_bool(&format!("SELECT fenced_lock_validate('job:6', {t})")), Some(false));
        assert_eq!(one_bool(&format!("SELECT fenced_lock_renew('job:6', {t})")), Some(false));
        assert_eq!(one_bool(&format!("SELECT fenced_lock_release('job:6', {t})")), Some(false));
        assert_eq!(one_bool("SELECT live FROM fenced_lock_leases WHERE name = 'job:6'"), Some(false));
    }

    #[pg_test]
    fn takeover_after_expiry_gets_a_larger_token() {
        let t = one_i64("SELECT fenced_lock_try_acquire('job:7', '20 milliseconds', 'a')").unwrap();
        Spi::run("SELECT pg_sleep(0.05)").unwrap();
        let u = one_i64("SELECT fenced_lock_try_acquire('job:7', '30 seconds', 'b')").unwrap();
        assert!(u > t);
        assert_eq!(one_bool(&format!("SELECT fenced_lock_validate('job:7', {t})")), Some(false));
        assert_eq!(one_bool(&format!("SELECT fenced_lock_validate('job:7', {u})")), Some(true));
    }

    #[pg_test]
    fn expiry_is_decided_on_the_clock_not_the_transaction_start() {
        // now() stays at the transaction start; the lease must still expire.
        let t = one_i64("SELECT fenced_lock_try_acquire('job:8', '30 milliseconds')").unwrap();
        Spi::run("SELECT pg_sleep(0.06)").unwrap();
        assert_eq!(one_bool(&format!("SELECT fenced_lock_validate('job:8', {t})")), Some(false));
        assert!(one_i64("SELECT fenced_lock_try_acquire('job:8')").is_some());
    }

    #[pg_test]
    fn force_release_by_a_superuser_ends_any_lease() {
        one_i64("SELECT fenced_lock_try_acquire('job:9')").unwrap();
        assert_eq!(one_bool("SELECT fenced_lock_force_release('job:9')"), Some(true));
        assert_eq!(one_bool("SELECT fenced_lock_force_release('job:9')"), Some(false));
    }

    #[pg_test]
    fn the_view_shows_one_row_per_name() {
        one_i64("SELECT fenced_lock_try_acquire('view:a', '1 minute', 'h')").unwrap();
        one_i64("SELECT fenced_lock_try_acquire('view:b')").unwrap();
        assert_eq!(
            one_i64("SELECT count(*) FROM fenced_lock_leases WHERE name LIKE 'view:%' AND live"),
            Some(2)
        );
        assert_eq!(
            one_bool("SELECT owner::text = current_user::text FROM fenced_lock_leases WHERE name = 'view:a'"),
            Some(true)
        );
    }

    #[pg_test]
    fn guarded_insert_with_the_live_token_is_accepted() {
        Spi::run("CREATE TABLE g1 (id int PRIMARY KEY, v int, fence_token bigint)").unwrap();
        Spi::run("CREATE TRIGGER f BEFORE INSERT OR UPDATE OR DELETE ON g1 FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('g1:{id}')").unwrap();
        let t = one_i64("SELECT fenced_lock_try_acquire('g1:1')").unwrap();
        Spi::run(&format!("INSERT INTO g1 VALUES (1, 10, {t})")).unwrap();
        Spi::run(&format!("UPDATE g1 SET v = 9, fence_token = {t} WHERE id = 1")).unwrap();
        Spi::run(&format!("SELECT fenced_lock_assert('g1:1', {t})")).unwrap();
        Spi::run("DELETE FROM g1 WHERE id = 1").unwrap();
        assert_eq!(one_i64("SELECT count(*) FROM g1"), Some(0));
    }

    #[pg_test(error = "stale fencing token 999999 for lock \"g2:1\": live token is none")]
    fn guarded_insert_with_an_unknown_token_is_rejected() {
        Spi::run("CREATE TABLE g2 (id int PRIMARY KEY, v int, fence_token bigint)").unwrap();
        Spi::run(
            "CREATE TRIGGER f BEFORE INSERT ON g2 FOR EACH ROW EXECUTE FUNCTION fenced_lock_guard('g2:{id}')",
        )
        .unwrap();
        Spi::run("INSERT INTO g2 VALUES (1, 10, 999999)").unwrap();
    }

    #[pg_test(error = "fenced_lock_try_acquire: argument \"name\" must not be NULL")]
    fn null_name_is_rejected() {
        Spi::run("SELECT fenced_lock_try_acquire(NULL)").unwrap();
    }

    #[pg_test(error = "fenced_lock_renew: token -1 for lock \"x\" is not positive")]
    fn non_positive_token_is_rejected() {
        Spi::run("SELECT fenced_lock_renew('x', -1)").unwrap();
    }

    #[pg_test]
    fn a_rolled_back_grant_burns_its_token() {
        let before = one_i64("SELECT fenced_lock_try_acquire('burn:a')").unwrap();
        Spi::run(
            "DO $$ BEGIN PERFORM fenced_lock_try_acquire('burn:b'); RAISE EXCEPTION 'roll back'; \
             EXCEPTION WHEN raise_exception THEN NULL; END $$",
        )
        .unwrap();
        assert_eq!(one_i64("SELECT count(*) FROM fenced_lock_leases WHERE name = 'burn:b'"), Some(0));
        let after = one_i64("SELECT fenced_lock_try_acquire('burn:b')").unwrap();
        assert!(after > before + 1, "the rolled-back grant's token {} is not reused", before + 1);
    }

    #[pg_test]
    fn a_session_bound_lease_goes_back_to_its_session_with_the_same_token() {
        let t = one_i64("SELECT fenced_lock_try_acquire('sb:1', '1 minute', 'a', session_bound => true)")
            .unwrap();
        let again =
            one_i64("SELECT fenced_lock_try_acquire('sb:1', '1 hour', 'b', session_bound => true)").unwrap();
        assert_eq!(t, again);
        assert_eq!(
            one_bool("SELECT session_bound AND live FROM fenced_lock_leases WHERE name = 'sb:1'"),
            Some(true)
        );
        assert_eq!(
            one_i64("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17997 AND pid = pg_backend_pid()"),
            Some(1),
            "the session holds the lease's session lock"
        );
    }

    #[pg_test]
    fn every_grant_opens_a_history_row_and_its_release_closes_it() {
        let t = one_i64("SELECT fenced_lock_try_acquire('hist:1', '1 minute', 'w')").unwrap();
        assert_eq!(
            one_bool(&format!("SELECT ended_at IS NULL FROM fenced_lock_history WHERE token = {t}")),
            Some(true)
        );
        assert!(fenced_release("hist:1", t));
        let (ended_by, role) = Spi::get_two::<String, String>(&format!(
            "SELECT ended_by, ended_by_role::text FROM fenced_lock_history WHERE token = {t}"
        ))
        .unwrap();
        assert_eq!(ended_by.as_deref(), Some("release"));
        assert_eq!(role, Spi::get_one::<String>("SELECT current_user::text").unwrap());
    }

    /// The history row of `token`, read from the table itself:
    /// "holder|owner|session_bound|ended_by|ended_by_role|times in order".
    fn history_row(token: i64) -> Option<String> {
        Spi::get_one::<String>(&format!(
            "SELECT concat_ws('|', holder, owner = current_user, session_bound, ended_by, \
                    ended_by_role = current_user, acquired_at < expires_at AND acquired_at <= ended_at) \
             FROM fenced_lock_internal.lease_history WHERE token = {token}"
        ))
        .expect("query failed")
    }

    #[pg_test]
    fn a_history_table_with_a_dropped_column_still_gets_whole_rows() {
        one_table_changer_at_a_time();
        // Rows are formed by attribute number: a dropped column in between
        // must stay NULL and shift nothing.
        let t = one_i64("SELECT fenced_lock_try_acquire('hist:6', '1 minute', 'w')").unwrap();
        assert!(fenced_release("hist:6", t));
        assert!(crate::store::written_directly().1, "the installed history table is written directly");
        Spi::run("ALTER TABLE fenced_lock_internal.lease_history ADD COLUMN gone int").unwrap();
        Spi::run("ALTER TABLE fenced_lock_internal.lease_history DROP COLUMN gone").unwrap();
        let t = one_i64("SELECT fenced_lock_try_acquire('hist:3', '1 minute', 'w')").unwrap();
        assert!(fenced_release("hist:3", t));
        assert_eq!(history_row(t).as_deref(), Some("w|t|f|release|t|t"));
        assert!(crate::store::written_directly().1);
    }

    #[pg_test]
    fn a_history_table_of_another_shape_is_written_by_insert() {
        one_table_changer_at_a_time();
        // A column this library does not know (a newer catalog, or an operator's
        // addition): rows go through INSERT, which fills in its default.
        Spi::run(
            "ALTER TABLE fenced_lock_internal.lease_history ADD COLUMN note text NOT NULL DEFAULT 'kept'",
        )
        .unwrap();
        let t = one_i64("SELECT fenced_lock_try_acquire('hist:4', '1 minute', 'w')").unwrap();
        assert!(fenced_release("hist:4", t));
        assert_eq!(history_row(t).as_deref(), Some("w|t|f|release|t|t"));
        assert!(!crate::store::written_directly().1);
        assert_eq!(
            Spi::get_one::<String>(&format!(
                "SELECT note FROM fenced_lock_internal.lease_history WHERE token = {t}"
            ))
            .unwrap()
            .as_deref(),
            Some("kept")
        );
    }

    #[pg_test]
    fn a_history_table_with_an_operators_indexes_and_trigger_is_written_by_insert() {
        one_table_changer_at_a_time();
        // Rows inserted without the executor would skip the trigger and could not
        // maintain an expression or partial index: such a table gets INSERTs.
        Spi::run(
            "CREATE TABLE public.hist_seen (token bigint); \
             CREATE FUNCTION public.hist_seen() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN INSERT INTO public.hist_seen VALUES (NEW.token); RETURN NEW; END $$; \
             CREATE TRIGGER seen AFTER INSERT ON fenced_lock_internal.lease_history \
               FOR EACH ROW EXECUTE FUNCTION public.hist_seen(); \
             CREATE INDEX hist_by_holder ON fenced_lock_internal.lease_history (lower(holder)); \
             CREATE INDEX hist_released ON fenced_lock_internal.lease_history (name) \
               WHERE ended_by = 'release'",
        )
        .unwrap();
        let t = one_i64("SELECT fenced_lock_try_acquire('hist:5', '1 minute', 'W')").unwrap();
        assert!(fenced_release("hist:5", t));
        assert!(!crate::store::written_directly().1);
        assert_eq!(history_row(t).as_deref(), Some("W|t|f|release|t|t"));
        assert_eq!(one_i64(&format!("SELECT count(*) FROM public.hist_seen WHERE token = {t}")), Some(1));
        // Both indexes hold the row, and only where they should.
        Spi::run("SET LOCAL enable_seqscan = off").unwrap();
        assert_eq!(
            one_i64("SELECT token FROM fenced_lock_internal.lease_history WHERE lower(holder) = 'w'"),
            Some(t)
        );
        assert_eq!(
            one_i64(
                "SELECT token FROM fenced_lock_internal.lease_history \
                 WHERE name = 'hist:5' AND ended_by = 'release'"
            ),
            Some(t)
        );
    }

    #[pg_test]
    fn no_ended_lease_is_kept_when_retention_is_zero() {
        Spi::run("SET fenced_lock.history_retention = 0").unwrap();
        let t = one_i64("SELECT fenced_lock_try_acquire('hist:2')").unwrap();
        // live: shown from its record
        assert_eq!(one_i64(&format!("SELECT count(*) FROM fenced_lock_history WHERE token = {t}")), Some(1));
        assert!(fenced_release("hist:2", t));
        assert_eq!(one_i64(&format!("SELECT count(*) FROM fenced_lock_history WHERE token = {t}")), Some(0));
    }

    #[pg_test]
    fn counters_are_null_without_preloading() {
        assert_eq!(
            one_bool(
                "SELECT NOT preloaded AND grants IS NULL AND fence_rejections IS NULL FROM fenced_lock_stats"
            ),
            Some(true)
        );
    }

    #[pg_test(error = "fenced_lock_try_acquire: argument \"session_bound\" must not be NULL (lock \"sb:2\")")]
    fn null_session_bound_is_rejected() {
        Spi::run("SELECT fenced_lock_try_acquire('sb:2', session_bound => NULL)").unwrap();
    }

    #[pg_test]
    fn the_installed_lease_table_is_written_directly_with_its_partial_indexes_right() {
        let plain = one_i64("SELECT fenced_lock_try_acquire('direct:1', '1 minute')").unwrap();
        let held = one_i64("SELECT fenced_lock_try_acquire('direct:2', '1 minute', 'w9')").unwrap();
        let bound =
            one_i64("SELECT fenced_lock_try_acquire('direct:3', '1 minute', session_bound => true)").unwrap();
        assert_eq!(crate::store::written_directly(), (true, true));
        // Through the indexes only: each partial index holds exactly its rows.
        Spi::run("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off").unwrap();
        assert_eq!(
            one_i64(
                "SELECT token FROM fenced_lock_internal.granted_leases WHERE session_bound AND token > 0"
            ),
            Some(bound)
        );
        assert_eq!(
            one_i64("SELECT token FROM fenced_lock_internal.granted_leases WHERE holder = 'w9'"),
            Some(held)
        );
        assert_eq!(
            one_i64(
                "SELECT token FROM fenced_lock_internal.granted_leases WHERE name = 'direct:1' AND token > 0"
            ),
            Some(plain)
        );
        // A renew moves the record (a new version, new index entries).
        assert_eq!(one_bool(&format!("SELECT fenced_lock_renew('direct:2', {held}, '1 hour')")), Some(true));
        assert_eq!(
            one_i64("SELECT token FROM fenced_lock_internal.granted_leases WHERE holder = 'w9'"),
            Some(held)
        );
        assert_eq!(one_bool(&format!("SELECT fenced_lock_validate('direct:2', {held})")), Some(true));
    }

    #[pg_test]
    fn a_lease_table_with_an_operators_trigger_is_written_by_sql_and_the_trigger_runs() {
        one_table_changer_at_a_time();
        Spi::run(
            "CREATE TABLE public.rec_seen (op text, token bigint); \
             CREATE FUNCTION public.rec_seen() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN INSERT INTO public.rec_seen VALUES (TG_OP, coalesce(NEW.token, OLD.token)); \
                  RETURN coalesce(NEW, OLD); END $$; \
             CREATE TRIGGER seen AFTER INSERT OR UPDATE OR DELETE ON fenced_lock_internal.granted_leases \
               FOR EACH ROW EXECUTE FUNCTION public.rec_seen()",
        )
        .unwrap();
        let t = one_i64("SELECT fenced_lock_try_acquire('sql:1', '1 minute', 'w')").unwrap();
        assert!(!crate::store::written_directly().0);
        assert_eq!(one_bool(&format!("SELECT fenced_lock_renew('sql:1', {t})")), Some(true));
        assert!(fenced_release("sql:1", t));
        assert_eq!(
            Spi::get_one::<String>(&format!(
                "SELECT string_agg(op, ',' ORDER BY op) FROM public.rec_seen WHERE token = {t}"
            ))
            .unwrap()
            .as_deref(),
            Some("DELETE,INSERT,UPDATE")
        );
    }

    #[pg_test]
    fn shared_leases_live_together_and_exclude_an_exclusive_one() {
        let a = one_i64("SELECT fenced_lock_try_acquire('rw:1', '1 minute', 'r1', shared => true)").unwrap();
        let b = one_i64("SELECT fenced_lock_try_acquire('rw:1', '1 minute', 'r2', shared => true)").unwrap();
        assert!(b > a);
        assert_eq!(one_i64("SELECT fenced_lock_try_acquire('rw:1', '1 minute', 'w')"), None);
        assert_eq!(
            one_i64("SELECT fenced_lock_try_acquire('rw:1', '1 minute', 'r1', shared => true)"),
            Some(a),
            "the same holder gets its token back"
        );
        assert_eq!(
            one_i64(
                "SELECT count(*) FROM fenced_lock_leases WHERE name = 'rw:1' AND live AND mode = 'shared'"
            ),
            Some(2)
        );
        assert!(fenced_release("rw:1", a));
        assert!(fenced_release("rw:1", b));
        let w = one_i64("SELECT fenced_lock_try_acquire('rw:1', '1 minute', 'w')").unwrap();
        assert!(w > b);
        assert_eq!(one_i64("SELECT fenced_lock_try_acquire('rw:1', '1 minute', 'r3', shared => true)"), None);
    }

    #[pg_test]
    fn a_semaphore_admits_exactly_its_count() {
        let granted: Vec<Option<i64>> = (0..4)
            .map(|_| one_i64("SELECT fenced_lock_try_acquire('sem:1', '1 minute', permits => 3)"))
            .collect();
        assert_eq!(granted.iter().filter(|t| t.is_some()).count(), 3);
        assert_eq!(granted[3], None);
        assert_eq!(
            one_i64("SELECT count(*) FROM fenced_lock_leases WHERE name = 'sem:1' AND live AND permits = 3"),
            Some(3)
        );
        let first = granted[0].unwrap();
        assert!(fenced_release("sem:1", first));
        assert!(
            one_i64("SELECT fenced_lock_try_acquire('sem:1', '1 minute', permits => 3)").unwrap() > first
        );
    }
}
