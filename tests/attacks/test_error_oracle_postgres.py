"""The error oracle on PostgreSQL: the protected table lives on PostgreSQL, whose
arithmetic, casts and string functions raise where SQLite's return NULL or a float.

For each of the 256 targets the attacker sends one COUNT whose expression fails at run
time exactly when the target's row has secret = 1, and guesses bit 1 when the response is
not a 200 (the charge rule is scored on the same runs). Variants: division by zero, a
failing cast of a literal, a failing cast of a protected value (whose text PostgreSQL
would quote in its error: no response may carry it), int4 overflow, bigint overflow in
ABS, a negative SUBSTRING length, a LIKE pattern ending with the escape character, a
product that overflows a double only for a value beyond its declared bound (the targets'
score is 1e300, declared [0, 100]), and an impossible date.

Measured recovery of the 256 bits (ε = 0.01 a query):
- before issue 11 (commit 2efccd4): 100% by status and by charge for every variant;
- after (commit 5b62263): division by zero, int4 overflow and the out-of-bounds product
  are accepted and always answered (NULLIF-guarded divisor, BIGINT/NUMERIC operands,
  columns clamped to their bounds): 46.9% (the share of zeros); every other variant is
  refused before execution, for free.
"""

from __future__ import annotations

import pytest

from tests.attacks.kit import Deployment, assert_attack_fails, attack_once, target_tags

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SECRET = "tag = '{tag}' AND secret = 1"

CONDITIONS = {
    "division_by_zero": f"1 / (CASE WHEN {SECRET} THEN 0 ELSE 1 END) = 1",
    "failing_cast_of_a_literal": (f"CAST(CASE WHEN {SECRET} THEN 'x' ELSE '1' END AS INTEGER) = 1"),
    "failing_cast_of_a_protected_value": (
        f"CAST(CASE WHEN {SECRET} THEN note ELSE '1' END AS INTEGER) = 1"
    ),
    "int4_overflow": f"(CASE WHEN {SECRET} THEN 2147483647 ELSE 0 END) + 1 > 0",
    "bigint_overflow_in_abs": (
        f"ABS(CASE WHEN {SECRET} THEN -9223372036854775807 - 1 ELSE 0 END) = 0"
    ),
    "negative_substring_length": (
        f"SUBSTRING(note, 1, CASE WHEN {SECRET} THEN -1 ELSE 1 END) = 'p'"
    ),
    "like_pattern_ending_with_escape": (f"note LIKE (CASE WHEN {SECRET} THEN 'p\\' ELSE 'p%' END)"),
    # The targets' scores lie outside their declared bounds (kit.OUT_OF_BOUNDS = 1e300):
    # analysed within the bounds, the product is small; computed on the row, it overflows.
    "out_of_bounds_value_times_a_large_factor": (
        f"CASE WHEN {SECRET} THEN score * 1000000000 ELSE 0 END > 0"
    ),
    "impossible_date": (
        f"CAST(CASE WHEN {SECRET} THEN '2020-13-45' ELSE '2020-01-01' END AS DATE) IS NOT NULL"
    ),
}


def queries(variant: str) -> list[str]:
    return [
        "SELECT COUNT(*) FROM people WHERE " + CONDITIONS[variant].replace("{tag}", tag)
        for tag in target_tags()
    ]


@pytest.mark.parametrize("variant", list(CONDITIONS))
def test_a_runtime_error_in_the_secret_row_reveals_nothing(
    postgres_gateway: Deployment, variant: str
) -> None:
    run = attack_once(postgres_gateway, f"postgres-{variant}", queries(variant))
    assert_attack_fails(run)
