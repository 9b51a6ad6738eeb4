"""The SQL layer: the analyst's SQL read into a plan, the plan written as the engine's SQL.

    analyze/           SQL text → ``QueryPlan`` (sqlglot), one small pass per module
    compile.py         ``QueryPlan`` → one aggregate statement in the target dialect, with
                       clamping and per-unit bounding inside the SQL
    compile_values.py  the per-row values the measures aggregate
    compile_joins.py   the SQL of a join's relation
    join_keys.py       what the catalogue proves of a join's equality, per engine
    portable.py        total, portable row expressions
    constraints.py     CHECK constraints read into the values they admit
    dialects.py        one sqlglot Dialect per name
    execute.py         runs the compiled statement read-only, with a statement timeout
    engines/           ClickHouse and Spark SQL drivers, and every engine's catalogue
    released_table.py  the locked in-memory DuckDB holding one release's noisy rows

Knows nothing of the ledger, the auditor, the pipeline or the front ends: it imports only
``gateway.core`` (tests/test_layers.py). Only the pipeline and the CLI's checks import
``execute``.
"""
