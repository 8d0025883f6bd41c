-- The daily and hourly rollups are rewritten all day: every compaction pass adds its
-- deltas to the day's and the hour's rows (a day row ~100 times a day), and the
-- re-pricer rewrites the priced ones. With every page filled to the brim (PostgreSQL's
-- default) no update found room on its own page: each new version went wherever there
-- was space, and of 95,622 updates of rollup_day_compacted in bench-report's load only
-- 1.4 % were HOT. After the load an app's 720 day rows of 30 days lay on 475 pages (of
-- 1,050), and each update added an entry to every index of the table.
--
-- Pages filled to 70 % keep room for the new versions beside the old: an update that
-- changes no indexed column (a rollup's sums never are) stays on its page (HOT), the
-- indexes are not touched, and one app's rows of a day stay where that day's first
-- pass put them. Pages written before this keep their layout until rewritten.
ALTER TABLE rollup_day_compacted SET (fillfactor = 70);
ALTER TABLE rollup_priced_day SET (fillfactor = 70);
ALTER TABLE rollup_revenue_day_compacted SET (fillfactor = 70);
ALTER TABLE rollup_unpriced_day_compacted SET (fillfactor = 70);
ALTER TABLE rollup_devices_day_compacted SET (fillfactor = 70);
ALTER TABLE rollup_1h_compacted SET (fillfactor = 70);
ALTER TABLE rollup_priced_1h SET (fillfactor = 70);
ALTER TABLE rollup_revenue_1h_compacted SET (fillfactor = 70);
ALTER TABLE rollup_unpriced_1h_compacted SET (fillfactor = 70);
ALTER TABLE rollup_devices_1h_compacted SET (fillfactor = 70);
