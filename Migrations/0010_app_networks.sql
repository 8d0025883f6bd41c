-- AdTally schema, part 10: an app's networks are a known, bounded set (DESIGN §2).
--
-- The ingest key ships inside the app, so anyone can send events naming networks
-- nobody wired in: 30 requests named 30,000 of them, and every report, the
-- dashboard and the mediation answer grew with them. So a network is named in the
-- data only once it is admitted for its app: when the app declares its networks
-- (`apps.networks`, set with `adtally apps networks APP --set a,b,c` or PUT
-- /v1/apps/{app}/networks), exactly those; otherwise the first 64 seen. Events
-- naming any other network are stored and counted under `other`, never dropped.
ALTER TABLE apps ADD COLUMN networks text[];

-- The networks admitted per app (EventStore reads it for a network it has not seen
-- yet and admits it while the app has fewer than 64; declared lists are enforced
-- here too). Small: at most 64 rows an app.
CREATE TABLE app_networks (
    app_id     text COLLATE "C" NOT NULL REFERENCES apps (app_id) ON DELETE CASCADE,
    network    text COLLATE "C" NOT NULL,
    first_seen timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (app_id, network)
);

-- The networks an app already reported are admitted: its 64 busiest by requests in
-- the last 30 days, so networks retired long ago do not take the places (their
-- history keeps its names either way; only new events are mapped).
INSERT INTO app_networks (app_id, network)
SELECT app_id, network FROM (
    SELECT app_id, network, row_number() OVER (PARTITION BY app_id ORDER BY sum(requests) DESC, network) AS rank
    FROM rollup_day_compacted WHERE network <> 'other' AND day >= current_date - 30 GROUP BY app_id, network
) AS seen
WHERE rank <= 64
ON CONFLICT DO NOTHING;
