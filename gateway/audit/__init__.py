"""The differencing auditor (never sees the protected database).

    predicates  WHERE / GROUP BY cell → formula over dimensions (query text, schema)
    normalise   one condition onto the dimension of the column it reads (rewrites)
    evaluate    a condition of one column on one value, as every backend computes it
    space       the logical cell space: declared domains split at the constants used
    span        determined regions: the span of answered regions, exactly decided
    knowledge   one scope's answered regions over one table
    confidence  lower confidence bounds on sizes, from the public noise scales
    describe    a region as a WHERE clause over declared columns (refusals name it)
    resident    which scopes' knowledge stays in memory (a byte budget; the rest on disk)
    auditor     Auditor.pre_audit / predict / post_audit / remember (and the
                *_cells variants, which leave rows out rather than refuse)
    findings    what answered regions determine, sized: the groups too small

Everything here is a function of query texts, the public schema and noisy answers
(docs/design.md, invariant 8: the auditor never touches the data);
``tests/test_audit_isolation.py`` pins the imports.
"""

from gateway.audit.auditor import (
    AnsweredCell,
    AnsweredQuery,
    AuditDecision,
    Auditor,
    AuditPrediction,
    left_out_reason,
    releases_counts,
)
from gateway.audit.confidence import CountNoise

__all__ = [
    "AnsweredCell",
    "AnsweredQuery",
    "AuditDecision",
    "AuditPrediction",
    "Auditor",
    "CountNoise",
    "left_out_reason",
    "releases_counts",
]
