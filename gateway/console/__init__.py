"""The web console's server side: chart specs and the spend series, and its static files.

The console (``/ui/``, served by ``gateway/http/console.py``) is a static page that talks
to the public HTTP API with the analyst's or the admin's key. What it draws comes from
here, built in Python so that it can be tested without a browser:

- ``charts.release_chart`` — a released answer → a Vega-Lite spec (bars with 95% error
  bars for a GROUP BY, a line with a 95% band when the key is ordered);
- ``spend.spend_series`` and ``charts.spend_chart`` — one analyst's ledger history → ε
  spent over time, as the accountant reports it.

Both take only what the API already releases (a released answer, the ledger's charges),
so the console can show nothing the API would not. ``static/`` holds the page, its
script and stylesheet, and the vendored Vega, Vega-Lite and vega-embed bundles
(``static/vendor/NOTICE.md``). Flask is not imported here.
"""
