import Hummingbird
import NIOCore

/// The OpenAPI 3.1 description of every endpoint, served at `/openapi.yaml`.
/// `OpenAPITests` checks real responses of each endpoint against it with a validator.
public enum OpenAPIDocument {
    /// Adds `GET /openapi.yaml`.
    public static func register(on router: Routes) {
        router.get("openapi.yaml") { _, _ in
            Response(status: .ok, headers: [.contentType: "application/yaml"], body: .init(byteBuffer: ByteBuffer(string: yaml)))
        }
    }

    /// The document.
    public static let yaml = #"""
openapi: 3.1.0
info:
  title: AdTally
  version: "1"
  description: >
    Self-hosted analytics and reporting for in-app advertising. Contract: DESIGN.md.
    Every error is RFC 9457 application/problem+json.
servers:
  - url: /
security:
  - bearer: []
paths:
  /healthz:
    get:
      summary: The process is up.
      security: []
      responses:
        "200": {description: Up, content: {application/json: {schema: {$ref: "#/components/schemas/Status"}}}}
  /readyz:
    get:
      summary: The database is reachable, rollups keep up, and reports find a connection.
      security: []
      responses:
        "200": {description: Ready, content: {application/json: {schema: {$ref: "#/components/schemas/Status"}}}}
        "503": {$ref: "#/components/responses/Problem"}
  /metrics:
    get:
      summary: Prometheus metrics.
      security: []
      responses:
        "200": {description: "Metrics in the Prometheus text format", content: {text/plain: {schema: {type: string}}}}
  /openapi.yaml:
    get:
      summary: This document.
      security: []
      responses:
        "200": {description: The document, content: {application/yaml: {schema: {type: string}}}}
  /v1/events:
    post:
      summary: Ingest events (an ingest key). A 200 means the accepted events are committed.
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [events]
              properties:
                events: {type: array, maxItems: 1000, items: {$ref: "#/components/schemas/Event"}}
          application/x-ndjson:
            schema: {type: string, description: One event object per line.}
      responses:
        "200":
          description: Valid events stored, duplicates counted, invalid ones listed.
          content:
            application/json:
              schema:
                type: object
                required: [accepted, duplicates, rejected]
                properties:
                  accepted: {type: integer, minimum: 0}
                  duplicates: {type: integer, minimum: 0}
                  rejected:
                    type: array
                    items:
                      type: object
                      required: [index, error]
                      properties:
                        index: {type: integer, minimum: 0}
                        id: {type: [string, "null"]}
                        error: {type: string}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "408": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
        "415": {$ref: "#/components/responses/Problem"}
        "503": {$ref: "#/components/responses/Problem"}
  /v1/client-drops:
    post:
      summary: "An app's queue reports events it dropped unsent (AdTallyKit, DESIGN §10): an ingest key; each report counts once by its id."
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [id, reason, dropped]
              properties:
                id: {type: string, format: uuid, description: Made once per report by the kit; a retry sends the same id.}
                reason: {type: string, enum: [queue_full, expired, damaged]}
                dropped: {type: integer, minimum: 1, maximum: 1000000000}
      responses:
        "200":
          description: Recorded, or already recorded (a retry).
          content:
            application/json:
              schema:
                type: object
                required: [recorded]
                properties:
                  recorded: {type: boolean, description: false when the id was recorded before.}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/mediation:
    get:
      summary: "The switch file of the key's own app (any key of one app, its ingest key too): the same answer as /v1/apps/{app}/mediation, for apps that ship only a key (AdTallyKit)."
      parameters:
        - {$ref: "#/components/parameters/SwitchPlacement"}
        - {$ref: "#/components/parameters/SwitchCountry"}
        - {$ref: "#/components/parameters/IfNoneMatch"}
      responses:
        "200": {$ref: "#/components/responses/Switch"}
        "304": {$ref: "#/components/responses/SwitchCurrent"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "503": {$ref: "#/components/responses/Problem"}
  /v1/apps:
    get:
      summary: The apps the key may read (a read key sees its own).
      responses:
        "200":
          description: Apps.
          content:
            application/json:
              schema:
                type: object
                required: [apps]
                properties:
                  apps: {type: array, items: {$ref: "#/components/schemas/App"}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    post:
      summary: Create an app (an admin key).
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [app]
              properties:
                app: {type: string, pattern: "^[a-z0-9][a-z0-9_.-]{0,63}$"}
                name: {type: string}
                timezone: {type: string, description: "IANA zone, fixed once created."}
                currency: {type: string, pattern: "^[A-Z]{3}$"}
      responses:
        "201": {description: Created, content: {application/json: {schema: {$ref: "#/components/schemas/App"}}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "409": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/apps/{app}/networks:
    parameters:
      - {name: app, in: path, required: true, schema: {type: string}}
    get:
      summary: The networks the app's events may name (a read key of the app, or an admin key); events naming any other count as other.
      responses:
        "200": {description: The declared list (null when none) and the networks admitted., content: {application/json: {schema: {$ref: "#/components/schemas/AppNetworks"}}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
    put:
      summary: Declare the app's networks (an admin key); null drops the list, and the first 64 networks seen are admitted again.
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [networks]
              properties:
                networks:
                  type: [array, "null"]
                  maxItems: 64
                  items: {type: string, pattern: "^[a-z0-9_.-]{1,32}$"}
      responses:
        "200": {description: The list as stored., content: {application/json: {schema: {$ref: "#/components/schemas/AppNetworks"}}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/apps/{app}/keys:
    parameters:
      - {name: app, in: path, required: true, schema: {type: string}}
    get:
      summary: The app's keys, without secrets (an admin key).
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "200":
          description: Keys.
          content:
            application/json:
              schema:
                type: object
                required: [keys]
                properties:
                  keys: {type: array, items: {$ref: "#/components/schemas/Key"}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
    post:
      summary: Create an ingest or read key (an admin key); the secret is shown once.
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [scope]
              properties:
                scope: {type: string, enum: [ingest, read]}
      responses:
        "201":
          description: The key and its secret.
          content:
            application/json:
              schema:
                type: object
                required: [id, secret, scope]
                properties:
                  id: {type: string}
                  secret: {type: string, pattern: "^atk_[0-9a-f]{48}$"}
                  app: {type: [string, "null"]}
                  scope: {type: string, enum: [ingest, read, admin]}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/keys/{id}:
    parameters:
      - {name: id, in: path, required: true, schema: {type: string}}
    delete:
      summary: Revoke a key (an admin key).
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "204": {description: Revoked.}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/reports:
    get:
      summary: A report (DESIGN §4), as JSON pages or streamed CSV.
      description: >
        A read key reads its own app, an admin key every app. Besides the parameters
        below, any dimension name is a filter (network=admob,iad). `format` is the
        output (json, csv) or, with an ad format's name, a filter on the ad format.
      parameters:
        - {name: apps, in: query, schema: {type: string}, description: "Comma-separated app ids (default: all the key may read)."}
        - {name: from, in: query, schema: {type: string, format: date}, description: "First day, in tz."}
        - {name: to, in: query, schema: {type: string, format: date}, description: "Last day, inclusive."}
        - {name: days, in: query, schema: {type: integer, minimum: 1, maximum: 3700}, description: "The N whole days before today (instead of from/to)."}
        - {name: tz, in: query, schema: {type: string}, description: "IANA zone (default: the apps' own; several zones: UTC)."}
        - {name: dimensions, in: query, schema: {type: string}, description: "Comma-separated: app date hour week month network placement format size country platform os_version app_version error_code revenue_precision (precise, estimated, publisher_provided or unknown on events with reported revenue; null on others)."}
        - {name: metrics, in: query, schema: {type: string}, description: "Comma-separated metrics of DESIGN §3 (sessions among them), also reported_revenue and estimated_revenue, and the audience: active_devices, ad_viewers, dau, dav, engagement_rate, arpdau, arpdav, impressions_per_dau, impressions_per_dav, sessions_per_dau (dau and the averages over it need a day: not with hour), and precise_revenue_share (reported revenue called precise / revenue; read from raw events), network_revenue (the part of revenue that is networks' final earnings) and revenue_source (sdk, network or mixed: whose figures the row's revenue is) (default: requests,impressions,fill_rate,taps,ctr,revenue,ecpm)."}
        - {name: currency, in: query, schema: {type: string, pattern: "^[A-Z]{3}$"}}
        - {name: sort, in: query, schema: {type: string}, description: "Comma-separated dimensions or metrics, - for descending."}
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 100000}}
        - {name: cursor, in: query, schema: {type: string}, description: next_cursor of the previous page.}
        - {name: compare, in: query, schema: {type: string, enum: [previous_period, year_over_year]}}
        - {name: format, in: query, schema: {type: string}, description: "json or csv (or an ad-format filter)."}
        - {name: revenue_source, in: query, schema: {type: string, enum: [of_record, sdk], default: of_record}, description: "of_record: each network's policy (its final earnings for its final days where it is network_when_final); sdk: the SDKs' reported and the rate card's estimated amounts for every day."}
        - {name: network, in: query, schema: {type: string}, description: A filter; every dimension name works the same way.}
      responses:
        "200":
          description: The report.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/Report"}
            text/csv:
              schema: {type: string, description: "RFC 4180, header row, CRLF; formula-like text cells start with '."}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "422": {$ref: "#/components/responses/Problem"}
        "429": {$ref: "#/components/responses/Problem"}
        "503": {$ref: "#/components/responses/Problem"}
  /v1/rates:
    get:
      summary: The rate card (any read key).
      parameters:
        - {name: network, in: query, schema: {type: string, pattern: "^[a-z0-9_.-]{1,32}$"}, description: Only this network.}
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "200":
          description: Entries by network, format, country and date.
          content:
            application/json:
              schema:
                type: object
                required: [rates]
                properties:
                  rates: {type: array, items: {$ref: "#/components/schemas/Rate"}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    post:
      summary: Add or replace rate card entries (an admin key), all or none; re-prices reports at once.
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [rates]
              properties:
                rates: {type: array, items: {$ref: "#/components/schemas/Rate"}}
          text/csv:
            schema: {type: string, description: "Header network,format,country,currency,cpm,cpt,effective_from (country * for any)."}
      responses:
        "200":
          description: Stored.
          content:
            application/json:
              schema: {type: object, required: [stored], properties: {stored: {type: integer}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
    delete:
      summary: Delete one entry (an admin key).
      parameters:
        - {name: network, in: query, required: true, schema: {type: string}}
        - {name: format, in: query, required: true, schema: {type: string}}
        - {name: country, in: query, schema: {type: string}, description: "A country, or * (default)."}
        - {name: effective_from, in: query, required: true, schema: {type: string, format: date}}
      responses:
        "204": {description: Deleted.}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/fx:
    get:
      summary: Daily FX rates (any read key), a page at a time in the order of day, currency and base.
      parameters:
        - {name: currency, in: query, schema: {type: string}, description: "An ISO 4217 code, either case."}
        - {name: base, in: query, schema: {type: string}, description: "An ISO 4217 code, either case."}
        - {name: from, in: query, schema: {type: string, format: date}, description: "Default: 30 days before to."}
        - {name: to, in: query, schema: {type: string, format: date}, description: "Default: 30 days after from, or today (UTC)."}
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000, default: 1000}}
        - {name: cursor, in: query, schema: {type: string}, description: "next_cursor of the previous page."}
      responses:
        "200":
          description: Rates by date, currency and base; next_cursor continues them, null after the last page.
          content:
            application/json:
              schema:
                type: object
                required: [rates, from, to, next_cursor]
                properties:
                  rates: {type: array, items: {$ref: "#/components/schemas/FXRate"}}
                  from: {type: string, format: date}
                  to: {type: string, format: date}
                  next_cursor: {type: [string, "null"]}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    post:
      summary: Import FX rates (an admin key), all or none.
      parameters:
        - {name: base, in: query, schema: {type: string}, description: "CSV bodies: the currency the rates are per one unit of (default EUR)."}
        - {name: fill_gaps, in: query, schema: {type: boolean}, description: "CSV bodies: carry each rate over up to 7 following days without one."}
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [rates]
              properties:
                base: {type: string, pattern: "^[A-Z]{3}$"}
                fill_gaps: {type: boolean}
                rates:
                  type: array
                  items:
                    type: object
                    required: [date, currency, rate]
                    properties:
                      date: {type: string, format: date}
                      currency: {type: string, pattern: "^[A-Z]{3}$"}
                      rate: {type: [string, number]}
          text/csv:
            schema: {type: string, description: "date,currency,rate, or the ECB's daily reference CSV (Date,USD,JPY,…)."}
      responses:
        "200":
          description: Imported.
          content:
            application/json:
              schema: {type: object, required: [stored, carried], properties: {stored: {type: integer}, carried: {type: integer}, first_day: {type: [string, "null"], format: date}, last_day: {type: [string, "null"], format: date}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
    delete:
      summary: Delete one day's rate of a currency (an admin key).
      parameters:
        - {name: date, in: query, required: true, schema: {type: string, format: date}}
        - {name: currency, in: query, required: true, schema: {type: string}}
        - {name: base, in: query, schema: {type: string}, description: "Default EUR."}
      responses:
        "204": {description: Deleted.}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/reconciliation:
    get:
      summary: "The networks' imported reports beside AdTally's counts (any read key, its apps): each network's days in its report's zone, discrepancy = (1 - ours / network) x 100 %, flagged beyond the network's tolerance."
      parameters:
        - {name: apps, in: query, schema: {type: string}, description: Comma-separated app ids (default every app the key reads).}
        - {name: from, in: query, schema: {type: string, format: date}}
        - {name: to, in: query, schema: {type: string, format: date}}
        - {name: days, in: query, schema: {type: integer, minimum: 1, maximum: 3700}, description: "The N whole days before today (UTC)."}
        - {name: dimensions, in: query, schema: {type: string}, description: "Any of date, app, network, format, country (default date,app,network,format)."}
        - {name: currency, in: query, schema: {type: string}, description: "ISO 4217; the networks' amounts are converted on their day with the FX table."}
        - {name: format, in: query, schema: {type: string}, description: "json or csv (or an ad-format filter)."}
        - {name: network, in: query, schema: {type: string}, description: "A filter; app, format, country and date filter the same way."}
        - {name: date, in: query, schema: {type: string}, description: "Only these days (YYYY-MM-DD, comma-separated)."}
      responses:
        "200":
          description: The discrepancy report.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/Reconciliation"}
            text/csv:
              schema: {type: string, description: "RFC 4180, header row, CRLF."}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "422": {$ref: "#/components/responses/Problem"}
        "429": {$ref: "#/components/responses/Problem"}
  /v1/network-reports:
    get:
      summary: The imports of the networks' reports, newest first (an admin key).
      responses:
        "200":
          description: Imports.
          content:
            application/json:
              schema:
                type: object
                required: [imports]
                properties:
                  imports: {type: array, items: {$ref: "#/components/schemas/NetworkImport"}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    post:
      summary: "Import a network's own report (an admin key), all or none: AdMob's networkReport/mediationReport JSON stream, MAX's maxReport CSV or JSON, LevelPlay's reporting JSON, or the generic CSV."
      parameters:
        - {name: source, in: query, required: true, schema: {type: string, enum: [admob, max, levelplay, csv]}}
        - {name: timezone, in: query, schema: {type: string}, description: "The zone its days are in, when not the source's own."}
      requestBody:
        required: true
        content:
          application/json:
            schema: {description: "AdMob's, MAX's or LevelPlay's report as the network returns it (up to 32 MiB)."}
          text/csv:
            schema: {type: string, description: "MAX's CSV, or date,app,network,format,country,impressions,clicks,revenue,currency[,timezone]."}
      responses:
        "201":
          description: Imported.
          content:
            application/json:
              schema:
                type: object
                required: [import_id, source, timezone, lines, rows, apps, networks, replaced, warnings, left_out]
                properties:
                  import_id: {type: integer}
                  source: {type: string}
                  timezone: {type: string}
                  first_day: {type: [string, "null"], format: date}
                  last_day: {type: [string, "null"], format: date}
                  lines: {type: integer}
                  rows: {type: integer}
                  apps: {type: array, items: {type: string}}
                  networks: {type: array, items: {type: string}}
                  replaced: {type: integer, description: "App-network-days an earlier import had (restated)."}
                  warnings: {type: array, items: {type: string}}
                  left_out: {type: object, additionalProperties: {type: integer}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
        "429": {$ref: "#/components/responses/Problem"}
  /v1/network-mappings:
    get:
      summary: "The networks' names for apps and ad sources, mapped to AdTally's (an admin key)."
      parameters:
        - {name: source, in: query, schema: {type: string, enum: [admob, max, levelplay, csv]}}
      responses:
        "200":
          description: Mappings.
          content:
            application/json:
              schema:
                type: object
                required: [mappings]
                properties:
                  mappings: {type: array, items: {$ref: "#/components/schemas/NetworkMapping"}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    put:
      summary: "Add mappings (an admin key), all or none; a name mapped to another target already is refused."
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [mappings]
              properties:
                mappings: {type: array, items: {$ref: "#/components/schemas/NetworkMapping"}}
      responses:
        "200":
          description: Stored (new ones counted).
          content:
            application/json:
              schema: {type: object, required: [stored], properties: {stored: {type: integer}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
    delete:
      summary: Delete one mapping (an admin key).
      parameters:
        - {name: source, in: query, required: true, schema: {type: string, enum: [admob, max, levelplay, csv]}}
        - {name: kind, in: query, required: true, schema: {type: string, enum: [app, network]}}
        - {name: external, in: query, required: true, schema: {type: string}}
      responses:
        "204": {description: Deleted.}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/network-settings:
    get:
      summary: "Each network's tolerance and restatement window that differ from the defaults (10 %, 3 days) (an admin key)."
      responses:
        "200":
          description: Settings.
          content:
            application/json:
              schema:
                type: object
                required: [settings]
                properties:
                  settings: {type: array, items: {$ref: "#/components/schemas/NetworkSettings"}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
  /v1/network-settings/{network}:
    put:
      summary: "Set a network's tolerance (percent) and restatement window (days) (an admin key); what is not given is kept."
      parameters:
        - {name: network, in: path, required: true, schema: {type: string}}
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              properties:
                tolerance_pct: {type: number, minimum: 0.01, maximum: 100, description: "Percent, stored to 2 decimals."}
                final_after_days: {type: integer, minimum: 0, maximum: 60}
                revenue_source: {type: string, enum: [sdk, network_when_final], description: "Whose revenue reports show for the network: the SDKs' (default), or its own final earnings for its final days."}
      responses:
        "200":
          description: The network's settings now.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/NetworkSettings"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/network-pulls:
    get:
      summary: "The pulls from the networks' reporting APIs (an admin key); credentials are never shown."
      responses:
        "200":
          description: Pulls by name.
          content:
            application/json:
              schema: {type: object, required: [pulls], properties: {pulls: {type: array, items: {$ref: "#/components/schemas/NetworkPull"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
  /v1/network-pulls/runs:
    get:
      summary: "Pull runs, newest day first (an admin key)."
      parameters:
        - {name: pull, in: query, schema: {type: string}}
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        "200":
          description: Runs.
          content:
            application/json:
              schema: {type: object, required: [runs], properties: {runs: {type: array, items: {$ref: "#/components/schemas/NetworkPullRun"}}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
  /v1/network-pulls/{name}:
    put:
      summary: "Create or replace a pull (an admin key): the running server asks the endpoint each UTC day for yesterday and restatement_days before it, and imports the answer. The credential is stored encrypted and never returned."
      parameters:
        - {name: name, in: path, required: true, schema: {type: string}}
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [source, endpoint, credential]
              properties:
                source: {type: string, enum: [admob, max, levelplay]}
                endpoint: {type: string, description: "The reporting API's URL (http or https)."}
                credential: {type: string, description: "AdMob's or LevelPlay's bearer token, MAX's API key."}
                restatement_days: {type: integer, minimum: 0, maximum: 30}
      responses:
        "200":
          description: The pull.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/NetworkPull"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
    delete:
      summary: "Delete a pull and its runs (an admin key); its imports stay."
      parameters:
        - {name: name, in: path, required: true, schema: {type: string}}
      responses:
        "204": {description: Deleted.}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/network-pulls/{name}/run:
    post:
      summary: "Pull now (an admin key): today's run, again if it ended (the running one if it runs); the server's export runner takes it. A paused pull is a 409."
      parameters:
        - {name: name, in: path, required: true, schema: {type: string}}
      responses:
        "202":
          description: The run, pending (or running).
          content:
            application/json:
              schema: {$ref: "#/components/schemas/NetworkPullRun"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "409": {$ref: "#/components/responses/Problem"}
  /v1/alerts:
    get:
      summary: "Alert rules (an admin key), each with its apps' states: ok, firing or resolved, and the last evaluation's numbers."
      responses:
        "200":
          description: Rules by name.
          content:
            application/json:
              schema: {type: object, required: [alerts], properties: {alerts: {type: array, items: {$ref: "#/components/schemas/AlertRuleWithStates"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    post:
      summary: "Create a rule (an admin key): a report metric of each app, with any report filter, watched over the last whole hours against a threshold or against the same hours of the 4 same weekdays before (a change). The elected server evaluates it every every_seconds and POSTs each transition to the webhook, signed with X-AdTally-Signature (sha256=HMAC-SHA256 of the body, hex)."
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [name, apps, metric, condition, threshold, window_minutes, webhook]
              properties:
                name: {type: string, pattern: "^[a-z0-9][a-z0-9_-]{0,63}$"}
                apps: {type: array, items: {type: string}, minItems: 1, maxItems: 100}
                metric: {type: string, description: "A metric of GET /v1/reports that hours add up to (not the audience's device counts)."}
                filters: {type: object, additionalProperties: {type: string}, description: "Report filters, as GET /v1/reports takes them: {\"network\": \"admob\"}."}
                condition: {type: string, enum: [below, above, change_below, change_above]}
                threshold: {type: number, description: "The metric's value (money in the app's currency), or for a change a fraction: -0.3 is -30 %."}
                window_minutes: {type: integer, minimum: 60, maximum: 10080, multipleOf: 60}
                min_requests: {type: integer, minimum: 0, description: "Below this many requests in the window the rule neither fires nor resolves."}
                every_seconds: {type: integer, minimum: 60, maximum: 86400}
                renotify_minutes: {type: integer, minimum: 0, maximum: 43200, description: "While firing, notified again this often (0 never; default 720)."}
                webhook: {type: string, description: "http or https URL notifications are POSTed to."}
                secret: {type: string, minLength: 16, maxLength: 256, description: "The signing secret; without it one is made and returned once."}
                paused: {type: boolean}
      responses:
        "201":
          description: Created; `secret` only when AdTally made it (shown this once).
          content:
            application/json:
              schema:
                type: object
                required: [rule]
                properties:
                  rule: {$ref: "#/components/schemas/AlertRule"}
                  secret: {type: string}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "409": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/alerts/history:
    get:
      summary: "Every rule's transitions and tests, newest first, with the numbers that caused them and their deliveries (an admin key)."
      parameters:
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        "200": {$ref: "#/components/responses/AlertHistory"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
  /v1/alerts/{name}:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    get:
      summary: One rule and its apps' states (an admin key).
      responses:
        "200":
          description: The rule.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/AlertRuleWithStates"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
    delete:
      summary: Delete a rule with its states and history (an admin key).
      responses:
        "204": {description: Deleted.}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/alerts/{name}/pause:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    post:
      summary: Pause a rule; nothing is evaluated or sent while it is paused (an admin key).
      responses:
        "200": {description: The rule., content: {application/json: {schema: {$ref: "#/components/schemas/AlertRule"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/alerts/{name}/resume:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    post:
      summary: Resume a rule, evaluated at once (an admin key).
      responses:
        "200": {description: The rule., content: {application/json: {schema: {$ref: "#/components/schemas/AlertRule"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/alerts/{name}/test:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    post:
      summary: "Send a test notification to the rule's webhook now, signed as every notification is (an admin key): the delivery after this attempt. One that failed is retried by the evaluator with the same delivery id."
      responses:
        "200":
          description: The delivery.
          content:
            application/json:
              schema: {type: object, required: [delivery], properties: {delivery: {$ref: "#/components/schemas/AlertDelivery"}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/alerts/{name}/history:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    get:
      summary: "A rule's transitions and tests, newest first, with their numbers and deliveries (an admin key)."
      parameters:
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        "200": {$ref: "#/components/responses/AlertHistory"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/exports:
    get:
      summary: Export schedules (an admin key), with their next slots.
      responses:
        "200":
          description: Schedules by name.
          content:
            application/json:
              schema: {type: object, required: [exports], properties: {exports: {type: array, items: {$ref: "#/components/schemas/ExportSchedule"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    post:
      summary: Create a schedule (an admin key). An invalid cron, zone, query or unwritable folder is a 400 naming it.
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [name, cron, dir]
              properties:
                name: {type: string, pattern: "^[a-z0-9][a-z0-9_-]{0,63}$"}
                cron: {type: string, description: "5 fields (minute hour day-of-month month day-of-week) or @hourly, @daily, @weekly, @monthly, @yearly."}
                tz: {type: string, description: "IANA zone of the cron times and slot names (default UTC)."}
                format: {type: string, enum: [csv, json]}
                dir: {type: string, description: "Absolute destination directory on the servers; files go to DIR/NAME/NAME-YYYYMMDDTHHMM.csv."}
                query: {type: object, additionalProperties: {type: string}, description: "GET /v1/reports parameters (GET /v1/reconciliation's for kind reconciliation); days counts the whole days before the slot's day."}
                kind: {type: string, enum: [report, reconciliation], description: "What the files hold: a report (default) or the discrepancy report with the networks' imported reports."}
      responses:
        "201":
          description: Created.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/ExportSchedule"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "409": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/exports/runs:
    get:
      summary: Runs of every schedule, newest slot first (an admin key).
      parameters:
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        "200": {$ref: "#/components/responses/ExportRuns"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
  /v1/exports/{name}:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    get:
      summary: One schedule (an admin key).
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "200":
          description: The schedule.
          content:
            application/json:
              schema: {$ref: "#/components/schemas/ExportSchedule"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
    delete:
      summary: Delete a schedule and its run history; its files stay (an admin key).
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "204": {description: Deleted.}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/exports/{name}/pause:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    post:
      summary: Pause a schedule; slots due while paused are not written (an admin key).
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "200": {description: The schedule., content: {application/json: {schema: {$ref: "#/components/schemas/ExportSchedule"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/exports/{name}/resume:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    post:
      summary: Resume a schedule from its next slot on (an admin key).
      responses:
        "400": {$ref: "#/components/responses/Problem"}
        "200": {description: The schedule., content: {application/json: {schema: {$ref: "#/components/schemas/ExportSchedule"}}}}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/exports/{name}/run:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    post:
      summary: Queue the current minute's slot now, or with {"slot"} start a failed slot again (an admin key); the leading server writes it.
      requestBody:
        content:
          application/json:
            schema: {type: object, properties: {slot: {type: string, pattern: "^[0-9]{8}T[0-9]{4}$"}}}
      responses:
        "202": {description: Queued., content: {application/json: {schema: {$ref: "#/components/schemas/ExportRun"}}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "409": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
  /v1/exports/{name}/runs:
    parameters:
      - {name: name, in: path, required: true, schema: {type: string}}
    get:
      summary: A schedule's runs, newest slot first (an admin key).
      parameters:
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        "200": {$ref: "#/components/responses/ExportRuns"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/apps/{app}/mediation:
    parameters:
      - {name: app, in: path, required: true, schema: {type: string}}
    get:
      summary: "The app's ad-network switch file (DESIGN §9): any key of the app (its ingest key too) or an admin key."
      description: >
        Served from a decision the server refreshes in the background; the most specific policy
        wins (placement and country, placement, country, the app). A weighted policy draws each
        answer by weight; If-None-Match with a tag the client holds answers 304, so a client keeps its network.
      parameters:
        - {$ref: "#/components/parameters/SwitchPlacement"}
        - {$ref: "#/components/parameters/SwitchCountry"}
        - {$ref: "#/components/parameters/IfNoneMatch"}
      responses:
        "200": {$ref: "#/components/responses/Switch"}
        "304": {$ref: "#/components/responses/SwitchCurrent"}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "503": {$ref: "#/components/responses/Problem"}
  /v1/apps/{app}/mediation/policies:
    parameters:
      - {name: app, in: path, required: true, schema: {type: string}}
    get:
      summary: The app's mediation policies with the decision each serves (an admin key or the app's read key).
      responses:
        "200":
          description: Policies.
          content:
            application/json:
              schema:
                type: object
                required: [policies]
                properties:
                  policies:
                    type: array
                    items:
                      type: object
                      required: [policy, chosen, chosen_since, decided_at]
                      properties:
                        policy: {$ref: "#/components/schemas/MediationPolicy"}
                        chosen: {type: [string, "null"]}
                        chosen_since: {type: [string, "null"], format: date-time}
                        decided_at: {type: [string, "null"], format: date-time}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
    put:
      summary: Set (create or replace) the policy of a scope (an admin key); decided and served at once by this server.
      requestBody:
        required: true
        content:
          application/json:
            schema:
              type: object
              required: [rule]
              properties:
                placement: {type: [string, "null"], minLength: 1, maxLength: 64}
                country: {type: [string, "null"], pattern: "^[A-Za-z]{2}$"}
                rule: {type: string, enum: [pinned, weighted, automatic]}
                network: {type: string, description: "pinned: the network."}
                weights: {type: object, additionalProperties: {type: integer, minimum: 0, maximum: 1000000}, description: "weighted: network → weight."}
                networks: {type: array, items: {type: string}, description: "automatic: the networks it may choose (default any)."}
                default: {type: string, description: "automatic (required): served until a network has enough data."}
                window_hours: {type: integer, minimum: 1, maximum: 168}
                min_requests: {type: integer, minimum: 1, maximum: 1000000000}
                hysteresis: {type: number, minimum: 0, maximum: 10}
                rank_by: {type: string, enum: [rpm, arpdav], description: "automatic: rank by expected revenue per 1000 requests (default) or by ARPDAV, revenue per daily viewer of each network's ads (then window_hours must be whole days: the days before today)."}
                max_age_seconds: {type: integer, minimum: 0, maximum: 86400}
      responses:
        "200":
          description: The policy and its decision.
          content:
            application/json:
              schema:
                type: object
                required: [policy, chosen]
                properties:
                  policy: {$ref: "#/components/schemas/MediationPolicy"}
                  chosen: {type: [string, "null"]}
                  chosen_since: {type: [string, "null"], format: date-time}
                  decided_at: {type: [string, "null"], format: date-time}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "413": {$ref: "#/components/responses/Problem"}
    delete:
      summary: Delete the policy of a scope (an admin key); its requests fall to a broader policy.
      parameters:
        - {name: placement, in: query, schema: {type: string, minLength: 1, maxLength: 64}}
        - {name: country, in: query, schema: {type: string, pattern: "^[A-Za-z]{2}$"}}
      responses:
        "204": {description: Deleted.}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
  /v1/apps/{app}/mediation/history:
    parameters:
      - {name: app, in: path, required: true, schema: {type: string}}
    get:
      summary: "Every policy change and network switch of the app, newest first: what, when, from, to, why, by whom."
      parameters:
        - {name: limit, in: query, schema: {type: integer, minimum: 1, maximum: 10000}}
      responses:
        "200":
          description: Changes.
          content:
            application/json:
              schema:
                type: object
                required: [changes]
                properties:
                  changes:
                    type: array
                    items:
                      type: object
                      required: [at, app, kind, reason, actor]
                      properties:
                        at: {type: string, format: date-time}
                        app: {type: string}
                        placement: {type: [string, "null"]}
                        country: {type: [string, "null"]}
                        kind: {type: string, enum: [policy, deleted, switch]}
                        from: {type: [string, "null"]}
                        to: {type: [string, "null"]}
                        reason: {type: string}
                        actor: {type: string}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
  /dashboard:
    get:
      summary: The built-in dashboard (HTML with SVG charts), or its sign-in form without a session.
      description: A read or admin key, by session cookie (see /dashboard/login) or bearer; an ingest key is a 403.
      security: [{}, {bearer: []}, {session: []}]
      parameters:
        - {name: app, in: query, schema: {type: string}}
        - {name: from, in: query, schema: {type: string, format: date}}
        - {name: to, in: query, schema: {type: string, format: date}}
      responses:
        "200": {$ref: "#/components/responses/HTML"}
        "400": {$ref: "#/components/responses/HTML"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "422": {$ref: "#/components/responses/HTML"}
        "429": {$ref: "#/components/responses/Problem"}
  /dashboard/login:
    post:
      summary: Exchanges a read or admin key (form field `key`) for a signed session cookie.
      security: []
      requestBody:
        required: true
        content:
          application/x-www-form-urlencoded:
            schema: {type: object, required: [key], properties: {key: {type: string}}}
      responses:
        "303": {description: "Signed in: Set-Cookie adtally_session (HttpOnly, SameSite=Strict), Location /dashboard"}
        "401": {$ref: "#/components/responses/HTML"}
        "403": {description: "An ingest key (the form again), or a form from another origin", content: {text/html: {schema: {type: string}}, application/problem+json: {schema: {type: object, required: [status, detail]}}}}
        "413": {$ref: "#/components/responses/Problem"}
        "415": {$ref: "#/components/responses/Problem"}
  /dashboard/logout:
    post:
      summary: Clears the session cookie.
      security: []
      responses:
        "303": {description: "Signed out: the cookie cleared, Location /dashboard"}
        "403": {$ref: "#/components/responses/Problem"}
  /dashboard/report.csv:
    get:
      summary: The dashboard's table as CSV (the same report as GET /v1/reports).
      security: [{bearer: []}, {session: []}]
      parameters:
        - {name: app, in: query, schema: {type: string}}
        - {name: from, in: query, schema: {type: string, format: date}}
        - {name: to, in: query, schema: {type: string, format: date}}
      responses:
        "200": {description: RFC 4180 CSV, content: {text/csv: {schema: {type: string}}}}
        "400": {$ref: "#/components/responses/Problem"}
        "401": {$ref: "#/components/responses/Problem"}
        "403": {$ref: "#/components/responses/Problem"}
        "404": {$ref: "#/components/responses/Problem"}
        "422": {$ref: "#/components/responses/Problem"}
        "429": {$ref: "#/components/responses/Problem"}
components:
  parameters:
    SwitchPlacement: {name: placement, in: query, schema: {type: string, minLength: 1, maxLength: 64}}
    SwitchCountry: {name: country, in: query, schema: {type: string, pattern: "^[A-Za-z]{2}$"}}
    IfNoneMatch: {name: If-None-Match, in: header, schema: {type: string}}
  securitySchemes:
    bearer: {type: http, scheme: bearer}
    session: {type: apiKey, in: cookie, name: adtally_session}
  responses:
    Switch:
      description: "The switch file: enable_advertising first, then why."
      headers:
        ETag: {required: true, schema: {type: string}}
        Cache-Control: {required: true, schema: {type: string, pattern: "^max-age=[0-9]+$"}}
      content: {application/json: {schema: {$ref: "#/components/schemas/MediationAnswer"}}}
    SwitchCurrent:
      description: The client's answer is current.
      headers:
        ETag: {required: true, schema: {type: string}}
        Cache-Control: {required: true, schema: {type: string}}
    HTML:
      description: An HTML page.
      content:
        text/html: {schema: {type: string}}
    AlertHistory:
      description: Events, newest first.
      content:
        application/json:
          schema: {type: object, required: [events], properties: {events: {type: array, items: {$ref: "#/components/schemas/AlertEvent"}}}}
    ExportRuns:
      description: Runs.
      content:
        application/json:
          schema: {type: object, required: [runs], properties: {runs: {type: array, items: {$ref: "#/components/schemas/ExportRun"}}}}
    Problem:
      description: RFC 9457 problem details.
      content:
        application/problem+json:
          schema:
            type: object
            required: [type, title, status, detail]
            properties:
              type: {type: string}
              title: {type: string}
              status: {type: integer}
              detail: {type: string}
              instance: {type: string}
  schemas:
    AppNetworks:
      type: object
      required: [app, declared, admitted, limit]
      properties:
        app: {type: string}
        declared: {type: [array, "null"], items: {type: string}}
        admitted: {type: array, items: {type: string}}
        limit: {type: integer}
    Status:
      type: object
      required: [status]
      properties:
        status: {type: string}
    App:
      type: object
      required: [app, name, timezone, currency, created_at]
      properties:
        app: {type: string}
        name: {type: string}
        timezone: {type: string}
        currency: {type: string}
        created_at: {type: string, format: date-time}
    Key:
      type: object
      required: [id, scope, created_at]
      properties:
        id: {type: string}
        app: {type: [string, "null"]}
        scope: {type: string, enum: [ingest, read, admin]}
        created_at: {type: string, format: date-time}
        revoked_at: {type: [string, "null"], format: date-time}
    Rate:
      type: object
      required: [network, format, currency, effective_from]
      properties:
        network: {type: string, pattern: "^[a-z0-9_.-]{1,32}$"}
        format: {type: string, enum: [banner, interstitial, native, rewarded]}
        country: {type: string, description: "ISO 3166-1 alpha-2, or * for any country."}
        currency: {type: string, pattern: "^[A-Z]{3}$"}
        cpm: {type: [string, number], description: "Per thousand impressions, a decimal of the currency."}
        cpt: {type: [string, number], description: "Per tap."}
        effective_from: {type: string, format: date, description: "First UTC date it prices; until the same key's next date."}
    ExportSchedule:
      type: object
      required: [name, kind, query, format, cron, tz, dir, paused, skipped_slots, next_slots]
      properties:
        name: {type: string}
        kind: {type: string, enum: [report, reconciliation]}
        query: {type: object, additionalProperties: {type: string}}
        format: {type: string, enum: [csv, json]}
        cron: {type: string}
        tz: {type: string}
        dir: {type: string}
        paused: {type: boolean}
        created_at: {type: string, format: date-time}
        skipped_slots: {type: integer, description: "Slots missed by more than the catch-up limit, never written."}
        last_skipped: {type: [string, "null"]}
        next_slots:
          type: array
          items: {type: object, required: [slot, due_at], properties: {slot: {type: string}, due_at: {type: string, format: date-time}}}
    ExportRun:
      type: object
      required: [schedule, slot, pass, due_at, status, trigger, attempts, next_attempt_at]
      properties:
        schedule: {type: string}
        slot: {type: string, description: "YYYYMMDDTHHMM in the schedule's zone."}
        pass: {type: integer, enum: [1, 2], description: "2: the file written again once its days are final."}
        due_at: {type: string, format: date-time}
        status: {type: string, enum: [pending, running, retrying, succeeded, failed]}
        trigger: {type: string, enum: [schedule, manual, final]}
        attempts: {type: integer}
        next_attempt_at: {type: string, format: date-time}
        runner: {type: [string, "null"]}
        started_at: {type: [string, "null"], format: date-time}
        finished_at: {type: [string, "null"], format: date-time}
        duration_ms: {type: [integer, "null"]}
        rows: {type: [integer, "null"]}
        bytes: {type: [integer, "null"]}
        sha256: {type: [string, "null"]}
        file: {type: [string, "null"]}
        file_status: {type: [string, "null"], enum: [provisional, final, null]}
        final_due_at: {type: [string, "null"], format: date-time}
        error: {type: [string, "null"]}
    MediationPolicy:
      type: object
      required: [app, placement, country, rule, window_hours, min_requests, hysteresis, max_age_seconds]
      properties:
        app: {type: string}
        placement: {type: [string, "null"], description: "null: every placement."}
        country: {type: [string, "null"], description: "null: every country."}
        rule: {type: string, enum: [pinned, weighted, automatic]}
        network: {type: [string, "null"]}
        weights: {type: [object, "null"], additionalProperties: {type: integer}}
        networks: {type: array, items: {type: string}}
        default: {type: [string, "null"]}
        window_hours: {type: integer}
        min_requests: {type: integer}
        hysteresis: {type: number}
        rank_by: {type: string, enum: [rpm, arpdav]}
        max_age_seconds: {type: integer}
        updated_at: {type: [string, "null"], format: date-time}
    MediationAnswer:
      type: object
      required: [enable_advertising, weights, rule, decided_by, reason, policy, window, networks, chosen_since, decided_at]
      properties:
        enable_advertising: {type: string, description: "The network to show (the key apps already read; always first)."}
        weights: {type: object, additionalProperties: {type: number}, description: "Network → share of launches."}
        rule: {type: string, enum: [pinned, weighted, automatic]}
        decided_by: {type: string, enum: [pinned, weighted, best, kept, last_choice, default]}
        reason: {type: string}
        policy: {$ref: "#/components/schemas/MediationPolicy"}
        window:
          type: object
          required: [hours, from, to, currency, min_requests]
          properties:
            hours: {type: integer}
            from: {type: string, format: date-time}
            to: {type: string, format: date-time}
            currency: {type: string}
            min_requests: {type: integer}
        networks:
          type: array
          items:
            type: object
            required: [network, requests, impressions, fill_rate, ecpm, rpm, revenue, trusted]
            properties:
              network: {type: string}
              requests: {type: integer}
              impressions: {type: integer}
              fill_rate: {type: [number, "null"]}
              ecpm: {type: [string, "null"]}
              rpm: {type: [string, "null"], description: "Expected revenue per 1000 requests: fill × eCPM."}
              arpdav: {type: [string, "null"], description: "Present when the policy ranks by ARPDAV: the network's revenue per daily viewer of its ads (null: none)."}
              revenue: {type: string}
              trusted: {type: boolean, description: "It had the policy's minimum requests in the window."}
        chosen_since: {type: string, format: date-time}
        decided_at: {type: string, format: date-time}
    FXRate:
      type: object
      required: [date, base, currency, rate]
      properties:
        date: {type: string, format: date}
        base: {type: string}
        currency: {type: string}
        rate: {type: string, description: "Units of currency per one unit of base."}
        carried_from: {type: [string, "null"], format: date, description: "Set when not published for the date but carried from this earlier one."}
    Event:
      type: object
      description: "One step of an ad slot's life (DESIGN §2). A session (the app came to the foreground) names no network, format, placement or size; every other type names a network and a format."
      required: [id, type, occurred_at]
      if: {properties: {type: {const: session}}, required: [type]}
      then: {not: {anyOf: [{required: [network]}, {required: [format]}, {required: [placement]}, {required: [size]}]}}
      else: {required: [network, format]}
      properties:
        id: {type: string, format: uuid}
        type: {type: string, enum: [request, load, impression, tap, action_cancel, expiry, error, session]}
        occurred_at: {type: string, format: date-time}
        network: {type: string, pattern: "^[a-z0-9_.-]{1,32}$"}
        format: {type: string, enum: [banner, interstitial, native, rewarded]}
        placement: {type: string, minLength: 1, maxLength: 64}
        size: {type: string}
        country: {type: string}
        platform: {type: string, enum: [ios, ipados, android, other]}
        os_version: {type: string, maxLength: 32}
        app_version: {type: string, maxLength: 32}
        device: {type: string, maxLength: 64}
        revenue_micros: {type: integer, minimum: 0, maximum: 1000000000000000}
        currency: {type: string}
        revenue_precision: {type: string, enum: [precise, estimated, publisher_provided, unknown], description: "How the SDK knew revenue_micros; only with it. Absent: unknown."}
        error_code: {type: integer}
        will_leave: {type: boolean}
        shown: {type: boolean}
        app: {type: string}
    NetworkImport:
      type: object
      required: [import_id, source, timezone, lines, is_delayed, warnings, via, imported_at, current]
      properties:
        import_id: {type: integer}
        source: {type: string, enum: [admob, max, levelplay, csv]}
        timezone: {type: string}
        first_day: {type: [string, "null"], format: date}
        last_day: {type: [string, "null"], format: date}
        lines: {type: integer}
        is_delayed: {type: boolean}
        warnings: {type: array, items: {type: string}}
        via: {type: string, enum: [api, cli, pull]}
        imported_at: {type: string, format: date-time}
        current: {type: integer, description: "App-network-days it is the current import for."}
    NetworkMapping:
      type: object
      required: [source, kind, external, target]
      properties:
        source: {type: string, enum: [admob, max, levelplay, csv]}
        kind: {type: string, enum: [app, network]}
        external: {type: string, minLength: 1, maxLength: 200}
        target: {type: string, minLength: 1, maxLength: 64}
    AlertRule:
      type: object
      required: [name, apps, metric, filters, condition, threshold, window_minutes, min_requests, every_seconds, renotify_minutes, webhook, paused]
      properties:
        name: {type: string}
        apps: {type: array, items: {type: string}}
        metric: {type: string}
        filters: {type: object, additionalProperties: {type: string}}
        condition: {type: string, enum: [below, above, change_below, change_above]}
        threshold: {type: number}
        window_minutes: {type: integer}
        min_requests: {type: integer}
        every_seconds: {type: integer}
        renotify_minutes: {type: integer}
        webhook: {type: string}
        paused: {type: boolean}
        created_at: {type: string, format: date-time}
        updated_at: {type: string, format: date-time}
    AlertRuleWithStates:
      allOf:
        - {$ref: "#/components/schemas/AlertRule"}
        - type: object
          required: [states]
          properties:
            states: {type: array, items: {$ref: "#/components/schemas/AlertState"}}
    AlertState:
      type: object
      required: [rule, app, state, since]
      properties:
        rule: {type: string}
        app: {type: string}
        state: {type: string, enum: [ok, firing, resolved]}
        since: {type: string, format: date-time}
        notified_at: {type: [string, "null"], format: date-time}
        evaluated_at: {type: [string, "null"], format: date-time}
        value: {type: [number, "null"]}
        baseline: {type: [number, "null"]}
        requests: {type: [integer, "null"]}
        window_from: {type: [string, "null"], format: date-time}
        window_to: {type: [string, "null"], format: date-time}
        note: {type: [string, "null"], description: "Why the last evaluation decided nothing (thin volume, no baseline, an unreadable report)."}
    AlertDelivery:
      type: object
      required: [id, webhook, status, attempts]
      properties:
        id: {type: string, format: uuid, description: "Sent as X-AdTally-Delivery and delivery_id; the same on every attempt."}
        webhook: {type: string}
        status: {type: string, enum: [pending, sending, retrying, delivered, failed]}
        attempts: {type: integer}
        last_status: {type: [integer, "null"]}
        error: {type: [string, "null"]}
        next_attempt_at: {type: [string, "null"], format: date-time}
        delivered_at: {type: [string, "null"], format: date-time}
    AlertEvent:
      type: object
      required: [id, rule, kind, at, deliveries]
      properties:
        id: {type: integer}
        rule: {type: string}
        app: {type: [string, "null"]}
        kind: {type: string, enum: [firing, resolved, renotify, test]}
        at: {type: string, format: date-time}
        value: {type: [number, "null"]}
        baseline: {type: [number, "null"]}
        requests: {type: [integer, "null"]}
        window_from: {type: [string, "null"], format: date-time}
        window_to: {type: [string, "null"], format: date-time}
        evaluator: {type: [string, "null"]}
        deliveries: {type: array, items: {$ref: "#/components/schemas/AlertDelivery"}}
    NetworkPull:
      type: object
      required: [name, source, endpoint, restatement_days, paused]
      properties:
        name: {type: string}
        source: {type: string, enum: [admob, max, levelplay]}
        endpoint: {type: string}
        restatement_days: {type: integer}
        paused: {type: boolean}
    NetworkPullRun:
      type: object
      required: [pull, day, status, trigger, attempts]
      properties:
        pull: {type: string}
        day: {type: string, format: date}
        status: {type: string, enum: [pending, running, retrying, succeeded, failed]}
        trigger: {type: string, enum: [schedule, manual]}
        attempts: {type: integer}
        first_day: {type: [string, "null"], format: date}
        last_day: {type: [string, "null"], format: date}
        import_id: {type: [integer, "null"]}
        lines: {type: [integer, "null"]}
        error: {type: [string, "null"]}
        finished_at: {type: [string, "null"], format: date-time}
    NetworkSettings:
      type: object
      required: [network, tolerance_pct, final_after_days, revenue_source]
      properties:
        network: {type: string}
        tolerance_pct: {type: number}
        final_after_days: {type: integer}
        revenue_source: {type: string, enum: [sdk, network_when_final]}
    Reconciliation:
      type: object
      required: [query, columns, rows, notes]
      properties:
        query:
          type: object
          required: [apps, from, to, dimensions, filters, currency]
          properties:
            apps: {type: array, items: {type: string}}
            from: {type: string, format: date}
            to: {type: string, format: date}
            dimensions: {type: array, items: {type: string, enum: [date, app, network, format, country]}}
            filters: {type: object, additionalProperties: {type: array, items: {type: string}}}
            currency: {type: string}
        columns:
          type: array
          items:
            type: object
            required: [name, type]
            properties:
              name: {type: string}
              type: {type: string, enum: [string, date, integer, number, money, boolean]}
        rows:
          type: array
          items:
            type: array
            items: {type: [string, number, integer, boolean, "null"]}
        notes:
          type: object
          required: [formula, networks, imports, days_not_final, remarks]
          properties:
            formula: {type: string}
            networks:
              type: array
              items:
                type: object
                required: [network, timezone, tolerance_pct, final_after_days]
                properties:
                  network: {type: string}
                  timezone: {type: string}
                  tolerance_pct: {type: number}
                  final_after_days: {type: integer}
            imports:
              type: array
              items:
                type: object
                required: [id, source, timezone, imported_at, warnings]
                properties:
                  id: {type: integer}
                  source: {type: string}
                  timezone: {type: string}
                  imported_at: {type: string, format: date-time}
                  warnings: {type: array, items: {type: string}}
            days_not_final: {type: array, items: {type: string, format: date}}
            remarks: {type: array, items: {type: string}}
    Report:
      type: object
      required: [query, columns, rows, totals, notes, next_cursor]
      properties:
        query:
          type: object
          required: [apps, from, to, tz, dimensions, metrics, filters, currency, sort, limit, compare, format]
          properties:
            apps: {type: array, items: {type: string}}
            from: {type: string, format: date}
            to: {type: string, format: date}
            tz: {type: string}
            dimensions: {type: array, items: {type: string}}
            metrics: {type: array, items: {type: string}}
            filters: {type: object, additionalProperties: {type: array, items: {type: string}}}
            currency: {type: string}
            sort: {type: string}
            limit: {type: [integer, "null"]}
            compare: {type: [string, "null"], enum: [previous_period, year_over_year, null]}
            format: {type: string, enum: [json, csv]}
        columns:
          type: array
          items:
            type: object
            required: [name, type]
            properties:
              name: {type: string}
              type: {type: string, enum: [string, date, month, timestamp, integer, ratio, number, money, money_per_device, change]}
        rows:
          type: array
          items:
            type: array
            items: {type: [string, number, integer, "null"]}
        totals:
          type: object
          additionalProperties: {type: [string, number, integer, "null"]}
        notes:
          type: object
          required: [timezone, currency, source, read_from, replica_lag_seconds, day_lengths, provisional_days, cut_periods, approximate, estimated, money]
          properties:
            timezone: {type: string}
            currency: {type: string}
            source: {type: string}
            read_from: {type: string, enum: [primary, replica], description: "The database server that answered: a streaming replica (DATABASE_READ_URL) while it lags at most ADTALLY_READ_MAX_LAG_SECONDS, else the primary."}
            replica_lag_seconds: {type: [number, "null"], minimum: 0, description: "How far behind the primary the replica was when the report started, at most (its replay lag at the last probe, at most a second earlier, plus the time since); null when read from the primary."}
            replica_skipped: {type: string, description: "Present when a replica is configured but this report was read from the primary: why (lag over the bound, unreachable, not a standby, a query it cancelled)."}
            day_lengths:
              type: array
              items:
                type: object
                required: [date, hours]
                properties:
                  date: {type: string, format: date}
                  hours: {type: number}
            provisional_days: {type: array, items: {type: string, format: date}}
            cut_periods: {type: array, items: {type: string}}
            approximate: {type: array, items: {type: string}}
            estimated: {type: array, items: {type: string}, description: "How much revenue is estimated from the rate card, and unpriced events no entry priced."}
            revenue_of_record: {type: array, items: {type: string}, description: "Per app and network, the days whose revenue is the network's final earnings and the imports they come from (DESIGN §11)."}
            money: {type: array, items: {type: string}, description: "How amounts are converted and rounded (when a money metric is asked for)."}
            incomplete: {type: array, items: {type: string}, description: "Present when raw-served days lie before the oldest raw events kept."}
        next_cursor: {type: [string, "null"]}
"""#
}
