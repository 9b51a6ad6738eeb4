"""The console end to end in a real browser: Playwright driving Debian's Chromium.

One analyst and the admin go through the console as people would: sign in, browse the
schema, dry-run, run a GROUP BY and find its chart with error bars in the page's SVG,
watch the budget gauge move, re-run from history for free, see a refusal explained,
sign out; then, as admin, add an analyst (the key shown once, and working), set a
budget, rotate and disable, plot spend, and find the query in the audit log. Every
step is checked against the API itself, and the page must raise no error and break no
rule of its Content Security Policy. Screenshots of each page: ``test-artifacts/console``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.conftest import ARTIFACTS, Served

pytestmark = pytest.mark.slow

GROUP_BY = "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease"
DISEASES = 7  # the demo's declared values: every one is released, zeros included

NETWORK_STATUS = "Failed to load resource: the server responded with a status of 4"

# Runs before any of the page's scripts: records what the CSP refuses.
RECORD_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + e.blockedURI);
});
"""


class Watched:
    """A page, with everything that went wrong on it and every URL it asked for."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        self.urls: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("request", lambda r: self.urls.append(r.url))
        page.on("dialog", lambda d: d.accept())
        page.add_init_script(RECORD_CSP)

    def _console(self, message: Any) -> None:
        # Chromium logs every non-2xx fetch; refusals are expected answers, not page errors.
        if message.type == "error" and not message.text.startswith(NETWORK_STATUS):
            self.errors.append(message.text)

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def assert_clean(self, *secrets: str) -> None:
        assert self.errors == []
        assert self.page.evaluate("window.__csp") == []
        for secret in secrets:
            assert not any(secret in url for url in self.urls)


@pytest.fixture
def watched(chromium: Any) -> Iterator[Watched]:
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    try:
        yield Watched(context.new_page())
    finally:
        context.close()


def sign_in(w: Watched, served: Served, key: str) -> None:
    page = w.page
    page.goto(f"{served.url}/ui/")
    page.get_by_label("API key").fill(key)
    page.get_by_label("API key").press("Enter")
    page.locator("#who-name").wait_for()


def sign_out(w: Watched) -> None:
    w.page.get_by_role("button", name="Sign out").click()
    w.page.get_by_role("heading", name="Sign in").wait_for()
    assert w.page.evaluate("Object.keys(sessionStorage).length") == 0


def write(page: Any, sql: str, epsilon: str) -> None:
    """Type a query and its ε into the query form."""
    page.get_by_label("SQL").fill(sql)
    page.get_by_label("ε for this query").fill(epsilon)


def budget(served: Served, key: str) -> dict[str, Any]:
    status, body = served.call("GET", "/v1/budget", key=key)
    assert status == 200, body
    return dict(body["budget"])


def gauge(page: Any, name: str) -> float:
    return float(page.locator(f"#gauge-{name}").get_attribute("data-value"))


def test_an_analyst_and_the_admin_go_through_the_console(served: Served, watched: Watched) -> None:
    w, page, key = watched, watched.page, served.analyst_key

    # Sign in: the key is kept in this tab's sessionStorage only.
    page.goto(f"{served.url}/ui/")
    w.shot("01-sign-in")
    sign_in(w, served, key)
    assert page.evaluate("sessionStorage.getItem('dpgate.key')") == key
    assert page.evaluate("localStorage.length") == 0 and page.evaluate("document.cookie") == ""
    assert page.get_by_label("API key").input_value() == ""

    # Browse the schema: tables, columns, bounds and value lists from /v1/schema.
    schema = served.call("GET", "/v1/schema", key=key)[1]
    tree = page.locator("#schema-tree")
    tree.locator("details").first.wait_for()
    for table in schema["tables"]:
        assert tree.get_by_text(table["name"], exact=True).count() == 1
    patients = next(t for t in schema["tables"] if t["name"] == "patients")
    disease = next(c for c in patients["columns"] if c["name"] == "disease")
    assert tree.get_by_text(f"values: {', '.join(disease['values'])}").count() >= 1
    age = next(c for c in patients["columns"] if c["name"] == "age")
    assert tree.get_by_text(f"bounds {age['lower']:g} to {age['upper']:g}").count() >= 1
    w.shot("02-query")

    # Dry run: cost and expected accuracy, nothing spent.
    write(page, GROUP_BY, "0.5")
    page.get_by_role("button", name="Dry run (free)").click()
    dry = page.locator("#dry-run-result")
    dry.wait_for()
    expected = served.call(
        "POST", "/v1/query", {"sql": GROUP_BY, "epsilon": 0.5, "dry_run": True}, key
    )[1]
    assert "ε 0.5 (laplace)" in dry.inner_text()
    half = expected["accuracy"]["n"]["ci95_halfwidth"]
    assert f"± {half:g} (95%)" in dry.inner_text()
    before = budget(served, key)
    assert gauge(page, "spent") == before["epsilon_spent"]
    assert budget(served, key) == before  # the dry run spent nothing
    fit = expected["queries_remaining"]  # the dry run's own count (either accountant)
    assert page.locator("#gauge-fit").get_attribute("data-value") == str(fit)
    w.shot("03-dry-run")

    # Run the GROUP BY: a table with ±95% on each cell, and bars with error bars.
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator("#chart svg").wait_for()
    table_rows = page.locator("#result-table tbody tr")
    assert table_rows.count() == DISEASES
    assert all(f"± {half:g}" in t for t in table_rows.all_inner_texts())
    svg = page.locator("#chart svg")
    assert svg.locator('[aria-roledescription="bar"]').count() == DISEASES
    assert svg.locator('line[aria-roledescription="errorbar"]').count() == DISEASES
    assert page.locator("#refusal").is_hidden()
    w.shot("04-answer")

    # The gauge moved, by exactly what the ledger charged.
    after = budget(served, key)
    assert after["queries"] == before["queries"] + 1
    assert after["epsilon_spent"] > before["epsilon_spent"]
    page.wait_for_function(
        "v => Number(document.querySelector('#gauge-spent').dataset.value) === v",
        arg=after["epsilon_spent"],
    )
    assert gauge(page, "remaining") == pytest.approx(after["epsilon_remaining"])
    meter = float(page.locator("#budget-meter").get_attribute("value") or "nan")
    assert meter == pytest.approx(after["epsilon_spent"])

    # History, and a free re-run from the cache: the same rows, nothing charged.
    shown_rows = table_rows.all_inner_texts()
    page.get_by_role("link", name="History").click()
    history = page.locator("#history-table")
    history.get_by_text(GROUP_BY).wait_for()
    w.shot("05-history")
    history.get_by_role("button", name=re.compile("^Re-run for free")).first.click()
    page.locator('#result-meta[data-cached="true"]').wait_for()
    assert "free" in page.locator("#result-meta").inner_text()
    assert table_rows.all_inner_texts() == shown_rows
    again = budget(served, key)
    assert (again["queries"], again["epsilon_spent"]) == (after["queries"], after["epsilon_spent"])
    page.locator("#chart svg").wait_for()
    w.shot("06-rerun-from-cache")

    # A refusal, explained in plain words, for free.
    page.get_by_label("SQL").fill("SELECT name FROM patients")
    page.get_by_role("button", name="Run", exact=True).click()
    refusal = page.get_by_role("alert").filter(has_text="unknown_column")
    refusal.wait_for()
    assert "no such column among the published ones" in refusal.inner_text()
    assert "Nothing was spent" in refusal.inner_text()
    assert budget(served, key)["queries"] == after["queries"]
    w.shot("07-refusal")

    sign_out(w)
    w.shot("08-signed-out")

    # The admin: add an analyst, whose key is shown once and works.
    sign_in(w, served, served.admin_key)
    page.locator("#analysts-table tbody tr").first.wait_for()
    assert (
        page.locator("#analysts-table").get_by_role("cell", name="alice", exact=True).count() == 1
    )
    add = page.locator("#add-form")
    add.get_by_label("Name").fill("carol")
    add.get_by_label("ε budget").fill("2")
    add.get_by_label("δ budget").fill("0.000001")
    page.get_by_role("button", name="Add analyst").click()
    new_key = page.locator("#new-key-value")
    new_key.wait_for()
    carol_key = new_key.input_value()
    assert served.call("GET", "/v1/budget", key=carol_key)[1]["budget"]["epsilon"] == 2.0
    w.shot("09-new-analyst-key")
    page.get_by_role("button", name="Done, hide it").click()
    assert page.locator("#new-key-value").count() == 0
    assert carol_key not in page.content()

    # Set a budget.
    edit = page.locator("#edit-form")
    edit.get_by_label("Analyst").select_option("alice")
    edit.get_by_label("ε budget").fill("20")
    page.get_by_role("button", name="Save budget").click()
    page.locator("#analysts-table tbody tr", has_text="alice").get_by_role(
        "cell", name="20", exact=True
    ).wait_for()
    assert budget(served, key)["epsilon"] == 20.0

    # Rotate carol's key (the old one stops working), then disable her.
    page.get_by_role("button", name="Rotate the key of carol").click()
    page.locator("#new-key-value").wait_for()
    rotated = page.locator("#new-key-value").input_value()
    assert served.call("GET", "/v1/budget", key=carol_key)[0] == 401
    assert served.call("GET", "/v1/budget", key=rotated)[0] == 200
    page.get_by_role("button", name="Done, hide it").click()
    page.get_by_role("button", name="Disable carol").click()
    page.get_by_role("button", name="Enable carol").wait_for()
    assert served.call("GET", "/v1/budget", key=rotated)[0] == 403
    w.shot("10-analysts")

    # Spend over time: alice's one charge.
    page.get_by_role("link", name="Spend").click()
    page.locator("#spend-form").get_by_label("Analyst").select_option("alice")
    page.get_by_role("button", name="Show").click()
    page.locator("#spend-chart svg").wait_for()
    assert f"{after['queries']} charges" in page.locator("#spend-caption").inner_text()
    w.shot("11-spend")

    # The audit log, filtered by analyst and outcome, with the refusal.
    page.get_by_role("link", name="Audit log").click()
    audit = page.locator("#audit-table")
    audit.locator("tbody tr").first.wait_for()
    page.locator("#audit-form").get_by_label("Analyst").select_option("alice")
    page.locator("#audit-form").get_by_label("Outcome").select_option("answered")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('#audit-table tbody tr')]"
        ".every(r => r.children[3].textContent === 'answered')"
    )
    answered = audit.locator("tbody tr")
    assert answered.count() >= 1 and GROUP_BY in audit.inner_text()
    page.locator("#audit-form").get_by_label("Outcome").select_option("refused")
    page.get_by_role("button", name="Filter").click()
    audit.locator("span.refused", has_text="unknown_column").first.wait_for()
    assert "SELECT name FROM patients" in audit.inner_text()
    w.shot("12-audit-log")

    sign_out(w)
    w.assert_clean(key, served.admin_key, carol_key, rotated)


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)])
def test_the_console_fits_the_screen_is_labelled_and_works_from_the_keyboard(
    served: Served, chromium: Any, width: int, height: int
) -> None:
    context = chromium.new_context(viewport={"width": width, "height": height})
    try:
        w = Watched(context.new_page())
        page = w.page
        page.goto(f"{served.url}/ui/")
        # Keyboard only: Tab to the key field, type, Enter; Ctrl+Enter runs the query.
        for _ in range(10):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "signin-key":
                break
        page.keyboard.type(served.analyst_key)
        page.keyboard.press("Enter")
        page.locator("#schema-tree details").first.wait_for()
        page.get_by_label("SQL").fill("SELECT sex, COUNT(*) FROM patients GROUP BY sex")
        page.get_by_label("SQL").press("Control+Enter")
        page.locator("#chart svg").wait_for()
        for _ in range(80):  # the Run button is reachable by Tab
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "run":
                break
        assert page.evaluate("document.activeElement.id") == "run"
        # Every visible control has an accessible name.
        unnamed = page.evaluate(
            """() => [...document.querySelectorAll('input, select, textarea, button')]
              .filter(e => e.offsetParent !== null)
              .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label')
                           && !(e.tagName === 'BUTTON' && e.textContent.trim()))
              .map(e => e.outerHTML)"""
        )
        assert unnamed == []
        # Nothing sticks out sideways: the page scrolls only down.
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        w.shot(f"query-{width}x{height}")
        w.assert_clean(served.analyst_key)
    finally:
        context.close()


def test_the_gauge_says_how_many_more_queries_fit_and_exactly_that_many_do(
    served: Served, watched: Watched
) -> None:
    status, body = served.call(
        "POST",
        "/v1/admin/analysts",
        {"name": "dave", "epsilon": 1.0, "delta": 1e-6},
        served.admin_key,
    )
    assert status == 201, body
    dave = body["api_key"]
    page = watched.page
    sign_in(watched, served, dave)
    write(page, "SELECT COUNT(*) AS n0 FROM patients", "0.05")
    page.get_by_role("button", name="Dry run (free)").click()
    fit = page.locator("#gauge-fit[data-value]")
    fit.wait_for()
    n = int(fit.get_attribute("data-value") or "-1")
    assert n >= 2
    # Exactly n more such queries are admitted (distinct aliases: not cache hits).
    for i in range(n + 1):
        sql = f"SELECT COUNT(*) AS n{i} FROM patients"
        status, answer = served.call("POST", "/v1/query", {"sql": sql, "epsilon": 0.05}, dave)
        if i < n:
            assert status == 200 and answer["cached"] is False, answer
        else:
            assert (status, answer["error"]["code"]) == (403, "budget_exhausted"), answer
    # The page says so in plain words, and the gauge then says none fit (a new query:
    # "n0" itself would come back from the cache, free).
    page.get_by_label("SQL").fill("SELECT COUNT(*) AS more FROM patients")
    page.get_by_role("button", name="Run", exact=True).click()
    refusal = page.get_by_role("alert").filter(has_text="budget_exhausted")
    refusal.wait_for()
    assert "Your privacy budget cannot cover this query. Nothing was spent." in refusal.inner_text()
    page.get_by_role("button", name="Dry run (free)").click()
    page.locator('#gauge-fit[data-value="0"]').wait_for()
    watched.shot("14-budget-exhausted")
    sign_out(watched)
    watched.assert_clean(dave)


def test_the_admin_sets_a_budget_period_and_the_analyst_sees_it(
    served: Served, watched: Watched
) -> None:
    page = watched.page
    sign_in(watched, served, served.admin_key)
    page.locator("#analysts-table tbody tr").first.wait_for()
    edit = page.locator("#edit-form")
    edit.get_by_label("Analyst").select_option("alice")
    edit.get_by_label("Period").select_option("week")
    page.get_by_role("button", name="Save budget").click()
    row = page.locator("#analysts-table tbody tr", has_text="alice")
    row.get_by_text(re.compile(r"^week")).wait_for(timeout=5000)
    status, body = served.call("GET", "/v1/admin/budget", key=served.admin_key)
    assert status == 200, body
    # No global budget is configured yet: the first one names its ε and δ too.
    page.locator("#global-epsilon").fill("100")
    page.locator("#global-delta").fill("0.00001")
    page.locator("#global-period").select_option("month")
    page.get_by_role("button", name="Save global budget").click()
    page.locator("#global-figures").get_by_text(re.compile(r"^month")).wait_for(timeout=5000)
    watched.shot("13-budget-periods")
    sign_out(watched)
    sign_in(watched, served, served.analyst_key)
    page.locator("#gauge-period").wait_for(timeout=5000)
    assert "week" in page.locator("#gauge-period").inner_text()
    sign_out(watched)
    watched.assert_clean(served.analyst_key, served.admin_key)


def test_what_the_pages_say_is_tidy(served: Served, watched: Watched) -> None:
    """Issue 38's findings, looked at in the page: a year reads 2019 (table and axis), a
    public table is not described in rows per person, the spend axis uses one time
    format, and a refusal's "Refused." does not follow the analyst to History."""
    w, page, key = watched, watched.page, served.analyst_key
    sign_in(w, served, key)
    tree = page.locator("#schema-tree")
    tree.locator("details").first.wait_for()
    regions = tree.locator("details", has_text="zip_regions").first
    assert "per person" not in regions.inner_text() and "public rows" in regions.inner_text()

    page.get_by_label("SQL").fill("SELECT year, COUNT(*) AS n FROM visits GROUP BY year")
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator("#chart svg").wait_for()
    cells = page.locator("#result-table tbody tr td:first-child").all_inner_texts()
    assert "2019" in cells and not any("," in c for c in cells), cells
    ticks = page.locator("#chart svg").text_content() or ""
    assert "2,019" not in ticks and "2019.0" not in ticks
    w.shot("20-years")

    page.get_by_label("SQL").fill("SELECT name FROM patients")
    page.get_by_role("button", name="Run", exact=True).click()
    page.get_by_role("alert").filter(has_text="unknown_column").wait_for()
    assert page.locator("#status").inner_text() == "Refused."
    page.get_by_role("link", name="History").click()
    page.locator("#history-table tbody tr").first.wait_for()
    assert "Refused" not in page.locator("#status").inner_text()
    w.shot("21-history-after-refusal")
    sign_out(w)

    sign_in(w, served, served.admin_key)
    page.get_by_role("link", name="Spend").click()
    page.locator("#spend-form").get_by_label("Analyst").select_option("alice")
    page.get_by_role("button", name="Show").click()
    page.locator("#spend-chart svg").wait_for()
    labels = page.locator("#spend-chart svg").text_content() or ""
    assert " AM" not in labels and " PM" not in labels, labels
    assert re.search(r"\d\d-\d\d \d\d:\d\d", labels), labels  # month-day hour:minute
    w.shot("22-spend-axis")
    sign_out(w)
    w.assert_clean(key, served.admin_key)


def test_a_table_not_granted_to_the_analyst_is_not_in_the_console(
    served: Served, watched: Watched
) -> None:
    """Table grants (issue 39) in the console: a table granted only to a group the analyst
    is not in is missing from the schema tree and refused exactly as an undeclared table,
    for free; adding the analyst to the group shows it again, without a restart."""
    page, key, admin = watched.page, served.analyst_key, served.admin_key
    status, body = served.call(
        "POST", "/v1/admin/grants", {"table": "visits", "group": "cardiology"}, key=admin
    )
    assert status == 201, body
    try:
        sign_in(watched, served, key)
        tree = page.locator("#schema-tree")
        tree.get_by_text("patients", exact=True).wait_for()
        assert tree.get_by_text("visits", exact=True).count() == 0

        before = budget(served, key)
        page.get_by_label("SQL").fill("SELECT COUNT(*) AS n FROM visits")
        page.get_by_role("button", name="Run", exact=True).click()
        refusal = page.get_by_role("alert").filter(has_text="unknown_table")
        refusal.wait_for()
        assert "Nothing was spent" in refusal.inner_text()
        watched.shot("14-table-not-granted")
        # The page's words are the API's, and the API's are an undeclared table's.
        hidden = served.call("POST", "/v1/query", {"sql": "SELECT COUNT(*) FROM visits"}, key)[1]
        never = served.call("POST", "/v1/query", {"sql": "SELECT COUNT(*) FROM vizits"}, key)[1]
        assert hidden["error"]["code"] == never["error"]["code"] == "unknown_table"
        assert hidden["error"]["message"].replace("visits", "vizits") == never["error"]["message"]
        assert budget(served, key) == before
        sign_out(watched)
    finally:
        status, body = served.call(
            "POST", "/v1/admin/groups/cardiology/members", {"analyst": "alice"}, key=admin
        )
        assert status == 201, body

    sign_in(watched, served, key)
    page.locator("#schema-tree").get_by_text("visits", exact=True).wait_for(timeout=5000)
    sign_out(watched)
    watched.assert_clean(key, admin)


def analyst_who_asked(served: Served, name: str, sql: str) -> str:
    """A new analyst (ε 10) who has had ``sql`` answered at ε = 1; their key."""
    status, made = served.call(
        "POST",
        "/v1/admin/analysts",
        {"name": name, "epsilon": 10.0, "delta": 1e-6},
        key=served.admin_key,
    )
    assert status == 201, made
    key = str(made["api_key"])
    assert served.call("POST", "/v1/query", {"sql": sql, "epsilon": 1.0}, key)[0] == 200
    return key


def test_rows_the_audit_left_out_are_named_under_the_answer(
    served: Served, watched: Watched
) -> None:
    """An answer with rows left out says which under its table, and why (the API's
    ``audit_left_out``). Its own analyst, so that the others' sessions stay as they are:
    the mean glucose by disease, then the count by disease — the 4 Meningitis patients
    without a reading (k = 5, ε = 1) cannot be shown to hold 5, so that row goes."""
    page, admin = watched.page, served.admin_key
    readings = "SELECT disease, AVG(glucose) AS g FROM patients GROUP BY disease"
    key = analyst_who_asked(served, "frida", readings)
    sign_in(watched, served, key)
    write(page, GROUP_BY, "1")
    page.get_by_role("button", name="Run", exact=True).click()
    note = page.locator("#result-note")
    note.wait_for()
    text = note.inner_text()
    assert "Left out by the audit: " in text and "disease = Meningitis" in text
    assert "glucose IS NULL" in text
    shown = page.locator("#result-table tbody tr").all_inner_texts()
    assert len(shown) < DISEASES and not any(t.startswith("Meningitis") for t in shown)
    watched.shot("15-rows-left-out")
    sign_out(watched)
    watched.assert_clean(key, admin)


def test_a_refusal_offers_queries_to_ask_instead_and_one_click_puts_one_in_the_editor(
    served: Served, watched: Watched
) -> None:
    """The dry run predicts the refusal and says what to ask instead (the API's
    ``audit.ask_instead``); so does the refusal itself. "Use" puts a suggestion in the
    editor, and that query is answered. Its own analyst: the average income of
    everyone, then the sum over non-smokers (whose other part, the smokers, no count
    sizes), then the same sum with COUNT(*), as the console suggests."""
    page, admin = watched.page, served.admin_key
    key = analyst_who_asked(served, "gabor", "SELECT AVG(income) AS m FROM patients")
    sign_in(watched, served, key)
    write(page, "SELECT SUM(income) AS s FROM patients WHERE NOT smoker", "1")
    page.get_by_role("button", name="Dry run (free)").click()
    figures = page.locator("#dry-run-figures")
    figures.wait_for()
    assert "refused now (free)" in figures.inner_text()
    assert "smoker = TRUE" in page.locator("#dry-run-audit").inner_text()
    page.get_by_role("button", name="Run", exact=True).click()
    refusal = page.get_by_role("alert").filter(has_text="audit_refused")
    refusal.wait_for()
    assert "Nothing was spent" in refusal.inner_text() and "Ask instead:" in refusal.inner_text()
    watched.shot("16-ask-instead")
    refusal.get_by_role("button", name="Put this query in the editor: SELECT SUM").click()
    counted = "SELECT SUM(income) AS s, COUNT(*) AS n FROM patients WHERE NOT smoker"
    assert page.get_by_label("SQL").input_value() == counted
    page.get_by_role("button", name="Run", exact=True).click()
    page.locator("#result-table tbody tr").first.wait_for()
    assert page.locator("#result-table thead").inner_text().split() == ["s", "n"]
    sign_out(watched)
    watched.assert_clean(key, admin)
