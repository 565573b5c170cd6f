"""The web dashboard in a real headless Chromium (Debian's chromium and chromedriver, PyPI selenium).

Run by Integration/Scenarios/DashboardScenarios.swift against three `ferry serve` nodes of one
group on loopback (A, B, C). Environment: FERRY_A_ADMIN, FERRY_A_KEY, FERRY_A_COUCH (A's
CouchDB API base URL), FERRY_DB, FERRY_B_ADMIN, FERRY_B_KEY, FERRY_C_PID, and
FERRY_SCREENSHOTS (a directory for one PNG per page).
"""

import json
import os
import signal
import time
import urllib.parse

import pytest
import requests
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

A = os.environ["FERRY_A_ADMIN"].rstrip("/")
A_KEY = os.environ["FERRY_A_KEY"]
B = os.environ["FERRY_B_ADMIN"].rstrip("/")
B_KEY = os.environ["FERRY_B_KEY"]
COUCH = os.environ["FERRY_A_COUCH"].rstrip("/")
DB = os.environ["FERRY_DB"]
SHOTS = os.environ.get("FERRY_SCREENSHOTS")


def admin(base, key, method, path, body=None):
    r = requests.request(method, base + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    return r


def wait_for(condition, timeout, what):
    """Polls `condition`; an element a live re-render replaced meanwhile counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except StaleElementReferenceException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,760", "--disable-gpu"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    yield driver
    driver.quit()


def shot(driver, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        driver.save_screenshot(os.path.join(SHOTS, name + ".png"))


def click(driver, css, timeout=10):
    """Clicks the element `css` names, again if a live re-render replaced it meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return
        except (StaleElementReferenceException, NoSuchElementException):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def page(driver, hash_):
    driver.get(A + "/ui/#" + hash_)
    driver.refresh()  # a hash change alone does not reload the view's data


def test_a_page_without_the_session_cookie_gets_the_login_page(browser):
    browser.delete_all_cookies()
    browser.get(A + "/ui/")
    assert browser.current_url.endswith("/ui/login"), browser.current_url
    assert browser.find_element(By.ID, "login")
    shot(browser, "login")


def test_a_cross_origin_post_is_refused():
    r = requests.post(A + "/ui/login", data={"key": A_KEY}, headers={"Origin": "http://evil.example"}, timeout=30, allow_redirects=False)
    assert r.status_code == 403, r.text
    r = requests.put(A + "/docs/evil", json={"x": 1}, headers={"Origin": "http://evil.example", "Authorization": f"Bearer {A_KEY}"}, timeout=30)
    assert r.status_code == 403, r.text
    # A session's change without its CSRF token is refused too.
    login = requests.post(A + "/ui/login", data={"key": A_KEY}, timeout=30, allow_redirects=False)
    cookie = login.cookies.get("ferry_session")
    assert cookie and "HttpOnly" in login.headers["Set-Cookie"] and "SameSite=Strict" in login.headers["Set-Cookie"]
    r = requests.put(A + "/docs/no-csrf", json={"x": 1}, cookies={"ferry_session": cookie}, timeout=30)
    assert r.status_code == 403 and "csrf" in r.text, r.text
    assert requests.get(A + "/ui/", timeout=30, allow_redirects=False).headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_a_wrong_key_is_refused(browser):
    browser.delete_all_cookies()
    browser.get(A + "/ui/login")
    browser.find_element(By.ID, "key").send_keys("not-the-key")
    browser.find_element(By.ID, "login").submit()
    error = WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "login-error")))
    assert "not this node's admin key" in error.text


def test_the_dashboard_end_to_end(browser):
    wait = WebDriverWait(browser, 10)
    # Log in with the key.
    browser.get(A + "/ui/login")
    browser.find_element(By.ID, "key").send_keys(A_KEY)
    browser.find_element(By.ID, "login").submit()
    wait.until(ec.presence_of_element_located((By.ID, "peers")))

    # The mesh: both other members connected.
    def connected_rows():
        rows = browser.find_elements(By.CSS_SELECTOR, "#peers tr[data-peer]")
        return [r for r in rows if r.find_elements(By.CSS_SELECTOR, "td[data-state^='connected']")]
    wait_for(lambda: len(connected_rows()) == 2, 20, "two connected peers in the mesh view")
    assert browser.find_elements(By.CSS_SELECTOR, "#mesh-graph line")
    # Every node on one circle: no link's line lies on another's (a chain of three was drawn
    # with B–C over A's two links when A sat at the centre).
    def collinear():
        segments = [[float(l.get_attribute(k)) for k in ("x1", "y1", "x2", "y2")] for l in browser.find_elements(By.CSS_SELECTOR, "#mesh-graph line")]
        def on(p, s):
            (x, y), (x1, y1, x2, y2) = p, s
            cross = (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1)
            return abs(cross) < 1e-3 * max(1.0, abs(x2 - x1) + abs(y2 - y1)) ** 2 and min(x1, x2) - 1e-6 <= x <= max(x1, x2) + 1e-6 and min(y1, y2) - 1e-6 <= y <= max(y1, y2) + 1e-6
        return [(a, b) for a in segments for b in segments if a != b and on(a[:2], b) and on(a[2:], b)]
    assert not collinear(), f"a link is drawn over another: {collinear()}"
    shot(browser, "mesh")

    # Cut a link: C stops; its row shows offline within 5 s.
    c_rows = []
    def both_ids():
        c_rows[:] = [r.get_attribute("data-peer") for r in connected_rows()]
        return len(c_rows) == 2
    wait_for(both_ids, 10, "the connected peers' IDs")
    os.kill(int(os.environ["FERRY_C_PID"]), signal.SIGTERM)
    wait_for(lambda: len(connected_rows()) == 1, 5, "the stopped node shown offline")
    def offline():
        return [r for r in browser.find_elements(By.CSS_SELECTOR, "#peers tr[data-peer]") if r.get_attribute("data-peer") in c_rows
                and r.find_elements(By.CSS_SELECTOR, "td[data-state^='offline']")]
    wait_for(lambda: offline(), 5, "the stopped node's row to say offline")
    shot(browser, "mesh-offline")

    # A conflict made on two nodes: one edit on A, another of the same revision on B (each
    # through its CouchDB API, as two writers at once would), meeting as they replicate.
    auth = ("admin", A_KEY)
    base = admin(A, A_KEY, "PUT", "/docs/patient-7", {"name": "Ada", "ward": "a"}).json()["rev"]
    gen, h = base.split("-")
    wait_for(lambda: admin(B, B_KEY, "GET", "/docs/patient-7").status_code == 200, 20, "patient-7 to reach B")
    b_couch = os.environ["FERRY_B_COUCH"].rstrip("/")
    for letter, ward, couch, key in (("e", "b", COUCH, A_KEY), ("f", "c", b_couch, B_KEY)):
        doc = {"_id": "patient-7", "_rev": f"2-{letter * 32}", "name": "Ada", "ward": ward,
               "_revisions": {"start": 2, "ids": [letter * 32, h]}}
        r = requests.put(f"{couch}/{DB}/patient-7?new_edits=false", json=doc, auth=("admin", key), timeout=30)
        assert r.status_code == 201, r.text
    def conflicts_on(base_url, key):
        d = admin(base_url, key, "GET", "/docs/patient-7?conflicts=true").json()
        return d.get("_conflicts", [])
    wait_for(lambda: len(conflicts_on(A, A_KEY)) >= 1 and len(conflicts_on(B, B_KEY)) >= 1, 20, "the conflict on both nodes")
    # The documents list marks it in conflict.
    page(browser, "documents")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#documents a[data-conflicted='patient-7']")))
    page(browser, "conflicts")
    section = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section[data-conflict='patient-7']")))
    assert section.find_elements(By.CSS_SELECTOR, ".diff"), "the differing field is highlighted"
    shot(browser, "conflicts")
    keep = section.find_elements(By.CSS_SELECTOR, "button[data-keep]")
    kept = keep[-1].get_attribute("data-keep")
    # "Keep this one" asks first and names what goes; Cancel deletes nothing.
    keep[-1].click()
    ask = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, f"div[data-confirm='{kept}']")))
    other = next(b.get_attribute("data-keep") for b in keep if b.get_attribute("data-keep") != kept)
    assert other[:18] in ask.text and "lost" in ask.text, ask.text
    shot(browser, "conflicts-confirm")
    click(browser, f"button[data-cancel='{kept}']")
    wait_for(lambda: not ask.is_displayed(), 5, "the question to close")
    assert len(conflicts_on(A, A_KEY)) >= 1, "Cancel deleted nothing"
    keep[-1].click()
    click(browser, f"button[data-discard='{kept}']")
    wait.until(ec.presence_of_element_located((By.ID, "no-conflicts")))
    def resolved(base_url, key):
        d = admin(base_url, key, "GET", "/docs/patient-7?conflicts=true").json()
        return d["_rev"] == kept and not d.get("_conflicts")
    wait_for(lambda: resolved(A, A_KEY) and resolved(B, B_KEY), 20, "A and B to converge on the kept leaf")

    # A second conflict, resolved by the merge resolver from the page; both converge.
    base = admin(A, A_KEY, "PUT", "/docs/patient-8", {"name": "Bo"}).json()["rev"]
    h = base.split("-")[1]
    for letter, field in (("a", "allergy"), ("b", "bed")):
        doc = {"_id": "patient-8", "_rev": f"2-{letter * 32}", "name": "Bo", field: "yes", "_revisions": {"start": 2, "ids": [letter * 32, h]}}
        assert requests.put(f"{COUCH}/{DB}/patient-8?new_edits=false", json=doc, auth=auth, timeout=30).status_code == 201
    page(browser, "conflicts")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "section[data-conflict='patient-8'] button[data-resolver='merge']")))
    click(browser, "section[data-conflict='patient-8'] button[data-resolver='merge']")
    def merged(base_url, key):
        d = admin(base_url, key, "GET", "/docs/patient-8?conflicts=true").json()
        return not d.get("_conflicts") and d.get("allergy") == "yes" and d.get("bed") == "yes"
    wait_for(lambda: merged(A, A_KEY) and merged(B, B_KEY), 20, "the merged patient on A and B")

    # A Mango query, with the index it used; the list by ID prefix.
    page(browser, "documents")
    wait.until(ec.presence_of_element_located((By.ID, "doc-prefix"))).send_keys("patient-8")
    listed = lambda: [a.get_attribute("data-doc") for a in browser.find_elements(By.CSS_SELECTOR, "#documents a[data-doc]")]
    try:
        wait_for(lambda: listed() == ["patient-8"], 10, "the prefix to list patient-8 alone")
    except AssertionError:
        raise AssertionError(f"the prefix lists {listed()}, {browser.find_element(By.ID, 'view').text[:300]!r}")
    box = wait.until(ec.presence_of_element_located((By.ID, "mango")))
    box.clear()
    box.send_keys(json.dumps({"selector": {"name": "Ada"}}))
    browser.find_element(By.ID, "mango-run").click()
    found = wait.until(ec.presence_of_element_located((By.ID, "mango-docs")))
    assert "patient-7" in found.text
    assert "Index used" in browser.find_element(By.ID, "mango-index").text
    shot(browser, "documents")

    # A document created from the page, then deleted with its revision (asked first).
    new_id = browser.find_element(By.ID, "new-id")
    new_id.send_keys("visit-1")
    body = browser.find_element(By.ID, "new-body")
    body.clear()
    body.send_keys(json.dumps({"type": "visit", "patient": "patient-7"}))
    browser.find_element(By.ID, "new-create").click()
    wait_for(lambda: "Created visit-1" in browser.find_element(By.ID, "new-message").text, 10, "the new document created")
    assert admin(A, A_KEY, "GET", "/docs/visit-1").json()["type"] == "visit"
    browser.find_element(By.ID, "new-create").click()  # again: it exists
    wait_for(lambda: "exists already" in browser.find_element(By.ID, "new-message").text, 10, "a second create refused")
    page(browser, "doc/visit-1")
    wait.until(ec.presence_of_element_located((By.ID, "doc-delete"))).click()
    wait.until(ec.visibility_of_element_located((By.ID, "doc-delete-confirm")))
    click(browser, "#doc-delete-yes")
    wait_for(lambda: admin(A, A_KEY, "GET", "/docs/visit-1").json().get("_deleted") is True, 10, "visit-1 deleted")

    # An edit on a stale revision is refused in plain words; a fresh one saves.
    page(browser, "doc/patient-7")
    editor = wait.until(ec.presence_of_element_located((By.ID, "doc-editor")))
    current = admin(A, A_KEY, "GET", "/docs/patient-7").json()
    admin(A, A_KEY, "PUT", "/docs/patient-7?rev=" + current["_rev"], {"name": "Ada", "ward": "d"})
    editor.clear()
    editor.send_keys(json.dumps({"name": "Ada", "ward": "e"}))
    browser.find_element(By.ID, "doc-save").click()
    message = wait.until(lambda d: d.find_element(By.ID, "doc-message").text and d.find_element(By.ID, "doc-message"))
    assert "stale" in message.text, message.text
    assert admin(A, A_KEY, "GET", "/docs/patient-7").json()["ward"] == "d"
    # The revision tree shows both branches of the resolved conflict and the winner.
    tree = browser.find_element(By.ID, "doc-revisions")
    assert len(tree.find_elements(By.CSS_SELECTOR, "li[data-rev]")) >= 4 and "winner" in tree.text, tree.text
    shot(browser, "document")
    page(browser, "doc/patient-7")
    editor = wait.until(ec.presence_of_element_located((By.ID, "doc-editor")))
    editor.clear()
    editor.send_keys(json.dumps({"name": "Ada", "ward": "f"}))
    browser.find_element(By.ID, "doc-save").click()
    wait_for(lambda: admin(A, A_KEY, "GET", "/docs/patient-7").json().get("ward") == "f", 10, "the fresh edit to be saved")

    # An attachment: uploaded from the page, downloaded byte for byte, and on B too.
    upload = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ferry-scan-%d.txt" % os.getpid())
    with open(upload, "wb") as f:
        f.write(b"scan of patient 7\n" * 100)
    page(browser, "doc/patient-7")
    wait.until(ec.presence_of_element_located((By.ID, "attach-file"))).send_keys(upload)
    browser.find_element(By.ID, "attach").click()
    link = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#attachments a[data-digest]")))
    session = {"ferry_session": browser.get_cookie("ferry_session")["value"]}
    content = requests.get(A + link.get_attribute("href").split(A, 1)[-1], cookies=session, timeout=30).content
    with open(upload, "rb") as f:
        assert content == f.read()
    digest = link.get_attribute("data-digest")
    wait_for(lambda: admin(B, B_KEY, "GET", "/blobs/" + digest).content == content, 20, "the attachment to reach B")
    os.remove(upload)

    # The group, with an invitation code; health; replications.
    page(browser, "group")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#members tr[data-member]")))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#members tr[data-member]")) == 3
    browser.find_element(By.ID, "invite").click()
    wait_for(lambda: "ferry1-" in browser.find_element(By.ID, "invite-code").text, 10, "an invitation code")
    shot(browser, "group")
    page(browser, "health")
    wait.until(ec.presence_of_element_located((By.ID, "chart-writes")))
    for i in range(4):  # a few writes, a second apart, so the charts have something to draw
        admin(A, A_KEY, "PUT", f"/docs/health-{i}", {"i": i})
        time.sleep(1)
    assert "writes/s" in browser.find_element(By.ID, "chart-writes").text
    # The time axis spans the history the page has gathered (a snapshot a second or so);
    # the value axis is in the chart's unit. Read in one go: the page redraws on each snapshot.
    def axes():
        chart = browser.find_element(By.ID, "chart-writes")
        found = {t.get_attribute("data-axis"): t.text for t in chart.find_elements(By.CSS_SELECTOR, "text[data-axis]")}
        found["lines"] = len(chart.find_elements(By.CSS_SELECTOR, "line.x-axis, line.y-axis"))
        return found
    wait_for(lambda: axes().get("from", "−0 s") not in ("−0 s", "−1 s", "−2 s"), 20, "a few seconds of history on the time axis")
    seen = {}
    def read_axes():
        seen.update(axes())
        return True
    wait_for(read_axes, 5, "the chart's axes")
    assert seen.get("to") == "now" and seen.get("from", "").endswith(" s") and seen.get("max", "").endswith("/s") and seen["lines"] == 2, seen
    icon = requests.get(A + "/favicon.ico", timeout=30)
    assert icon.status_code == 200 and icon.headers["Content-Type"].startswith("image/svg+xml") and b"<svg" in icon.content, icon.status_code
    shot(browser, "health")
    # The peer links, with the counters the CLI shows.
    page(browser, "replications")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#links tr[data-link]")))
    link_rows = browser.find_elements(By.CSS_SELECTOR, "#links tr[data-link]")
    assert any("pushed" in r.text and "pulled" in r.text and "received" in r.text for r in link_rows), [r.text for r in link_rows]
    # A CouchDB replication added from the page (to B's CouchDB API), paused, resumed, reset.
    b_couch = os.environ["FERRY_B_COUCH"].rstrip("/").replace("://", "://admin:" + B_KEY + "@", 1)
    wait.until(ec.presence_of_element_located((By.ID, "rep-url"))).send_keys(f"{b_couch}/{DB}")
    browser.find_element(By.ID, "rep-add").click()
    row = "#replications tr[data-replication]"
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row), 10, "the new replication listed")
    rep_id = browser.find_element(By.CSS_SELECTOR, row).get_attribute("data-replication")
    def rep():
        return next(r for r in admin(A, A_KEY, "GET", "/replications").json()["replications"] if r["id"] == rep_id)
    wait_for(lambda: rep()["status"]["activity"] == "idle", 20, "the replication to go idle")
    assert ":" + B_KEY + "@" not in browser.page_source, "the replication's password is never shown"
    click(browser, row + " button[data-action='pause']")
    wait_for(lambda: rep()["paused"], 10, "the replication paused")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, row + " button[data-action='resume']"), 10, "a Resume button")
    shot(browser, "replications")
    click(browser, row + " button[data-action='resume']")
    wait_for(lambda: not rep()["paused"], 10, "the replication resumed")
    click(browser, row + " button[data-action='reset']")
    wait_for(lambda: not rep()["paused"] and rep()["status"]["activity"] in ("idle", "busy"), 10, "the replication run again from the start")

    # A phone's width (375 px): every page fits it (nothing wider than the window), and the
    # page can be used by keyboard (Tab reaches the navigation, Enter follows a link).
    browser.set_window_size(375, 800)
    for name in ("mesh", "replications", "conflicts", "documents", "group", "health"):
        page(browser, name)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#view h1")))
        time.sleep(0.3)
        wide = browser.execute_script("return document.documentElement.scrollWidth")
        inner = browser.execute_script("return window.innerWidth")
        assert wide <= inner, f"{name} is {wide} px wide in a {inner} px window"
        shot(browser, "phone-" + name)
    page(browser, "mesh")
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    for _ in range(12):
        focused = browser.switch_to.active_element
        if focused.get_attribute("id") == "nav-documents":
            break
        focused.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("id") == "nav-documents", "Tab reaches the navigation"
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for(lambda: browser.current_url.endswith("#documents"), 5, "Enter to follow the link")
    browser.set_window_size(1100, 760)

    # Logging out ends the session: the page asks for the key again.
    browser.find_element(By.ID, "logout-button").click()
    wait.until(ec.presence_of_element_located((By.ID, "login")))
    browser.get(A + "/ui/")
    assert browser.current_url.endswith("/ui/login")


def test_a_one_time_link_logs_in_once(browser):
    r = requests.post(A + "/ui/tokens", headers={"Authorization": f"Bearer {A_KEY}", "Content-Type": "application/json"}, data="{}", timeout=30)
    assert r.status_code == 200, r.text
    path = r.json()["path"]
    browser.delete_all_cookies()
    browser.get(A + path)
    WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.ID, "view")))
    assert browser.current_url.endswith("/ui/"), browser.current_url
    second = requests.get(A + path, timeout=30, allow_redirects=False)
    assert second.status_code == 401, "a used link opens nothing"
