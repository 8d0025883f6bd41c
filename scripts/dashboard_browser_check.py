#!/usr/bin/env python3
"""Loads /dashboard in a real headless Chromium and checks what it drew.

Usage: dashboard_browser_check.py BASE_URL KEY SCREENSHOT.png

Signs in through the page's own form (the key typed into the password field,
never put in a URL), then checks, over the Chrome DevTools Protocol:
- the session cookie is HttpOnly (the page's script cannot read it) and the key
  appears in no URL the browser requested;
- every request stayed on the server (no CDN, font or script from elsewhere) and
  the console logged no error (a Content-Security-Policy violation included);
- every chart drew the marks the report API says it should, each with the
  API's value (within the rounding of the API's text): one per day (or local
  hour) and series for counts and money, one per day with a defined ratio for
  ratios, one per day and network for the top networks; a bar above 0 has height;
- the cohort triangle drew a cell per install day and day N whose revenue per
  install the API defines, with the API's value and retention, and the LTV chart
  a point per week of installs and day N, as the week's cohort report totals;
- each experiment shown drew both arms' ARPDAU by day and cumulative, and each
  metric's lift, with the experiments API's values (GET …/experiments/{name}/results);
- with JavaScript switched off the charts are the same;
and saves a full-page screenshot. Prints a JSON summary; exits 1 on a failure.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import datetime
from zoneinfo import ZoneInfo

import websocket


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


class Browser:
    def __init__(self):
        self.profile = tempfile.mkdtemp(prefix="adtally-chromium-")
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if not binary:
            fail("chromium is not installed (make test installs the Debian package)")
        self.process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-extensions", "--disable-background-networking", "--disable-sync", "--hide-scrollbars",
             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={self.profile}",
             "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        browser_url = None
        while time.time() < deadline:
            line = self.process.stderr.readline()
            if not line:
                if self.process.poll() is not None:
                    fail(f"chromium exited with {self.process.returncode}")
                continue
            if "DevTools listening on" in line:
                browser_url = line.strip().split(" ")[-1]
                break
        if not browser_url:
            fail("chromium did not open its DevTools port within 60 s")
        port = urllib.parse.urlparse(browser_url).port
        pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(p for p in pages if p.get("type") == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0
        self.events = []
        self.cursor = 0

    def call(self, method, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    fail(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method, timeout=60):
        """The next `method` event after the last one waited for; every event stays in `events`."""
        deadline = time.time() + timeout
        while True:
            for index in range(self.cursor, len(self.events)):
                if self.events[index].get("method") == method:
                    self.cursor = index + 1
                    return self.events[index]
            if time.time() > deadline:
                fail(f"no {method} within {timeout} s")
            self.events.append(json.loads(self.socket.recv()))

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            fail(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        try:
            self.socket.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


COUNT_MARKS = """
(() => {
  const charts = {};
  for (const svg of document.querySelectorAll("svg.chart")) {
    const series = {};
    for (const mark of svg.querySelectorAll(".mark")) {
      const box = mark.getBBox();
      const entry = series[mark.dataset.series] || (series[mark.dataset.series] = {marks: 0, values: {}, flat: []});
      entry.marks += 1;
      entry.values[mark.dataset.cat] = Number(mark.dataset.value);
      // A drawn value has a size: a bar of a value above 0 has height, a point has a radius.
      if (box.width <= 0 || (mark.tagName === "rect" && Number(mark.dataset.value) > 0 && box.height <= 0)) entry.flat.push(mark.dataset.cat);
    }
    const box = svg.getBoundingClientRect();
    charts[svg.dataset.chart] = {series, width: box.width, height: box.height};
  }
  return charts;
})()
"""


def report(base, key, params):
    url = f"{base}/v1/reports?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    return json.load(urllib.request.urlopen(request, timeout=60))


def api(base, key, path):
    request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {key}"})
    return json.load(urllib.request.urlopen(request, timeout=60))


def experiment_charts(base, key, app, start):
    """The experiments' charts (DESIGN §14), from the experiments API: per running (or
    stopped since the range began) experiment, at most three, each arm's ARPDAU by day
    and cumulative, and each metric's lift."""
    charts = {}
    listed = api(base, key, f"/v1/apps/{urllib.parse.quote(app)}/experiments")["experiments"]
    shown = [e for e in listed if e["status"] == "running" or (e["stopped_at"] or "") >= (datetime.date.fromisoformat(start) - datetime.timedelta(days=1)).isoformat()][:3]
    for experiment in shown:
        results = api(base, key, f"/v1/apps/{urllib.parse.quote(app)}/experiments/{urllib.parse.quote(experiment['name'])}/results")
        name = experiment["name"]
        for chart, field in [("experiment-daily", "arpdau"), ("experiment-cumulative", "cumulative_arpdau")]:
            charts[f"{chart}:{name}"] = {arm: {day["date"]: (day[arm][field]["value"], 1e-8) for day in results["days"] if day[arm][field]["value"] is not None}
                                         for arm in ["control", "treatment"]}
        lifts = {metric: (lift["value"], 1e-8) for metric, lift in results["lift"].items() if lift["value"] is not None}
        if lifts:
            charts[f"experiment-lift:{name}"] = {"lift": lifts}
    return charts


def local_hours(day, zone):
    """Every local hour of a day in a zone, as the engine names them (23 or 25 on DST days)."""
    tz = ZoneInfo(zone)
    start = datetime.datetime.combine(datetime.date.fromisoformat(day), datetime.time(), tz).astimezone(datetime.timezone.utc)
    end = datetime.datetime.combine(datetime.date.fromisoformat(day) + datetime.timedelta(days=1), datetime.time(), tz).astimezone(datetime.timezone.utc)
    hours = []
    while start < end:
        hours.append(start.astimezone(tz).isoformat())
        start += datetime.timedelta(hours=1)
    return hours


def number(value):
    """A report cell as a number (money is a decimal string), with how far the page's unrounded value may be from it."""
    if value is None:
        return None, 0
    if isinstance(value, str):
        decimals = len(value.split(".")[1]) if "." in value else 0
        return float(value), 0.51 * 10 ** -decimals + 1e-9
    return float(value), 1e-6 if isinstance(value, float) else 0


def expected_values(base, key, app, start, end, hourly):
    """What each chart must draw, from the report API (not from the page): per chart and
    series, a value (and tolerance) for every category that has a mark."""
    common = {"apps": app, "from": start, "to": end, "limit": "100000"}
    grain = "hour" if hourly else "date"
    def rows(dimensions, metrics, **extra):
        document = report(base, key, {**common, "dimensions": dimensions, "metrics": metrics, **extra})
        names = [column["name"] for column in document["columns"]]
        return [dict(zip(names, row)) for row in document["rows"]], document
    main, document = rows(grain, "requests,impressions,fill_rate,taps,cancel_rate")
    zone = document["query"]["tz"]
    if hourly:
        first, last = datetime.date.fromisoformat(start), datetime.date.fromisoformat(end)
        categories = [hour for i in range((last - first).days + 1) for hour in local_hours((first + datetime.timedelta(days=i)).isoformat(), zone)]
    else:
        first, last = datetime.date.fromisoformat(start), datetime.date.fromisoformat(end)
        categories = [(first + datetime.timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
    top, _ = rows("network", "revenue,requests", sort="-revenue,-requests", limit="8")
    networks = sorted(row["network"] for row in top)
    by_network, _ = rows(f"{grain},network", "revenue,ecpm", network=",".join(networks)) if networks else ([], None)
    expiries, _ = rows(grain, "expiries,wasted_fills", format="interstitial")
    # The audience: daily averages by day; an hour is no day, so by hour the devices of each hour.
    audience, _ = rows(grain, "active_devices,ad_viewers" if hourly else "dau,dav,engagement_rate,revenue,arpdau")

    def series(source, metric, count, network=None):
        values = {}
        found = {row[grain]: row for row in source if network is None or row["network"] == network}
        for category in categories:
            row = found.get(category)
            if row is None:
                if count:
                    values[category] = (0.0, 0)
            elif row[metric] is not None:
                values[category] = number(row[metric])
        return values
    # The LTV curves: per week of installs ending at the range's last whole day (at most
    # yesterday), the totals of a cohort report over that week, by day N.
    today = datetime.datetime.now(ZoneInfo(zone)).date()
    last = min(datetime.date.fromisoformat(end), today - datetime.timedelta(days=1))
    ltv = {}
    for week in range(4):
        to = last - datetime.timedelta(days=7 * week)
        since = to - datetime.timedelta(days=6)
        document = report(base, key, {"apps": app, "from": since.isoformat(), "to": to.isoformat(),
                                      "metrics": ",".join(["installs"] + [f"revenue_per_install_d{n}" for n in range(31)])})
        totals = document["totals"]
        ltv[f"installs {since.isoformat()[5:]}–{to.isoformat()[5:]}"] = {
            f"d{n}": number(totals[f"revenue_per_install_d{n}"]) for n in range(31) if totals[f"revenue_per_install_d{n}"] is not None}
    return {
        **experiment_charts(base, key, app, start),
        "ltv": ltv,
        "inventory": {"requests": series(main, "requests", True), "impressions": series(main, "impressions", True)},
        "fill-rate": {"fill rate": series(main, "fill_rate", False)},
        "taps": {"taps": series(main, "taps", True), "cancel rate": series(main, "cancel_rate", False)},
        "expiries": {"all expiries (top part: shown)": series(expiries, "expiries", True), "never shown (wasted fills)": series(expiries, "wasted_fills", True)},
        "revenue": {network: series(by_network, "revenue", True, network) for network in networks},
        "ecpm": {network: series(by_network, "ecpm", False, network) for network in networks},
        **({"audience": {"active devices": series(audience, "active_devices", True), "ad viewers": series(audience, "ad_viewers", True)}} if hourly else {
            "audience": {"DAU": series(audience, "dau", False), "DAV": series(audience, "dav", False), "engagement rate": series(audience, "engagement_rate", False)},
            "arpdau": {"revenue": series(audience, "revenue", True), "ARPDAU": series(audience, "arpdau", False)},
        }),
    }


COUNT_CELLS = """
(() => Array.from(document.querySelectorAll("svg.cohorts rect.cell")).map((cell) => {
  const box = cell.getBBox();
  return {cohort: cell.dataset.cohort, day: cell.dataset.day, value: Number(cell.dataset.value),
          retention: cell.dataset.retention === "" ? null : Number(cell.dataset.retention), width: box.width, height: box.height};
}))()
"""

TRIANGLE_DAYS = [0, 1, 2, 3, 7, 14, 30]


def check_triangle(base, key, app, start, end, cells, label):
    """The cohort triangle's cells against a cohort report of the API: one cell per
    install day and day N whose revenue per install is defined, its value and retention."""
    problems = []
    zone = report(base, key, {"apps": app, "from": end, "to": end, "metrics": "requests"})["query"]["tz"]
    today = datetime.datetime.now(ZoneInfo(zone)).date()
    last = min(datetime.date.fromisoformat(end), today - datetime.timedelta(days=1))
    first = max(datetime.date.fromisoformat(start), last - datetime.timedelta(days=29))
    document = report(base, key, {"apps": app, "from": first.isoformat(), "to": max(first, last).isoformat(), "dimensions": "cohort",
                                  "metrics": ",".join(["installs"] + [f"{m}_d{n}" for n in TRIANGLE_DAYS for m in ("revenue_per_install", "retention")])})
    names = [column["name"] for column in document["columns"]]
    expected = {}
    for row in document["rows"]:
        values = dict(zip(names, row))
        for n in TRIANGLE_DAYS:
            if values[f"revenue_per_install_d{n}"] is not None:
                expected[(values["cohort"], str(n))] = (number(values[f"revenue_per_install_d{n}"]), values[f"retention_d{n}"])
    drawn = {(cell["cohort"], cell["day"]): cell for cell in cells}
    if set(drawn) != set(expected):
        problems.append(f"{label}, cohort triangle: cells {sorted(set(drawn) - set(expected))[:3]} drawn and not in the API, "
                        f"{sorted(set(expected) - set(drawn))[:3]} in the API and not drawn")
    for where, ((value, tolerance), retention) in expected.items():
        cell = drawn.get(where)
        if cell is None:
            continue
        if abs(cell["value"] - value) > tolerance + 1e-9:
            problems.append(f"{label}, cohort triangle {where}: drew {cell['value']}, the API says {value}")
        if (retention is None) != (cell["retention"] is None) or (retention is not None and abs(cell["retention"] - retention) > 1e-6):
            problems.append(f"{label}, cohort triangle {where}: retention {cell['retention']}, the API says {retention}")
        if cell["width"] <= 0 or cell["height"] <= 0:
            problems.append(f"{label}, cohort triangle {where}: a cell without size")
    if not expected:
        problems.append(f"{label}: the cohort triangle has no cell to check: the check would prove nothing")
    return problems, len(expected)


def compare(drawn, expected, label):
    problems = []
    if sorted(drawn) != sorted(expected):
        problems.append(f"{label}: charts drawn {sorted(drawn)}, expected {sorted(expected)}")
    marks = 0
    for chart, series in expected.items():
        got = drawn.get(chart, {})
        if got and (got["width"] < 200 or got["height"] < 80):
            problems.append(f"{label}, {chart}: drawn {got['width']}x{got['height']} px")
        extra = set(got.get("series", {})) - set(series)
        if extra:
            problems.append(f"{label}, {chart}: unexpected series {sorted(extra)}")
        for name, values in series.items():
            entry = got.get("series", {}).get(name, {"marks": 0, "values": {}, "flat": []})
            marks += entry["marks"]
            if entry["marks"] != len(values) or set(entry["values"]) != set(values):
                missing, unexpected = sorted(set(values) - set(entry["values"])), sorted(set(entry["values"]) - set(values))
                problems.append(f"{label}, {chart} / {name}: {entry['marks']} marks, expected {len(values)} (missing {missing[:3]}, unexpected {unexpected[:3]})")
            for category, (value, tolerance) in values.items():
                if category in entry["values"] and abs(entry["values"][category] - value) > tolerance + 1e-9 * abs(value):
                    problems.append(f"{label}, {chart} / {name} at {category}: drew {entry['values'][category]}, the API says {value}")
            if entry["flat"]:
                problems.append(f"{label}, {chart} / {name}: marks without size at {entry['flat'][:3]}")
    if marks == 0:
        problems.append(f"{label}: nothing drawn at all: the check would prove nothing")
    return problems, marks


def main():
    if len(sys.argv) != 4:
        fail(__doc__)
    base, key, screenshot = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    browser = Browser()
    try:
        browser.call("Page.enable")
        browser.call("Network.enable")
        browser.call("Runtime.enable")
        browser.call("Log.enable")
        browser.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1, mobile=False)

        browser.call("Page.navigate", url=f"{base}/dashboard")
        browser.wait_for("Page.loadEventFired")
        if not browser.evaluate("!!document.querySelector('form[action=\"/dashboard/login\"] input[type=password]')"):
            fail("/dashboard without a session did not show the sign-in form")
        browser.evaluate(f"document.getElementById('key').value = {json.dumps(key)}; document.querySelector('form').submit(); true")
        browser.wait_for("Page.loadEventFired")
        location = browser.evaluate("location.href")
        if not location.endswith("/dashboard"):
            fail(f"signing in landed on {location}")
        if browser.evaluate("document.cookie.includes('adtally_session')"):
            fail("the session cookie is readable from script (not HttpOnly)")
        cookies = browser.call("Network.getCookies", urls=[f"{base}/dashboard"])["cookies"]
        session = [c for c in cookies if c["name"] == "adtally_session"]
        if not session or not session[0]["httpOnly"] or session[0]["sameSite"] != "Strict":
            fail(f"session cookie missing or not HttpOnly + SameSite=Strict: {session}")

        app = browser.evaluate("document.getElementById('app').value")
        start = browser.evaluate("document.querySelector('input[name=from]').value")
        end = browser.evaluate("document.querySelector('input[name=to]').value")
        drawn = browser.evaluate(COUNT_MARKS)
        problems, daily_marks = compare(drawn, expected_values(base, key, app, start, end, hourly=False), "by day")
        triangle_problems, triangle_cells = check_triangle(base, key, app, start, end, browser.evaluate(COUNT_CELLS), "by day")
        problems += triangle_problems

        browser.call("Page.captureScreenshot", format="png")  # settles layout
        shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        import base64
        os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
        with open(screenshot, "wb") as out:
            out.write(base64.b64decode(shot["data"]))

        # One day is drawn by hour: the same checks on the last day of the range.
        browser.call("Page.navigate", url=f"{base}/dashboard?app={urllib.parse.quote(app)}&from={end}&to={end}")
        browser.wait_for("Page.loadEventFired")
        hourly = browser.evaluate(COUNT_MARKS)
        hourly_problems, hourly_marks = compare(hourly, expected_values(base, key, app, end, end, hourly=True), "by hour")
        problems += hourly_problems
        browser.call("Page.navigate", url=f"{base}/dashboard?app={urllib.parse.quote(app)}&from={start}&to={end}")
        browser.wait_for("Page.loadEventFired")

        # The charts without JavaScript: the same marks.
        browser.call("Emulation.setScriptExecutionDisabled", value=True)
        browser.call("Page.reload")
        browser.wait_for("Page.loadEventFired")
        browser.call("Emulation.setScriptExecutionDisabled", value=False)
        again = browser.evaluate(COUNT_MARKS)
        if {c: {s: e["values"] for s, e in v["series"].items()} for c, v in again.items()} != {c: {s: e["values"] for s, e in v["series"].items()} for c, v in drawn.items()}:
            problems.append("with JavaScript off the charts differ")

        # Everything the browser asked for, and everything it logged.
        requested = [e["params"]["request"]["url"] for e in browser.events if e.get("method") == "Network.requestWillBeSent"]
        foreign = [u for u in requested if not u.startswith(base) and not u.startswith("data:") and u != "about:blank"]
        if foreign:
            problems.append(f"requests outside the server: {foreign}")
        if any(key in u for u in requested):
            problems.append("the key appeared in a requested URL")
        errors = [e["params"]["entry"]["text"] for e in browser.events if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]
        errors += [str(e["params"]["exceptionDetails"].get("text")) for e in browser.events if e.get("method") == "Runtime.exceptionThrown"]
        if errors:
            problems.append(f"console errors: {errors}")

        summary = {"app": app, "from": start, "to": end, "charts": {c: {s: e["marks"] for s, e in v["series"].items()} for c, v in drawn.items()},
                   "marks_checked": {"by_day": daily_marks, "by_hour": hourly_marks}, "cohort_cells_checked": triangle_cells,
                   "requests": len(requested), "screenshot": screenshot}
        print(json.dumps(summary, indent=1))
        if problems:
            fail("; ".join(problems))
    finally:
        browser.close()


if __name__ == "__main__":
    main()
