-- A webhook's URL is itself a credential (a Slack or chat incoming-webhook URL holds
-- its token in the path): stored encrypted like the webhook's secret and the pulls'
-- credentials (pgp_sym_encrypt with ADTALLY_CREDENTIALS_KEY, else the servers' shared
-- key), and shown only redacted: scheme, host and its last 4 characters.
--
-- The key lives outside the database (or in server_secrets), so this file cannot
-- encrypt the URLs already stored: it adds the columns, and each server seals what is
-- left in plain text when it starts (AlertStore.sealPlainWebhooks), after which
-- webhook_url is NULL everywhere. Until then the plain column is still read.

-- The one redaction, for the rules, the deliveries and the sealing of old rows.
CREATE FUNCTION adtally_redact_url(url text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN substring(url FROM '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*') || '/...' || right(url, 4);

ALTER TABLE alert_rules
    ADD COLUMN webhook_url_sealed bytea,
    ADD COLUMN webhook_shown text,
    ALTER COLUMN webhook_url DROP NOT NULL,
    ADD CONSTRAINT alert_rules_webhook_kept CHECK (webhook_url IS NOT NULL OR (webhook_url_sealed IS NOT NULL AND webhook_shown IS NOT NULL));

ALTER TABLE alert_deliveries
    ADD COLUMN webhook_url_sealed bytea,
    ADD COLUMN webhook_shown text,
    ALTER COLUMN webhook_url DROP NOT NULL,
    DROP CONSTRAINT alert_deliveries_event_id_webhook_url_key,
    ADD CONSTRAINT alert_deliveries_webhook_kept CHECK (webhook_url IS NOT NULL OR (webhook_url_sealed IS NOT NULL AND webhook_shown IS NOT NULL));
-- A rule has one webhook: one delivery per event.
CREATE UNIQUE INDEX alert_deliveries_one_per_event ON alert_deliveries (event_id);
