#!/usr/bin/env python3
"""Loads /dashboard in a real headless Chromium and checks what it drew.

Usage: dashboard_browser_check.py BASE_URL KEY SCREENSHOT.png

Signs in through the page's own form (the key typed into the password field,
never put in a URL), then checks, over the Chrome DevTools Protocol:
- the session cookie is HttpOnly (the page's script cannot read it) and the key
  appears in no URL the browser requested;
- every request stayed on the server (no CDN, font or script from elsewhere) and
  the console logged no error (a Content-Security-Policy violation included);
- every chart drew the marks the report API says it should: one per day and
  series for counts and money, one per day with a defined ratio for ratios,
  one per day and network for the network charts;
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
        deadline = time.time() + timeout
        for index, event in enumerate(self.events):
            if event.get("method") == method:
                del self.events[:index + 1]
                return event
        while time.time() < deadline:
            message = json.loads(self.socket.recv())
            if message.get("method") == method:
                return message
            self.events.append(message)
        fail(f"no {method} within {timeout} s")

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
      const entry = series[mark.dataset.series] || (series[mark.dataset.series] = {marks: 0, drawn: 0});
      entry.marks += 1;
      if (box.width > 0 && (box.height > 0 || mark.tagName === "rect")) entry.drawn += 1;
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


def expected_marks(base, key, app, start, end, categories):
    """What each chart must draw, from the report API (not from the page)."""
    common = {"apps": app, "from": start, "to": end, "limit": "100000"}
    grain = "hour" if categories is None else "date"
    def rows(dimensions, metrics, **extra):
        document = report(base, key, {**common, "dimensions": dimensions, "metrics": metrics, **extra})
        names = [column["name"] for column in document["columns"]]
        return [dict(zip(names, row)) for row in document["rows"]]
    main = rows(grain, "requests,impressions,taps,action_cancels")
    if categories is None:
        categories = sorted({row["hour"] for row in main})
    days = len(categories)
    by_network = rows(f"{grain},network", "revenue,impressions")
    networks = sorted({row["network"] for row in by_network})
    expiries = rows(grain, "expiries", format="interstitial")
    if grain == "hour":
        categories = sorted(set(categories) | {row["hour"] for row in by_network} | {row["hour"] for row in expiries})
        days = len(categories)
    return {
        "inventory": {"requests": days, "impressions": days},
        "fill-rate": {"fill rate": sum(1 for row in main if row["requests"] > 0)},
        "taps": {"taps": days, "cancel rate": sum(1 for row in main if row["taps"] > 0)},
        "expiries": {"all expiries (top part: shown)": days, "never shown (wasted fills)": days},
        "revenue": {network: days for network in networks},
        "ecpm": {network: sum(1 for row in by_network if row["network"] == network and row["impressions"] > 0) for network in networks},
    }


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
        day_count = (time.mktime(time.strptime(end, "%Y-%m-%d")) - time.mktime(time.strptime(start, "%Y-%m-%d"))) // 86400 + 1
        categories = [time.strftime("%Y-%m-%d", time.gmtime(time.mktime(time.strptime(start, "%Y-%m-%d")) + 86400 * i + 43200)) for i in range(int(day_count))]
        expected = expected_marks(base, key, app, start, end, categories if day_count > 3 else None)

        problems = []
        if sorted(drawn) != sorted(expected):
            problems.append(f"charts drawn {sorted(drawn)}, expected {sorted(expected)}")
        for chart, series in expected.items():
            got = drawn.get(chart, {})
            if got and (got["width"] < 200 or got["height"] < 80):
                problems.append(f"{chart}: drawn {got['width']}x{got['height']} px")
            for name, count in series.items():
                entry = got.get("series", {}).get(name, {"marks": 0, "drawn": 0})
                if entry["marks"] != count:
                    problems.append(f"{chart} / {name}: {entry['marks']} marks, expected {count}")
                if entry["drawn"] != entry["marks"]:
                    problems.append(f"{chart} / {name}: {entry['marks'] - entry['drawn']} marks have no size")
            extra = set(got.get("series", {})) - set(series)
            if extra:
                problems.append(f"{chart}: unexpected series {sorted(extra)}")
        if sum(count for series in expected.values() for count in series.values()) == 0:
            problems.append("the report API returned no data to draw: the check would prove nothing")

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
        hourly_expected = expected_marks(base, key, app, end, end, None)
        for chart, series in hourly_expected.items():
            for name, count in series.items():
                got = hourly.get(chart, {}).get("series", {}).get(name, {"marks": 0})["marks"]
                if got != count:
                    problems.append(f"by hour, {chart} / {name}: {got} marks, expected {count}")
        if sum(count for series in hourly_expected.values() for count in series.values()) == 0:
            problems.append(f"no hourly data on {end}: the hourly check would prove nothing")
        browser.call("Page.navigate", url=f"{base}/dashboard?app={urllib.parse.quote(app)}&from={start}&to={end}")
        browser.wait_for("Page.loadEventFired")

        # The charts without JavaScript: the same marks.
        browser.call("Emulation.setScriptExecutionDisabled", value=True)
        browser.call("Page.reload")
        browser.wait_for("Page.loadEventFired")
        browser.call("Emulation.setScriptExecutionDisabled", value=False)
        again = browser.evaluate(COUNT_MARKS)
        if {c: {s: e["marks"] for s, e in v["series"].items()} for c, v in again.items()} != {c: {s: e["marks"] for s, e in v["series"].items()} for c, v in drawn.items()}:
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
                   "hourly": {c: sum(e["marks"] for e in v["series"].values()) for c, v in hourly.items()},
                   "requests": len(requested), "screenshot": screenshot}
        print(json.dumps(summary, indent=1))
        if problems:
            fail("; ".join(problems))
    finally:
        browser.close()


if __name__ == "__main__":
    main()
