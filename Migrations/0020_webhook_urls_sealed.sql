-- A webhook's URL is itself a credential (a Slack or chat incoming-webhook URL holds
-- its token in the path): stored encrypted like the webhook's secret and the pulls'
-- credentials (pgp_sym_encrypt with ADTALLY_CREDENTIALS_KEY, else the servers' shared
-- key), and shown only redacted: scheme, host and its last 4 characters.
--
-- The key lives outside the database (or in server_secrets), so this file cannot
-- encrypt the URLs already stored. A finished delivery (delivered or failed) is never
-- sent again and needs no URL: this file keeps only its redacted form. The rules and
-- the deliveries still to send (a handful) are sealed by the first server that starts
-- (AlertStore.sealPlainWebhooks; 500,000 deliveries took 159 s to encrypt, the rules
-- and the unfinished ones take milliseconds); until then the plain column is read.

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
    ADD CONSTRAINT alert_deliveries_webhook_kept CHECK (
        webhook_url IS NOT NULL OR (webhook_shown IS NOT NULL AND (webhook_url_sealed IS NOT NULL OR status IN ('delivered', 'failed')))
    );
-- A rule has one webhook: one delivery per event.
CREATE UNIQUE INDEX alert_deliveries_one_per_event ON alert_deliveries (event_id);

UPDATE alert_deliveries SET webhook_shown = adtally_redact_url(webhook_url), webhook_url = NULL
WHERE webhook_url IS NOT NULL AND status IN ('delivered', 'failed');
-- What a starting server looks for, without reading every delivery each time.
CREATE INDEX alert_deliveries_plain ON alert_deliveries (delivery_id) WHERE webhook_url IS NOT NULL;
