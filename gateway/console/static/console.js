// dpgate console: a static page over the public HTTP API.
//
// The API key lives in sessionStorage (this tab only) and travels only in the
// Authorization header of same-origin fetches; it is never put in a URL, the page or a
// log (a new key an admin creates is shown once, in a read-only field, then dropped). Everything shown comes from API responses and is written with textContent, never
// parsed as HTML. Charts are Vega-Lite specs built by the server (gateway/console/charts.py)
// and rendered with Vega's expression interpreter (no eval, so the page's CSP forbids it).

const KEY_STORAGE = "dpgate.key";
const ROLE_STORAGE = "dpgate.role";
const NAME_STORAGE = "dpgate.name";
// The exact body each answer was asked with (this tab only): a re-run must repeat the
// request's ε, δ and mechanism to hit the cache, and the history does not record the δ
// a Laplace request named.
const SENT_STORAGE = "dpgate.sent";
const SENT_KEEP = 200;

const $ = (id) => document.getElementById(id);

const state = {
  key: sessionStorage.getItem(KEY_STORAGE),
  role: sessionStorage.getItem(ROLE_STORAGE),
  name: sessionStorage.getItem(NAME_STORAGE),
  budget: null, // the analyst's latest budget object
  lastCost: null, // the privacy block of the latest dry run or answer
  lastQueriesRemaining: null, // a dry run's own count, when the gateway sends one
  analysts: [],
  view: null, // the page shown (its status message does not follow the analyst)
};

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, error) {
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || "internal";
    this.detail = error.detail || {};
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
      redirect: "error",
    });
  } catch (e) {
    throw new ApiError(0, { code: "network", message: "the gateway could not be reached" });
  }
  let data = null;
  try {
    data = await response.json();
  } catch (e) {
    data = null;
  }
  if (!response.ok || !data || data.ok === false) {
    throw new ApiError(response.status, (data && data.error) || {});
  }
  return data;
}

// ---------------------------------------------------------------- DOM helpers

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replaceChildren that skips absent parts (null, undefined, false) instead of printing them.
function fill(node, ...children) {
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

function show(node, visible = true) {
  node.hidden = !visible;
}

function say(message) {
  $("status").textContent = message;
}

function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return x > 0 ? "∞" : "−∞";
  if (Number.isInteger(x)) return x.toLocaleString("en");
  const abs = Math.abs(x);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e9)) return x.toExponential(2);
  return x.toLocaleString("en", { maximumFractionDigits: digits });
}

function when(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : d.toLocaleString();
}

function table(caption, headers, rows) {
  const head = el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })));
  const body = rows.map((cells) =>
    el("tr", {}, cells.map((c) => (c instanceof Node ? el("td", {}, c) : el("td", { text: fmt(c) })))),
  );
  return el("table", {}, el("caption", { text: caption }), el("thead", {}, head), el("tbody", {}, body));
}

// ---------------------------------------------------------------- refusals in plain words

function explain(error) {
  const d = error.detail || {};
  const charged = d.charged === true;
  const words = {
    network: "The gateway could not be reached. Check that it is running and try again.",
    unauthenticated: "The gateway does not recognise this key. Sign in again with a valid key.",
    forbidden: "This key may not do that (an analyst key cannot manage analysts, the admin key cannot query, or the analyst is disabled).",
    budget_exhausted: "Your privacy budget cannot cover this query. Nothing was spent. Ask for a smaller ε, or ask your admin for more budget.",
    audit_refused: charged
      ? "The answer was withheld: together with your earlier answers it would pin down a group that the noisy answers cannot show to hold enough people. The query was charged because it had already run."
      : "Refused to protect individuals: together with your earlier answers, this query would pin down a group that the noisy answers cannot show to hold enough people. Nothing was spent.",
    sql_syntax: `The SQL has a syntax error${d.line ? ` at line ${d.line}, column ${d.column}` : ""}${d.near ? ` near “${d.near}”` : ""}. Nothing was spent.`,
    unsupported_query: "dpgate cannot answer this kind of query with differential privacy. Nothing was spent.",
    unknown_table: "There is no such table among the published ones (see the schema). Nothing was spent.",
    unknown_column: "There is no such column among the published ones (see the schema). Nothing was spent.",
    invalid_privacy_parameters: "The privacy parameters (ε, δ or mechanism) are not allowed here. Nothing was spent.",
    invalid_request: "The request was not valid.",
    rate_limited: `Too many requests: wait ${d.retry_after ?? "a few"} seconds and try again.`,
    database_unavailable: charged
      ? "The database failed after the query was sent, so it was charged; nothing about the data was released."
      : "The protected database is not available right now. Nothing was spent.",
    ledger_unavailable: "The budget ledger is not available right now. Nothing was spent.",
    not_found: "Not found.",
    conflict: "That already exists.",
    internal: "The gateway hit an internal error. Quote the request id to your admin.",
  };
  return words[error.code] || "The request failed.";
}

function showError(box, error) {
  fill(
    box,
    el("p", { class: "plain", text: explain(error) }),
    el("p", { class: "detail" }, el("code", { text: error.code }), ": ", error.message),
    error.detail && error.detail.request_id
      ? el("p", { class: "detail", text: `request id ${error.detail.request_id}` })
      : null,
    askInstead(error.detail && error.detail.ask_instead),
  );
  show(box);
}

// The auditor's suggestions (queries built from the refused one and the groups it
// names): each button puts one in the editor, to read, change or run.
function askInstead(queries) {
  if (!queries || !queries.length) return null;
  return el(
    "div",
    { class: "ask-instead" },
    el("p", { text: "Ask instead:" }),
    el(
      "ul",
      {},
      queries.map((q) =>
        el(
          "li",
          {},
          el("button", {
            type: "button",
            text: "Use",
            "aria-label": `Put this query in the editor: ${q}`,
            onclick: () => {
              $("sql").value = q;
              $("sql").focus();
            },
          }),
          " ",
          el("code", { class: "sql", text: q }),
        ),
      ),
    ),
  );
}

// ---------------------------------------------------------------- signing in and out

async function signIn(key) {
  state.key = key;
  try {
    const data = await api("GET", "/v1/budget");
    return { role: "analyst", name: data.budget.name };
  } catch (e) {
    if (!(e instanceof ApiError) || e.code !== "forbidden") throw e;
  }
  await api("GET", "/v1/admin/analysts");
  return { role: "admin", name: "admin" };
}

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("signin-key");
  const key = input.value.trim();
  show($("signin-error"), false);
  if (!key) {
    showError($("signin-error"), new ApiError(400, { code: "unauthenticated", message: "enter an API key" }));
    return;
  }
  try {
    const who = await signIn(key);
    input.value = "";
    sessionStorage.setItem(KEY_STORAGE, key);
    sessionStorage.setItem(ROLE_STORAGE, who.role);
    sessionStorage.setItem(NAME_STORAGE, who.name);
    Object.assign(state, { role: who.role, name: who.name });
    say(`Signed in as ${who.name}.`);
    const target = who.role === "admin" ? "#analysts" : "#query";
    if (location.hash === target) route();
    else location.hash = target; // hashchange routes
  } catch (e) {
    state.key = null;
    showError($("signin-error"), e);
  }
});

$("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORAGE);
  sessionStorage.removeItem(ROLE_STORAGE);
  sessionStorage.removeItem(NAME_STORAGE);
  sessionStorage.removeItem(SENT_STORAGE);
  Object.assign(state, { key: null, role: null, name: null, budget: null, lastCost: null });
  for (const id of ["result", "dry-run-result", "refusal", "new-key", "chart-figure", "spend-figure"]) show($(id), false);
  for (const id of ["result-table", "chart", "history-table", "analysts-table", "audit-table", "spend-chart", "gauge"]) $(id).replaceChildren();
  history.replaceState(null, "", "#signin");
  route();
  say("Signed out. The key was removed from this tab.");
});

// ---------------------------------------------------------------- routing

const VIEWS = {
  signin: { role: null, enter: async () => {} },
  query: { role: "analyst", enter: enterQuery },
  history: { role: "analyst", enter: enterHistory },
  analysts: { role: "admin", enter: enterAnalysts },
  spend: { role: "admin", enter: enterSpend },
  audit: { role: "admin", enter: enterAudit },
};

function route() {
  let name = location.hash.replace(/^#/, "") || "";
  if (!state.key) name = "signin";
  else if (!VIEWS[name] || VIEWS[name].role !== state.role) name = state.role === "admin" ? "analysts" : "query";
  // A message belongs to the page it was said on ("Refused." must not follow the analyst
  // to History); the sign-in page's greeting carries over to the first page.
  if (state.view && state.view !== "signin" && state.view !== name) say("");
  state.view = name;
  for (const view of Object.keys(VIEWS)) show($(`view-${view}`), view === name);
  const signedIn = Boolean(state.key);
  show($("nav"), signedIn);
  show($("who"), signedIn);
  $("who-name").textContent = signedIn ? `${state.name} (${state.role})` : "";
  for (const item of document.querySelectorAll("#nav li")) {
    show(item, item.dataset.role === state.role);
    const link = item.querySelector("a");
    if (link.getAttribute("href") === `#${name}`) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = `dpgate console — ${$(`view-${name}`).querySelector("h2").textContent}`;
  $(`view-${name}`).querySelector("h2").focus();
  VIEWS[name].enter().catch((e) => say(explain(e)));
}

window.addEventListener("hashchange", route);

// ---------------------------------------------------------------- analyst: schema

function describeColumn(c) {
  const parts = [c.type];
  if (c.privacy_unit) parts.push("privacy unit");
  if (c.lower !== undefined && c.upper !== undefined) parts.push(`bounds ${c.lower} to ${c.upper}`);
  if (c.nullable) parts.push("nullable");
  return parts.join(", ");
}

function insertAtCursor(text) {
  const sql = $("sql");
  const start = sql.selectionStart;
  const end = sql.selectionEnd;
  sql.setRangeText(text, start, end, "end");
  sql.focus();
}

async function loadSchema() {
  const data = await api("GET", "/v1/schema");
  const tree = $("schema-tree");
  tree.replaceChildren(
    ...data.tables.map((t) => {
      const meta = [];
      if (t.public) meta.push(`public rows${t.key ? `, one per ${t.key}` : ""}: no person's data`);
      if (t.privacy_unit) meta.push(`one person = one ${t.privacy_unit}`);
      // contribution bounds mean something only where rows belong to people
      const per = (n, what) => `≤ ${n} ${what}${n === 1 ? "" : "s"} per person`;
      if (t.privacy_unit && t.max_rows_per_unit) meta.push(per(t.max_rows_per_unit, "row"));
      if (t.privacy_unit && t.max_groups_per_unit) meta.push(per(t.max_groups_per_unit, "group"));
      const columns = el(
        "ul",
        { class: "columns" },
        t.columns.map((c) =>
          el(
            "li",
            {},
            el("button", {
              type: "button",
              class: "linklike",
              text: c.name,
              "aria-label": `Insert column ${c.name}`,
              onclick: () => insertAtCursor(c.name),
            }),
            el("span", { class: "type", text: ` ${describeColumn(c)}` }),
            c.values ? el("div", { class: "values", text: `values: ${c.values.join(", ")}` }) : null,
          ),
        ),
      );
      return el(
        "details",
        { class: "table", open: window.matchMedia("(min-width: 901px)").matches },
        el("summary", {}, el("span", { class: "table-name", text: t.name }), el("span", { class: "type", text: ` ${meta.join("; ")}` })),
        columns,
      );
    }),
  );
}

// ---------------------------------------------------------------- analyst: budget gauge

function queriesThatFit(budget, privacy) {
  if (!budget || !privacy) return null;
  const slack = 1 + 1e-9;
  let n = Infinity;
  if (budget.composition === "pure") {
    if (privacy.epsilon > 0) n = Math.floor((budget.epsilon_remaining * slack) / privacy.epsilon);
  } else if (privacy.rho > 0) {
    n = Math.floor((budget.rho_remaining * slack) / privacy.rho);
  }
  if (privacy.selection_delta > 0) {
    n = Math.min(n, Math.floor((budget.delta_remaining * slack) / privacy.selection_delta));
  }
  return Number.isFinite(n) ? Math.max(0, n) : null;
}

function renderGauge() {
  const b = state.budget;
  const box = $("gauge");
  if (!b) {
    box.replaceChildren();
    return;
  }
  const meter = el("meter", {
    id: "budget-meter",
    min: 0,
    max: b.epsilon,
    value: Math.min(b.epsilon_spent, b.epsilon),
    high: b.epsilon * 0.8,
    optimum: 0,
    "aria-labelledby": "gauge-title",
    "aria-valuetext": `ε spent ${fmt(b.epsilon_spent)} of ${fmt(b.epsilon)}`,
  });
  const rows = [
    ["ε spent", b.epsilon_spent, "gauge-spent"],
    ["ε remaining", b.epsilon_remaining, "gauge-remaining"],
    ["ε budget", b.epsilon, "gauge-total"],
    ["δ left for partition selection", b.delta_remaining, "gauge-delta"],
    ["queries charged", b.queries, "gauge-queries"],
  ];
  const list = el(
    "dl",
    { class: "figures" },
    rows.map(([label, value, id]) => [el("dt", { text: label }), el("dd", { id, "data-value": value, text: fmt(value) })]),
  );
  const fit = state.lastQueriesRemaining ?? queriesThatFit(b, state.lastCost);
  const fits = el("p", { id: "gauge-fit" });
  if (state.lastCost && fit !== null) {
    const used = state.lastCost.selection_delta > 0 ? `, partition-selection δ ${fmt(state.lastCost.selection_delta)}` : "";
    fits.textContent = `${fmt(fit)} more ${fit === 1 ? "query" : "queries"} like the last one (ε ${fmt(state.lastCost.epsilon)}${used}) fit${used ? ", in ε and in the δ left" : ""}.`;
    fits.dataset.value = String(fit);
  } else {
    fits.textContent = "Dry-run a query to see how many like it still fit.";
  }
  const period = b.period && b.period !== "none"
    ? el("p", { id: "gauge-period", text: `Budget period: ${b.period}${b.period_ends_at ? `, renews ${when(b.period_ends_at)}` : ""}.` })
    : null;
  const deltaUse = b.selection_delta_budget < b.delta
    ? ` Of δ ${fmt(b.delta)}, ${fmt(b.selection_delta_budget)} is kept for partition selection (grouping by values that are not public); the rest converts the zCDP total to (ε, δ).`
    : "";
  fill(box, meter, list, fits, period, el("p", { class: "hint", text: `Accounting: ${b.composition}.${deltaUse}` }));
}

async function refreshBudget() {
  const data = await api("GET", "/v1/budget");
  state.budget = data.budget;
  renderGauge();
}

// ---------------------------------------------------------------- analyst: dry run and run

function queryBody(dryRun) {
  const body = { sql: $("sql").value };
  const eps = $("epsilon").value.trim();
  const delta = $("delta").value.trim();
  const mechanism = $("mechanism").value;
  if (eps) body.epsilon = Number(eps);
  if (delta) body.delta = Number(delta);
  if (mechanism) body.mechanism = mechanism;
  if (dryRun) body.dry_run = true;
  return body;
}

function accuracyText(acc, value, rowIndex) {
  if (!acc) return null;
  if (acc.ci95_intervals) {
    const pair = acc.ci95_intervals[rowIndex];
    return pair ? `95%: ${fmt(pair[0], 2)} to ${fmt(pair[1], 2)}` : "95%: —";
  }
  if (acc.ci95_halfwidth !== undefined) return `± ${fmt(acc.ci95_halfwidth, 2)}`;
  return null;
}

const AUDIT_VERDICTS = {
  answered: "answered",
  answered_in_part: "answered with some rows left out (charged)",
  may_be_withheld: "may be withheld once it has run (charged)",
  refused: "refused now (free)",
};

function renderDryRun(data) {
  const p = data.privacy;
  const fit = data.queries_remaining ?? queriesThatFit(data.budget, p);
  const items = [
    ["Cost", `ε ${fmt(p.epsilon)}${p.delta ? `, δ ${fmt(p.delta)}` : ""}${p.selection_delta ? `, partition-selection δ ${fmt(p.selection_delta)}` : ""} (${p.mechanism})`],
    ["Fits your budget now", data.would_fit ? "yes" : "no"],
    ["Queries like it that fit", fit === null ? "—" : fmt(fit)],
  ];
  const audit = data.audit;
  if (audit) items.push(["Audit", AUDIT_VERDICTS[audit.verdict] || audit.verdict]);
  const accRows = Object.entries(data.accuracy || {}).map(([name, acc]) => {
    const inner = acc.ci95_halfwidth !== undefined ? acc : acc.sum ? null : acc;
    const text = inner
      ? `± ${fmt(inner.ci95_halfwidth, 2)} (95%), standard deviation ${fmt(inner.stddev, 2)}`
      : `a ratio: noisy SUM ± ${fmt(acc.sum.ci95_halfwidth, 2)} over noisy COUNT ± ${fmt(acc.count.ci95_halfwidth, 2)} (95%)`;
    return [name, text];
  });
  const plan = data.plan || {};
  const keys = (plan.group_keys || []).map((k) => `${k.name} (${k.release})`).join(", ");
  fill(
    $("dry-run-body"),
    el("dl", { class: "figures", id: "dry-run-figures" }, items.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])),
    accRows.length ? table("Expected accuracy of each noisy column", ["column", "expected error"], accRows) : null,
    keys ? el("p", { text: `Groups: ${keys}.` }) : null,
    audit && audit.verdict !== "answered" ? el("p", { class: "note", id: "dry-run-audit", text: audit.reason }) : null,
    askInstead(audit && audit.ask_instead),
    data.partition_selection && data.partition_selection.note
      ? el("p", { class: "note", text: data.partition_selection.note })
      : plan.partition_selection
        ? el("p", { class: "note", text: `Groups whose values are not public are released only if their noisy number of people reaches ${fmt(plan.partition_selection.threshold)}.` })
        : null,
  );
  show($("dry-run-result"));
}

const views = new Map(); // chart container id → its Vega view, finalized before a redraw

async function renderChart(target, figure, caption, spec, text) {
  if (views.has(target.id)) {
    views.get(target.id).finalize();
    views.delete(target.id);
  }
  target.replaceChildren();
  if (!spec) {
    show(figure, false);
    return;
  }
  show(figure);
  caption.textContent = text;
  if (typeof window.vegaEmbed !== "function") {
    target.textContent = "The chart library did not load.";
    return;
  }
  const result = await window.vegaEmbed(target, spec, {
    renderer: "svg",
    actions: false,
    ast: true, // Vega's expression interpreter: no eval, as the CSP requires
    defaultStyle: false, // its <style> element would break the CSP: console.css styles it
    tooltip: { disableDefaultStyle: true },
  });
  views.set(target.id, result.view);
  const svg = target.querySelector("svg");
  if (svg) {
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", text);
  }
}

async function renderAnswer(data) {
  const fromCache = data.cached === true;
  $("result-meta").textContent = fromCache
    ? "Answered from the cache: the same answer as before, free."
    : `Charged ε ${fmt(data.privacy.epsilon)} (${data.privacy.mechanism}).`;
  $("result-meta").dataset.cached = String(fromCache);
  const leftOut = data.audit_left_out
    ? `Left out by the audit: ${data.audit_left_out.groups
        .map((g) => Object.entries(g).map(([k, v]) => `${k} = ${v}`).join(", "))
        .join("; ")} (${data.audit_left_out.reason})`
    : null;
  const notes = [leftOut, data.partition_selection && data.partition_selection.note, data.clamped && data.clamped.note];
  const note = notes.filter(Boolean).join(" ");
  fill($("result-note"), note || "", askInstead(data.audit_left_out && data.audit_left_out.ask_instead));
  show($("result-note"), Boolean(note));
  const accuracy = data.accuracy || {};
  const headers = data.columns.map((c) => c.name);
  const rows = data.rows.map((row, i) =>
    row.map((value, j) => {
      const acc = accuracyText(accuracy[headers[j]], value, i);
      // a group key is a label, not an amount: 2019, not 2,019
      if (!acc) return value === null ? "NULL" : String(value);
      return el("span", {}, el("span", { class: "value", text: fmt(value) }), " ", el("span", { class: "ci", text: acc }));
    }),
  );
  $("result-table").replaceChildren(
    table(`${data.rows.length} ${data.rows.length === 1 ? "row" : "rows"}; noisy cells show their 95% interval`, headers, rows),
  );
  show($("result"));
  const chart = data.query_id && data.rows.length ? (await api("GET", `/ui/api/charts/release/${encodeURIComponent(data.query_id)}`)).chart : null;
  await renderChart(
    $("chart"),
    $("chart-figure"),
    $("chart-caption"),
    chart && chart.spec,
    chart ? `${chart.kind === "bars" ? "Bars" : "A line"} of ${chart.measure} by ${chart.keys.join(" · ")}, with 95% intervals.` : "",
  );
}


function rememberSent(queryId, body) {
  let sent = {};
  try {
    sent = JSON.parse(sessionStorage.getItem(SENT_STORAGE) || "{}");
  } catch (e) {
    sent = {};
  }
  sent[queryId] = { ...body, dry_run: undefined };
  const ids = Object.keys(sent);
  for (const id of ids.slice(0, Math.max(0, ids.length - SENT_KEEP))) delete sent[id];
  sessionStorage.setItem(SENT_STORAGE, JSON.stringify(sent));
}

function sentBody(queryId) {
  try {
    return JSON.parse(sessionStorage.getItem(SENT_STORAGE) || "{}")[queryId] || null;
  } catch (e) {
    return null;
  }
}

async function runQuery(dryRun, exactBody = null) {
  show($("refusal"), false);
  say(dryRun ? "Dry run…" : "Running…");
  try {
    const body = exactBody || queryBody(dryRun);
    const data = await api("POST", "/v1/query", body);
    if (!dryRun && data.query_id && !data.cached) rememberSent(data.query_id, body);
    state.lastCost = data.privacy;
    state.lastQueriesRemaining = dryRun ? data.queries_remaining ?? null : null;
    if (data.budget) state.budget = data.budget;
    if (dryRun) {
      renderDryRun(data);
    } else {
      show($("dry-run-result"), false);
      await renderAnswer(data);
      await refreshBudget();
    }
    renderGauge();
    say(dryRun ? "Dry run done: nothing was spent." : data.cached ? "Answered from the cache, free." : "Answered.");
  } catch (e) {
    show($("result"), false);
    show($("dry-run-result"), false);
    if (e instanceof ApiError) showError($("refusal"), e);
    else showError($("refusal"), new ApiError(0, { code: "internal", message: String(e) }));
    say("Refused.");
    refreshBudget().catch(() => {});
  }
}

$("query-form").addEventListener("submit", (event) => {
  event.preventDefault();
  runQuery(false);
});
$("dry-run").addEventListener("click", () => runQuery(true));
$("sql").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    runQuery(false);
  }
});

async function enterQuery() {
  await Promise.all([loadSchema(), refreshBudget()]);
}

// ---------------------------------------------------------------- analyst: history

async function enterHistory() {
  const data = await api("GET", "/v1/queries?limit=200");
  const rows = data.queries.slice().reverse().map((q) => {
    const rerun = q.outcome === "answered"
      ? el("button", {
          type: "button",
          text: "Re-run (free)",
          "aria-label": `Re-run for free: ${q.sql}`,
          onclick: () => rerunFromHistory(q),
        })
      : el("span", { class: "hint", text: q.reason || "" });
    return [when(q.created_at), el("code", { class: "sql", text: q.sql }), q.cost ? q.cost.epsilon : null, q.outcome, rerun];
  });
  $("history-table").replaceChildren(
    rows.length ? table("Your queries, newest first", ["time", "SQL", "ε charged", "outcome", ""], rows) : el("p", { text: "No queries yet." }),
  );
}

function rerunFromHistory(q) {
  // The cache answers only the identical request: the body this tab sent, or else the
  // recorded ε and mechanism (and δ for the Gaussian; a Laplace request's δ is taken to
  // be the default, as the console sends it unless told otherwise).
  const p = q.release && q.release.privacy ? q.release.privacy : q.cost || {};
  const body = sentBody(q.query_id) || { sql: q.sql, epsilon: p.epsilon, mechanism: q.mechanism };
  if (!sentBody(q.query_id) && q.mechanism === "gaussian" && p.delta) body.delta = p.delta;
  $("sql").value = body.sql;
  $("epsilon").value = body.epsilon ?? "";
  $("mechanism").value = body.mechanism === "gaussian" || body.mechanism === "laplace" ? body.mechanism : "";
  $("delta").value = body.delta ?? "";
  if (location.hash !== "#query") history.replaceState(null, "", "#query");
  route();
  runQuery(false, body);
}

// ---------------------------------------------------------------- admin: analysts and budgets

function fillAnalystSelect(select, names, keepFirst) {
  const current = select.value;
  const first = keepFirst ? [select.options[0].cloneNode(true)] : [];
  select.replaceChildren(...first, ...names.map((n) => el("option", { value: n, text: n })));
  if ([...select.options].some((o) => o.value === current)) select.value = current;
}

function periodText(s) {
  if (!s.period) return "—";
  return s.period_ends_at ? `${s.period} (renews ${when(s.period_ends_at)})` : s.period;
}

async function loadAnalysts() {
  const data = await api("GET", "/v1/admin/analysts");
  state.analysts = data.analysts;
  const names = data.analysts.map((a) => a.name);
  fillAnalystSelect($("edit-name"), names, false);
  fillAnalystSelect($("spend-name"), names, false);
  fillAnalystSelect($("audit-analyst"), names, true);
  return data;
}

async function enterAnalysts() {
  const data = await loadAnalysts();
  const rows = data.analysts.map((a) => [
    a.name,
    a.epsilon,
    a.epsilon_spent,
    a.epsilon_remaining,
    a.delta,
    periodText(a),
    a.queries,
    a.disabled ? "disabled" : "active",
    el(
      "span",
      { class: "row-actions" },
      el("button", {
        type: "button",
        text: a.disabled ? "Enable" : "Disable",
        "aria-label": `${a.disabled ? "Enable" : "Disable"} ${a.name}`,
        onclick: () => adminAction(() => api("PATCH", `/v1/admin/analysts/${encodeURIComponent(a.name)}`, { disabled: !a.disabled }), `${a.name} ${a.disabled ? "enabled" : "disabled"}.`),
      }),
      el("button", {
        type: "button",
        text: "Rotate key",
        "aria-label": `Rotate the key of ${a.name}`,
        onclick: () => rotateKey(a.name),
      }),
    ),
  ]);
  $("analysts-table").replaceChildren(
    table("Analysts and their budgets", ["name", "ε budget", "ε spent", "ε remaining", "δ budget", "period", "queries", "status", "actions"], rows),
  );
  await renderGlobalBudget(data.global);
}

async function adminAction(call, done, box = null) {
  try {
    await call();
    say(done);
    await enterAnalysts();
    return true;
  } catch (e) {
    if (box) showError(box, e);
    else say(`${explain(e)} (${e.message})`);
    return false;
  }
}

function showNewKey(name, key) {
  const box = $("new-key");
  const value = el("input", { id: "new-key-value", type: "text", readonly: true, value: key, "aria-label": `New API key of ${name}` });
  box.replaceChildren(
    el("p", { text: `New API key for ${name}. It is shown only this once: copy it now and hand it over safely.` }),
    value,
    el("button", {
      type: "button",
      text: "Copy",
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(key);
          say("Copied.");
        } catch (e) {
          value.select();
          say("Select the key and copy it.");
        }
      },
    }),
    el("button", { type: "button", text: "Done, hide it", onclick: () => { box.replaceChildren(); show(box, false); } }),
  );
  show(box);
  value.focus();
  value.select();
}

async function rotateKey(name) {
  if (!window.confirm(`Rotate the key of ${name}? The old key stops working at once.`)) return;
  try {
    const data = await api("POST", `/v1/admin/analysts/${encodeURIComponent(name)}/keys`);
    showNewKey(name, data.api_key);
    say(`Rotated the key of ${name}.`);
  } catch (e) {
    say(`${explain(e)} (${e.message})`);
  }
}

$("add-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const box = $("add-error");
  show(box, false);
  const body = {
    name: $("add-name").value.trim(),
    epsilon: Number($("add-epsilon").value),
    delta: Number($("add-delta").value),
  };
  if ($("add-period").value) body.period = $("add-period").value;
  try {
    const data = await api("POST", "/v1/admin/analysts", body);
    $("add-name").value = "";
    await enterAnalysts();
    showNewKey(data.name, data.api_key);
    say(`Added ${data.name}.`);
  } catch (e) {
    showError(box, e);
  }
});

$("edit-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const box = $("edit-error");
  show(box, false);
  const name = $("edit-name").value;
  const body = {};
  if ($("edit-epsilon").value.trim()) body.epsilon = Number($("edit-epsilon").value);
  if ($("edit-delta").value.trim()) body.delta = Number($("edit-delta").value);
  if ($("edit-period").value) body.period = $("edit-period").value;
  if (!name || Object.keys(body).length === 0) {
    showError(box, new ApiError(400, { code: "invalid_request", message: "choose an analyst and at least one change" }));
    return;
  }
  const ok = await adminAction(() => api("PATCH", `/v1/admin/analysts/${encodeURIComponent(name)}`, body), `Saved the budget of ${name}.`, box);
  if (ok) for (const id of ["edit-epsilon", "edit-delta", "edit-period"]) $(id).value = "";
});

async function renderGlobalBudget(fromList) {
  const box = $("global-budget");
  let status = fromList || null;
  let editable = false;
  try {
    const data = await api("GET", "/v1/admin/budget");
    status = data.budget || data.global || ("epsilon" in data ? data : status);
    editable = true;
  } catch (e) {
    if (!(e instanceof ApiError) || (e.code !== "not_found" && e.code !== "method_not_allowed")) throw e;
  }
  const parts = [];
  if (status) {
    parts.push(
      el("dl", { class: "figures", id: "global-figures" }, [
        ["ε budget", status.epsilon],
        ["ε spent", status.epsilon_spent],
        ["δ budget", status.delta],
        ["period", status.period ? periodText(status) : "—"],
      ].map(([k, v]) => [el("dt", { text: k }), el("dd", { text: fmt(v) })])),
    );
  } else {
    parts.push(el("p", { text: "No global budget is configured." }));
  }
  if (editable) {
    const form = el(
      "form",
      { class: "params", id: "global-form", novalidate: true },
      el("div", { class: "field" }, el("label", { for: "global-epsilon", text: "ε budget" }), el("input", { id: "global-epsilon", type: "number", step: "any", min: "0", placeholder: "unchanged" })),
      el("div", { class: "field" }, el("label", { for: "global-delta", text: "δ budget" }), el("input", { id: "global-delta", type: "number", step: "any", min: "0", placeholder: "unchanged" })),
      el(
        "div",
        { class: "field" },
        el("label", { for: "global-period", text: "Period" }),
        el("select", { id: "global-period" }, ["", "none", "day", "week", "month"].map((v) => el("option", { value: v, text: v || "unchanged" }))),
      ),
      el("div", { class: "actions" }, el("button", { type: "submit", text: "Save global budget" })),
    );
    const err = el("div", { class: "error", role: "alert", hidden: true });
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = {};
      if ($("global-epsilon").value.trim()) body.epsilon = Number($("global-epsilon").value);
      if ($("global-delta").value.trim()) body.delta = Number($("global-delta").value);
      if ($("global-period").value) body.period = $("global-period").value;
      await adminAction(() => api("PATCH", "/v1/admin/budget", body), "Saved the global budget.", err);
    });
    parts.push(form, err);
  } else {
    parts.push(el("p", { class: "hint", text: "Set in the config file (privacy.global_budget); this gateway offers no endpoint to change it." }));
  }
  box.replaceChildren(...parts);
}

// ---------------------------------------------------------------- admin: spend over time

async function enterSpend() {
  await loadAnalysts();
  if ($("spend-name").value) await showSpend();
}

async function showSpend() {
  const name = $("spend-name").value;
  show($("spend-error"), false);
  try {
    const data = await api("GET", `/ui/api/charts/spend/${encodeURIComponent(name)}`);
    const last = data.points.length ? data.points[data.points.length - 1].epsilon_spent : 0;
    await renderChart(
      $("spend-chart"),
      $("spend-figure"),
      $("spend-caption"),
      data.spec,
      `ε spent by ${name} over time: ${data.points.length} charges, ${fmt(last)} spent in all.`,
    );
  } catch (e) {
    showError($("spend-error"), e);
  }
}

$("spend-form").addEventListener("submit", (event) => {
  event.preventDefault();
  showSpend();
});

// ---------------------------------------------------------------- admin: audit log

function isoFromLocal(value) {
  if (!value) return null;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

function matchesOutcome(entry, outcome) {
  if (!outcome) return true;
  if (outcome === "refused") return entry.status >= 400;
  return entry.outcome === outcome;
}

async function enterAudit() {
  await loadAnalysts();
  await showAudit();
}

async function showAudit() {
  show($("audit-error"), false);
  const params = new URLSearchParams({ limit: "1000" });
  if ($("audit-analyst").value) params.set("analyst", $("audit-analyst").value);
  const since = isoFromLocal($("audit-since").value);
  const until = isoFromLocal($("audit-until").value);
  if (since) params.set("since", since);
  if (until) params.set("until", until);
  try {
    const data = await api("GET", `/v1/admin/audit-log?${params}`);
    const outcome = $("audit-outcome").value;
    const entries = data.entries.filter((e) => matchesOutcome(e, outcome));
    const rows = entries.map((e) => [
      when(e.created_at),
      e.analyst || "—",
      e.endpoint,
      e.outcome,
      e.error_code ? el("span", { class: "refused", text: e.error_code }) : "—",
      e.status,
      e.sql ? el("code", { class: "sql", text: e.sql }) : "—",
    ]);
    $("audit-table").replaceChildren(
      table(`${entries.length} logged requests, newest first`, ["time", "analyst", "request", "outcome", "refusal", "status", "SQL"], rows),
    );
  } catch (e) {
    showError($("audit-error"), e);
  }
}

$("audit-form").addEventListener("submit", (event) => {
  event.preventDefault();
  showAudit();
});

// ---------------------------------------------------------------- start

route();
