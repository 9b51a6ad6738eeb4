"""dpgate's PostgreSQL front end: psql, JDBC and BI tools connect as to a database.

    codec.py     protocol v3 framing: frontend messages decoded (bounded), backend encoded
    scram.py     SCRAM-SHA-256 against the key's verifier (budget.keys)
    password.py  password login (postgres_wire.login: password): an API key or SSO token
    rewrite.py   where a statement goes (session / catalogue / pipeline); catalogue SQL
                 rewritten onto the emulated catalogue
    catalog.py   pg_catalog and information_schema emulated from the config only
    catalog_tables.py  their tables, types and settings, as PostgreSQL names them
    values.py    parameters as SQL literals; results as text or binary
    session.py   one connection: login, simple and extended protocol
    commands.py  SET, SHOW, RESET, transactions, DISCARD, DEALLOCATE
    observe.py   rate limits, logs, metrics and audit log, as the HTTP layer does them
    errors.py    dpgate error codes → SQLSTATE
    server.py    the listener: threads, TLS, cancel requests
    admission.py connection slots: pending (per address, in total) and sessions
    link.py      a connection's socket under deadlines (login, idle session, writes)
    probe.py     whether the front end accepts connections (for /readyz)

Queries go through ``Gateway.query``, exactly as ``POST /v1/query``; see docs/connect.md.
"""
