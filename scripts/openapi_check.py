#!/usr/bin/env python3
"""Checks real responses of every AdTally endpoint against the server's own /openapi.yaml.

Usage: openapi_check.py BASE_URL ADMIN_KEY

Creates an app and keys, sends events, asks for reports (JSON, CSV, errors) and
validates each request/response pair with openapi-core (OpenAPI 3.1, JSON Schema
2020-12): status code documented, content type documented, body matching its schema.
Exits 1 listing every mismatch; prints what it checked.
"""
import copy
import gzip
import json
import shutil
import sys
import tempfile
import uuid
from datetime import datetime, timezone

import requests
import yaml
from openapi_core import Config, OpenAPI
from openapi_core.contrib.requests import RequestsOpenAPIRequest, RequestsOpenAPIResponse

base, admin = sys.argv[1].rstrip("/"), sys.argv[2]
spec = yaml.safe_load(requests.get(base + "/openapi.yaml", timeout=10).text)
spec["servers"] = [{"url": base}]
# Media types openapi-core does not read by itself: problem details are JSON, CSV and YAML text.
def text(data):
    return data.decode("utf-8") if isinstance(data, bytes) else data
config = Config(extra_media_type_deserializers={
    "application/problem+json": lambda data, **_: json.loads(text(data)),
    "text/csv": lambda data, **_: text(data), "application/yaml": lambda data, **_: text(data),
    "text/html": lambda data, **_: text(data),
})
openapi = OpenAPI.from_dict(spec, config=config)
session = requests.Session()
failures, checked = [], set()
pairs = {}


def call(method, path, key=None, expect=None, **kwargs):
    headers = kwargs.pop("headers", {})
    if key:
        headers["Authorization"] = "Bearer " + key
    request = requests.Request(method, base + path, headers=headers, **kwargs).prepare()
    response = session.send(request, timeout=30, allow_redirects=False)
    label = f"{method} {path.split('?')[0]} -> {response.status_code}"
    checked.add(label)
    pairs[label] = (request, response)
    if expect is not None and response.status_code != expect:
        failures.append(f"{label}: expected {expect}: {response.text[:300]}")
    try:
        openapi.validate_response(RequestsOpenAPIRequest(request), RequestsOpenAPIResponse(response))
    except Exception as error:  # every validation error names what did not match
        detail = getattr(error, "__cause__", None) or error
        failures.append(f"{label}: {type(error).__name__}: {detail}"[:800])
    return response


now = datetime.now(timezone.utc)
stamp = now.isoformat()
call("GET", "/healthz", expect=200)
call("GET", "/readyz", expect=200)
call("GET", "/metrics", expect=200)
call("GET", "/openapi.yaml", expect=200)

app = "openapi-" + uuid.uuid4().hex[:8]
call("POST", "/v1/apps", admin, 201, json={"app": app, "timezone": "Asia/Kolkata", "currency": "USD"})
call("POST", "/v1/apps", admin, 409, json={"app": app})
call("POST", "/v1/apps", admin, 400, json={"app": "Bad App"})
call("POST", "/v1/apps", None, 401, json={"app": "x"})
ingest = call("POST", f"/v1/apps/{app}/keys", admin, 201, json={"scope": "ingest"}).json()
read = call("POST", f"/v1/apps/{app}/keys", admin, 201, json={"scope": "read"}).json()
spare = call("POST", f"/v1/apps/{app}/keys", admin, 201, json={"scope": "read"}).json()
call("POST", f"/v1/apps/{app}/keys", admin, 400, json={"scope": "root"})
call("POST", "/v1/apps/nope/keys", admin, 404, json={"scope": "read"})
call("GET", "/v1/apps", admin, 200)
call("GET", f"/v1/apps/{app}/networks", read["secret"], 200)
call("PUT", f"/v1/apps/{app}/networks", admin, 200, json={"networks": ["admob", "iad", "nend"]})
call("PUT", f"/v1/apps/{app}/networks", admin, 400, json={"networks": ["Ad Mob"]})
call("PUT", "/v1/apps/nope/networks", admin, 404, json={"networks": None})

call("GET", "/v1/apps", read["secret"], 200)
call("GET", f"/v1/apps/{app}/keys", admin, 200)
call("GET", f"/v1/apps/{app}/keys", read["secret"], 403)
call("GET", "/v1/apps/nope/keys", admin, 404)
call("DELETE", f"/v1/keys/{spare['id']}", admin, 204)
call("DELETE", "/v1/keys/key_nope", admin, 404)

events = [
    {"id": str(uuid.uuid4()), "type": "request", "occurred_at": stamp, "network": "admob", "format": "banner"},
    {"id": str(uuid.uuid4()), "type": "impression", "occurred_at": stamp, "network": "admob", "format": "banner",
     "revenue_micros": 1500, "currency": "USD", "country": "IN", "placement": "=cmd"},
    {"id": str(uuid.uuid4()), "type": "tap", "occurred_at": stamp, "network": "iad", "format": "banner", "will_leave": True},
    {"id": "not-a-uuid", "type": "request", "occurred_at": stamp, "network": "admob", "format": "banner"},
    {"id": str(uuid.uuid4()), "type": "session", "occurred_at": stamp, "country": "JP", "device": "d1"},
    {"id": str(uuid.uuid4()), "type": "impression", "occurred_at": stamp, "network": "admob", "format": "rewarded",
     "revenue_micros": 25000, "currency": "USD", "revenue_precision": "precise"},
]
call("POST", "/v1/events", ingest["secret"], 200, json={"events": events})
ndjson = "\n".join(json.dumps(dict(event, id=str(uuid.uuid4()))) for event in events[:3]).encode()
call("POST", "/v1/events", ingest["secret"], 200, data=ndjson, headers={"Content-Type": "application/x-ndjson"})
call("POST", "/v1/events", ingest["secret"], 200, data=gzip.compress(ndjson),
     headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"})
call("POST", "/v1/events", ingest["secret"], 400, data=b"{not json", headers={"Content-Type": "application/json"})
call("POST", "/v1/events", ingest["secret"], 415, data=b"a,b", headers={"Content-Type": "text/csv"})
call("POST", "/v1/events", ingest["secret"], 413, json={"events": [{}] * 1001})
call("POST", "/v1/events", None, 401, json={"events": []})
call("POST", "/v1/events", read["secret"], 403, json={"events": []})

today = now.date().isoformat()
call("GET", f"/v1/reports?apps={app}&from={today}&to={today}&dimensions=date,network", read["secret"], 200)
call("GET", f"/v1/reports?from={today}&to={today}&dimensions=hour,placement&metrics=requests,fill_rate,unique_devices&limit=1",
     admin, 200)
call("GET", f"/v1/reports?from={today}&to={today}&dimensions=network&metrics=requests,taps&compare=previous_period&tz=UTC", admin, 200)
call("GET", f"/v1/reports?apps={app}&from={today}&to={today}&dimensions=placement&format=csv", read["secret"], 200)
call("GET", "/v1/reports?dimensions=colour", admin, 400)
call("GET", "/v1/reports?apps=nope", read["secret"], 403)
call("GET", "/v1/reports", ingest["secret"], 403)
call("GET", "/v1/reports", None, 401)
call("POST", "/v1/events", ingest["secret"], 200, json={"events": [
    {"id": str(uuid.uuid4()), "type": "impression", "occurred_at": stamp, "network": "nend", "format": "banner",
     "revenue_micros": 5, "currency": "JPY"}]})
call("GET", f"/v1/reports?apps={app}&from={today}&to={today}&tz=UTC&metrics=revenue", read["secret"], 422)

# Rate cards and FX rates.
csv_headers = {"Content-Type": "text/csv"}
card = b"network,format,country,currency,cpm,cpt,effective_from\nadmob,banner,*,USD,2.00,0.10,2026-01-01\n"
call("POST", "/v1/rates", admin, 200, json={"rates": [{"network": "nend", "format": "banner", "country": "JP", "currency": "JPY",
                                                      "cpm": "150", "cpt": 5, "effective_from": "2026-01-01"}]})
call("POST", "/v1/rates", admin, 200, data=card, headers=dict(csv_headers))
call("POST", "/v1/rates", admin, 400, json={"rates": [{"network": "nend", "format": "billboard", "currency": "USD", "effective_from": "2026-01-01"}]})
call("POST", "/v1/rates", read["secret"], 403, data=card, headers=dict(csv_headers))
call("GET", "/v1/rates", read["secret"], 200)
call("DELETE", "/v1/rates?network=admob&format=banner&country=*&effective_from=2026-01-01", admin, 204)
call("DELETE", "/v1/rates?network=admob&format=banner&country=*&effective_from=2026-01-01", admin, 404)
call("POST", "/v1/fx", admin, 200, json={"base": "EUR", "rates": [{"date": "2026-01-02", "currency": "GBP", "rate": "0.85"}]})
call("POST", "/v1/fx?base=EUR&fill_gaps=true", admin, 200, data=b"Date,USD,JPY,\n2026-01-02,1.1,N/A,\n2026-01-05,1.2,160,\n",
     headers=dict(csv_headers))
call("POST", "/v1/fx", admin, 400, json={"rates": [{"date": "2026-02-30", "currency": "USD", "rate": "1"}]})
call("GET", "/v1/fx?currency=USD", read["secret"], 200)
call("GET", "/v1/fx?from=yesterday", read["secret"], 400)
page = call("GET", "/v1/fx?from=2026-01-01&to=2026-01-31&limit=1", read["secret"], 200).json()
if page.get("next_cursor"):
    call("GET", "/v1/fx?from=2026-01-01&to=2026-01-31&limit=1&cursor=" + page["next_cursor"], read["secret"], 200)
call("GET", "/v1/fx?limit=0", read["secret"], 400)
call("DELETE", "/v1/fx?date=2026-01-02&currency=GBP", admin, 204)
call("DELETE", "/v1/fx?date=2026-01-02&currency=GBP", admin, 404)

# Scheduled exports (the server and this script share the machine, so a temporary folder will do).
folder = tempfile.mkdtemp(prefix="adtally-openapi-")
schedule = {"name": "openapi", "cron": "0 6 * * *", "tz": "Asia/Tokyo", "format": "csv", "dir": folder,
            "query": {"apps": app, "days": "1", "dimensions": "date,network"}}
# Alert rules: created (the secret made and shown once), listed, tested against a
# closed local port (a failed delivery, 200), paused and resumed, deleted.
rule = {"name": "fill-drop", "apps": [app], "metric": "fill_rate", "filters": {"network": "admob"}, "condition": "below",
        "threshold": 0.5, "window_minutes": 120, "min_requests": 100, "webhook": "http://127.0.0.1:1/hook"}
created = call("POST", "/v1/alerts", admin, 201, json=rule).json()
assert len(created.get("secret", "")) == 64, created
call("POST", "/v1/alerts", admin, 409, json=rule)
call("POST", "/v1/alerts", admin, 400, json={**rule, "name": "other", "window_minutes": 90})
call("POST", "/v1/alerts", admin, 400, json={**rule, "name": "other", "metric": "dau"})
call("POST", "/v1/alerts", read["secret"], 403, json=rule)
call("GET", "/v1/alerts", admin, 200)
call("GET", "/v1/alerts/fill-drop", admin, 200)
call("GET", "/v1/alerts/nope", admin, 404)
test = call("POST", "/v1/alerts/fill-drop/test", admin, 200).json()
assert test["delivery"]["status"] == "retrying" and test["delivery"]["attempts"] == 1, test
call("POST", "/v1/alerts/fill-drop/pause", admin, 200)
call("POST", "/v1/alerts/fill-drop/resume", admin, 200)
call("GET", "/v1/alerts/fill-drop/history?limit=5", admin, 200)
call("GET", "/v1/alerts/history", admin, 200)
call("GET", "/v1/alerts/history?limit=0", admin, 400)
call("DELETE", "/v1/alerts/fill-drop", admin, 204)
call("DELETE", "/v1/alerts/fill-drop", admin, 404)

call("POST", "/v1/exports", admin, 201, json=schedule)
call("POST", "/v1/exports", admin, 409, json=schedule)
call("POST", "/v1/exports", admin, 400, json={**schedule, "name": "other", "cron": "0 6 * *"})
call("POST", "/v1/exports", read["secret"], 403, json=schedule)
call("GET", "/v1/exports", admin, 200)
call("GET", "/v1/exports/openapi", admin, 200)
call("GET", "/v1/exports/missing", admin, 404)
call("POST", "/v1/exports/openapi/pause", admin, 200)
call("POST", "/v1/exports/openapi/resume", admin, 200)
queued = call("POST", "/v1/exports/openapi/run", admin, 202).json()
call("POST", "/v1/exports/openapi/run", admin, 404, json={"slot": "20200101T0600"})
call("POST", "/v1/exports/openapi/run", admin, 409, json={"slot": queued.get("slot")})
call("GET", "/v1/exports/openapi/runs", admin, 200)
call("GET", "/v1/exports/runs?limit=5", admin, 200)
call("GET", "/v1/exports/runs?limit=0", admin, 400)
call("DELETE", "/v1/exports/openapi", admin, 204)
call("DELETE", "/v1/exports/openapi", admin, 404)
shutil.rmtree(folder, ignore_errors=True)

# The mediation switch: policies, the served answer with its ETag, 304, history.
call("GET", f"/v1/apps/{app}/mediation", ingest["secret"], 404)
call("PUT", f"/v1/apps/{app}/mediation/policies", admin, 400, json={"rule": "automatic", "networks": ["admob"]})
call("PUT", f"/v1/apps/{app}/mediation/policies", read["secret"], 403, json={"rule": "pinned", "network": "admob"})
call("PUT", f"/v1/apps/{app}/mediation/policies", admin, 200, json={"rule": "automatic", "networks": ["admob", "nend"], "default": "nend", "min_requests": 1})
call("PUT", f"/v1/apps/{app}/mediation/policies", admin, 200, json={"rule": "weighted", "country": "JP", "weights": {"admob": 1, "nend": 3}})
answer = call("GET", f"/v1/apps/{app}/mediation", ingest["secret"], 200)
call("GET", f"/v1/apps/{app}/mediation", ingest["secret"], 304, headers={"If-None-Match": answer.headers.get("ETag", "")})
call("GET", f"/v1/apps/{app}/mediation?country=JP&placement=home", read["secret"], 200)
call("GET", f"/v1/apps/{app}/mediation?country=Japan", read["secret"], 400)
# The same answer for the key's own app (AdTallyKit reads this one).
own = call("GET", "/v1/mediation", ingest["secret"], 200)
call("GET", "/v1/mediation", ingest["secret"], 304, headers={"If-None-Match": own.headers.get("ETag", "")})
call("GET", "/v1/mediation?country=Japan", ingest["secret"], 400)
call("GET", "/v1/mediation", admin, 403)
# Counts of events an app's queue dropped, each report once by its id.
drop = {"id": str(uuid.uuid4()), "reason": "queue_full", "dropped": 12}
call("POST", "/v1/client-drops", ingest["secret"], 200, json=drop)
call("POST", "/v1/client-drops", ingest["secret"], 200, json=drop)
call("POST", "/v1/client-drops", ingest["secret"], 400, json=dict(drop, reason="bored"))
call("POST", "/v1/client-drops", read["secret"], 403, json=drop)
call("GET", "/v1/apps/nope/mediation", ingest["secret"], 403)
call("GET", f"/v1/apps/{app}/mediation/policies", read["secret"], 200)
call("GET", f"/v1/apps/{app}/mediation/history?limit=10", admin, 200)
call("DELETE", f"/v1/apps/{app}/mediation/policies?country=JP", admin, 204)
call("DELETE", f"/v1/apps/{app}/mediation/policies?country=JP", admin, 404)

# Experiments on the switch: created, answered per device, frozen placement, results, stopped.
call("POST", f"/v1/apps/{app}/experiments", admin, 400, json={"name": "ab", "placement": "home", "control": "pinned:admob", "treatment": "pinned:nend", "treatment_share": 30})
call("POST", f"/v1/apps/{app}/experiments", read["secret"], 403, json={"name": "ab", "placement": "home", "control": "pinned:admob", "treatment": "pinned:nend", "treatment_share": 50})
call("POST", f"/v1/apps/{app}/experiments", admin, 201, json={"name": "ab", "placement": "home", "control": "pinned:admob", "treatment": {"rule": "weighted", "weights": {"admob": 1, "nend": 1}}, "treatment_share": 50})
call("POST", f"/v1/apps/{app}/experiments", admin, 409, json={"name": "ab2", "placement": "home", "control": "pinned:admob", "treatment": "pinned:nend", "treatment_share": 50})
call("PUT", f"/v1/apps/{app}/mediation/policies", admin, 409, json={"placement": "home", "rule": "pinned", "network": "admob"})
armed = call("GET", f"/v1/apps/{app}/mediation?placement=home&device=device-1", ingest["secret"], 200)
call("GET", f"/v1/apps/{app}/mediation?placement=home&device=device-1", ingest["secret"], 304, headers={"If-None-Match": armed.headers.get("ETag", "")})
call("GET", "/v1/mediation?placement=home&device=device-2", ingest["secret"], 200)
call("GET", "/v1/mediation?placement=home&device=", ingest["secret"], 400)
call("GET", f"/v1/apps/{app}/experiments", read["secret"], 200)
call("GET", f"/v1/apps/{app}/experiments/ab", read["secret"], 200)
call("GET", f"/v1/apps/{app}/experiments/nope", read["secret"], 404)
call("GET", f"/v1/apps/{app}/experiments/ab/results", read["secret"], 200)
call("POST", f"/v1/apps/{app}/experiments/ab/stop", admin, 400, json={"keep": "both"})
call("POST", f"/v1/apps/{app}/experiments/ab/stop", admin, 200, json={"keep": "treatment"})
call("POST", f"/v1/apps/{app}/experiments/ab/stop", admin, 409, json={"keep": "control"})

# The built-in dashboard: its sign-in, its page and its CSV (on an app of its own;
# the first app's JPY revenue has no FX rate to USD, which is a 422 there).
call("GET", f"/dashboard?app={app}", read["secret"], 422)
app = "openapi-dash-" + uuid.uuid4().hex[:8]
call("POST", "/v1/apps", admin, 201, json={"app": app, "timezone": "America/New_York", "currency": "USD"})
read = call("POST", f"/v1/apps/{app}/keys", admin, 201, json={"scope": "read"}).json()
form = {"Content-Type": "application/x-www-form-urlencoded"}
call("GET", "/dashboard", None, 200)
call("POST", "/dashboard/login", None, 401, data="key=atk_unknown", headers=dict(form))
call("POST", "/dashboard/login", None, 403, data=f"key={ingest['secret']}", headers=dict(form))
call("POST", "/dashboard/login", None, 415, data="{}", headers={"Content-Type": "application/json"})
signed_in = call("POST", "/dashboard/login", None, 303, data=f"key={read['secret']}", headers=dict(form))
cookie = {"Cookie": signed_in.headers.get("Set-Cookie", "").split(";")[0]}
call("GET", f"/dashboard?app={app}", None, 200, headers=dict(cookie))
call("GET", "/dashboard?from=2026-13-01", read["secret"], 400)
call("GET", f"/dashboard/report.csv?app={app}", None, 200, headers=dict(cookie))
call("GET", "/dashboard/report.csv", None, 401)
call("GET", "/dashboard", ingest["secret"], 403)
call("POST", "/dashboard/logout", None, 303, headers=dict(cookie))

# The validator must be able to fail: a document that requires a property the apps
# list lacks has to reject that real response.
broken = copy.deepcopy(spec)
broken["components"]["schemas"]["App"]["required"].append("owner")
request, response = pairs["GET /v1/apps -> 200"]
try:
    OpenAPI.from_dict(broken, config=config).validate_response(RequestsOpenAPIRequest(request), RequestsOpenAPIResponse(response))
    failures.append("self-check: a document requiring App.owner accepted an app without it")
except Exception:
    print("self-check: the validator rejects a response that breaks the document")

for label in sorted(checked):
    print("checked", label)
if failures:
    print(f"\n{len(failures)} response(s) do not match /openapi.yaml:")
    for failure in failures:
        print(" -", failure)
    sys.exit(1)
print(f"all {len(checked)} request kinds match /openapi.yaml")
