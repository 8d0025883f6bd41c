-- AdTally schema, part 28: device sketches that hold no device's hash (issue 44, DESIGN §15).
--
-- Every unique-device sketch was hll(11, 5) with the extension's default explicit
-- threshold: a sketch of up to ~160 devices (most 15-minute, hourly and small apps'
-- days) was stored EXPLICIT, as the list of its devices' 64-bit hll_hash_text values.
-- That hash has no key: anyone holding a device id computes it and finds the buckets,
-- networks and formats that device was seen in, in every sketch kept forever, erased
-- or not. A sketch without the explicit form (expthresh 0) keeps, per register, the
-- most leading zeros of the hashes that fell in it: nothing that names one device.
--
-- From this version every sketch is hll(11, 5, 0): the compactor's, and those a report
-- makes from raw events or pending deltas (ReportPlan.sketch), which are unioned with
-- the stored ones (the extension refuses to union two explicit thresholds). Here every
-- stored sketch is rewritten:
--   EXPLICIT    rebuilt from its hashes (read from hll_print) with expthresh 0;
--   the others  (EMPTY, SPARSE, FULL: no hash in them) keep their registers, with the
--               threshold in their header set to 0 (byte 2's low six bits).
-- A small sketch's count was exact and is an estimate now (linear counting: 3 devices
-- read 3.00, 150 read ~151.5), within the 2.3 % standard error reports already state.
--
-- Upgrading: stop every server of the previous version before one of this version
-- migrates (a previous server's sketches would not union with this version's).

CREATE OR REPLACE FUNCTION pg_temp.without_hashes(sketch hll) RETURNS hll LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN sketch IS NULL THEN NULL
        WHEN get_byte(decode(substr(sketch::text, 3), 'hex'), 0) & 15 = 2 THEN
            (SELECT coalesce(hll_add_agg(m[1]::bigint::hll_hashval, 11, 5, 0), hll_empty(11, 5, 0))
             FROM regexp_matches(hll_print(sketch)::text, '\n\d+:\s+(-?\d+)', 'g') AS m)
        ELSE ('\x' || encode(set_byte(decode(substr(sketch::text, 3), 'hex'), 2,
                                      get_byte(decode(substr(sketch::text, 3), 'hex'), 2) & 192), 'hex'))::hll
    END
$$;

UPDATE rollup_devices_15m_compacted SET devices = pg_temp.without_hashes(devices), viewers = pg_temp.without_hashes(viewers);
UPDATE rollup_devices_1h_compacted SET devices = pg_temp.without_hashes(devices), viewers = pg_temp.without_hashes(viewers);
UPDATE rollup_devices_day_compacted SET devices = pg_temp.without_hashes(devices), viewers = pg_temp.without_hashes(viewers);
UPDATE rollup_devices_app_day SET devices = pg_temp.without_hashes(devices), viewers = pg_temp.without_hashes(viewers);

DROP FUNCTION pg_temp.without_hashes(hll);
