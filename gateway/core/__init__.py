"""The core every other room builds on: the admin's config and the query model.

    config.py         the frozen ``Config`` and its parts (tables, columns, privacy, execution …)
    config_load.py    YAML → ``Config``: ``load_config`` / ``parse_config`` and their precise
                      errors (``dpgate config check``)
    config_tables.py  the ``tables:`` section: columns, privacy units, references, joins
    config_problems.py  every problem of a config collected, with its field's path
    config_lines.py   where each config problem is (its YAML line), which follow from a typo
    config_access.py  the config's ``access:`` and ``sso:`` sections and ``tables.<t>.grants``
    errors.py         the ``GatewayError`` tree: one class per error code and HTTP status
    plan.py           ``QueryPlan``, ``QueryRequest`` and the frozen pieces they are made of
    domain.py         the domain model the compiler and the auditor share
    joins.py          the relation a join reads, one model for analyzer, compiler and auditor

Imports nothing else of the gateway (tests/test_layers.py): every other room may import it.
"""
