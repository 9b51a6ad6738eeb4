"""Operations: what runs beside every request in a serving process, for the operator.

    metrics.py    Prometheus metrics (``GET /metrics``), correct across worker processes
    logs.py       JSON log lines, one per request (``RequestLog``)
    ratelimit.py  per-analyst and per-address rate limits, kept in the ledger
    heap.py       a process's memory settings: glibc malloc's (freed memory kept, arenas)
                  and the startup heap set aside from the garbage collector

Below the pipeline and the auditor: they and the front ends use it; it imports only
``gateway.core`` (and the ledger, for rate limits).
"""
