"""The pipeline of one query: its stages in order, and the ``Gateway`` that composes them.

    gateway.py          ``Gateway``: ``Gateway.answer`` / ``Gateway.query`` read as the list
                        of stages below
    request.py          1 request validation (``check_request``)
    planning.py         2 plan (``Planner``): SQL → ``PlannedQuery``, with accuracy_target.py
    identity.py, sso.py 3 who is asking (``identify``)
    access.py           3b what the caller may read (grants, groups)
    answer_cache.py     4 answer cache (``AnswerCache``)
    audit_policy.py     5 audit policy (``AuditPolicy``): pre-audit, post-audit
    charges.py          6 charges (``Charges``): reserve, answered, withheld, refund, quote
    noising.py          8 noise (``add_noise``), with quantiles.py
    postprocess.py      9 post-processing (``finish``)
    release.py          10 the response (``Release``)
    post_query.py       11 a nested aggregation's outer query, on the inner release
    dry_run.py          the dry run: cost and fit before spending
    timing.py           the release moment every answer waits for; cost_model.py its
                        deadline, calibration.py the per-row costs it is built from
    lanes.py            one audit scope's concurrent queries, in order of admission
    catalog.py          the public schema (``GET /v1/schema``), from the config only
    observation.py      ``RequestRecord``: one per request, read by the log line, the metrics
                        and the audit-log row

(7, execution, is ``gateway.sql.compile`` and ``gateway.sql.execute``.) A stage imports the
rooms below it (core, ops, sql, audit), never the ``Gateway`` nor a front end
(tests/test_layers.py).
"""
