"""The differencing auditor (never sees the protected database).

    predicates  WHERE / GROUP BY cell → formula over dimensions (query text, schema)
    space       the logical cell space: declared domains split at the constants used
    span        determined regions: the span of answered regions, exactly decided
    knowledge   one scope's answered regions over one table
    auditor     Auditor.pre_audit / post_audit / remember

Everything here is a function of query texts, the public schema and noisy answers
(docs/design.md, invariant 8: the auditor never touches the data);
``tests/test_audit_isolation.py`` pins the imports.
"""

from gateway.audit.auditor import AnsweredCell, AnsweredQuery, AuditDecision, Auditor

__all__ = ["AnsweredCell", "AnsweredQuery", "AuditDecision", "Auditor"]
