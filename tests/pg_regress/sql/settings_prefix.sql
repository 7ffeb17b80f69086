--
-- fenced_lock.* settings the extension does not define (a typo, say).
--
-- PostgreSQL 15 and later refuse them once the library is loaded: the prefix
-- is reserved (MarkGUCPrefixReserved), so the typo is an error (42602).
-- PostgreSQL 13 and 14 cannot reserve a prefix: they accept such a setting,
-- which means nothing (expected/settings_prefix_1.out). docs/reference.md,
-- "Settings", says so.
--
\set VERBOSITY sqlstate
SELECT fenced_lock_validate('prefix:load', 1) AS loads_the_library;
SET fenced_lock.no_such_setting = 'on';
SET fenced_lock.max_tll = '1h';
-- The real settings are there, whatever the major.
SELECT name, setting, unit, context FROM pg_settings WHERE name LIKE 'fenced_lock.%' ORDER BY name;
