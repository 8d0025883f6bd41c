-- AdTally schema, part 16: a network's final earnings as the revenue of record (DESIGN §11).
--
-- Publishers are paid on the networks' figures. Per network, `revenue_source` says
-- whose revenue reports show for it:
-- - 'sdk' (the default): the SDKs' reported amounts and the rate card's estimates;
-- - 'network_when_final': for each app and day of the network's zone whose current
--   import is final (taken final_after_days or more after the day, without a
--   DATA_DELAYED warning), the network's earnings for that app and day, spread over
--   that day's impressions of the network in AdTally (ReportPlan.RecordDay); other
--   days keep the SDK's and rate card's amounts.
-- A report names the imports it used (notes), and `revenue_source=sdk` asks for the
-- SDK's amounts whatever the policy (what a reconciliation compares).
ALTER TABLE network_settings
    ADD COLUMN revenue_source text COLLATE "C" NOT NULL DEFAULT 'sdk' CHECK (revenue_source IN ('sdk', 'network_when_final'));
