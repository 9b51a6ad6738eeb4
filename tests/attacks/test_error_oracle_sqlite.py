"""The error oracle on SQLite: a runtime error that only the secret row triggers.

For each of the 256 targets the attacker sends one COUNT whose expression fails at run
time exactly when the target's row has secret = 1 (a CASE selects the failing branch for
that row only), and guesses bit 1 when the response is not a 200; kit.assert_attack_fails
also scores the charge (refund) rule on the same runs (test_charge_oracle).

Variants: ABS of −2^63 written as a literal (the issue's), cast from text, built from
32-bit literals, or multiplied by the secret column itself; a LIKE pattern over SQLite's
50,000-byte limit, as one literal or concatenated from the longest literal the analyzer
accepts; and SUM of a huge constant. (A pattern concatenated from 2,400 copies of a
protected column, with no literal at all, failed the same way before issue 11; it is left
out because the analyzer now refuses it by its node cap and its LIKE rule, after parsing
2,400 nodes for 0.4 s a query, which would make this module slow.)

Measured recovery of the 256 bits (ε = 0.01 a query):
- before issue 11 (commit 2efccd4): 100% by status and by charge for every variant but
  the SUM, which the analyzer refused already (SUM takes only a declared column);
- after (commit 5b62263): every variant refused before execution, for free
  (unsupported_query naming the construct or the limit: max_literal_magnitude,
  max_result_magnitude, CAST from text, LIKE pattern must be a literal).
"""

from __future__ import annotations

import pytest

from tests.attacks.kit import (
    MAX_SQL,
    Deployment,
    assert_attack_fails,
    attack_once,
    balanced,
    largest,
    target_tags,
)

pytestmark = pytest.mark.slow

SECRET = "tag = '{tag}' AND secret = 1"
MIN_INT = "-9223372036854775807 - 1"
LIKE_LIMIT = 50_000  # SQLITE_MAX_LIKE_PATTERN_LENGTH: longer patterns fail at run time

CONDITIONS = {
    # The attack: |−2^63| does not fit in 64 bits.
    "abs_min_int_literal": f"ABS(CASE WHEN {SECRET} THEN {MIN_INT} ELSE 0 END) = 0",
    # The same value reached through a cast from text (no large numeric literal).
    "abs_min_int_cast_from_text": (
        f"ABS(CAST(CASE WHEN {SECRET} THEN '-9223372036854775808' ELSE '0' END AS INTEGER)) = 0"
    ),
    # The same value built from 32-bit literals: every product still fits in 64 bits.
    "abs_min_int_small_literals": (
        f"ABS(CASE WHEN {SECRET} THEN -2147483648 * 2147483648 * 2 ELSE 0 END) = 0"
    ),
    # The secret in the arithmetic itself: the predicate names only the (public) tag.
    "abs_min_int_times_secret": (
        "ABS(CASE WHEN tag = '{tag}' THEN secret * -2147483648 * 2147483648 * 2 ELSE 0 END) = 0"
    ),
    # A LIKE pattern over the limit fails at run time, for the one row that builds it.
    "like_pattern_too_long_literal": (
        f"note LIKE CASE WHEN {SECRET} THEN '{'a' * (LIKE_LIMIT + 1)}' ELSE 'x' END"
    ),
    # The same, concatenated from the longest literal the analyzer accepts.
    "like_pattern_too_long_concatenated": (
        f"note LIKE CASE WHEN {SECRET} THEN {{pattern}} ELSE 'x' END"
    ),
}


def longest_literal(deployment: Deployment) -> int:
    """The longest string literal the analyzer accepts (up to 4,096), found with free dry
    runs."""
    key = deployment.analyst("literal-probe")

    def accepted(n: int) -> bool:
        sql = f"SELECT COUNT(*) FROM people WHERE note = '{'a' * n}'"
        return deployment.ask(key, sql, dry_run=True).status == 200

    return largest(accepted, 1, 4096) or 1


def queries(variant: str, deployment: Deployment) -> list[str]:
    if variant == "sum_of_huge_constants":
        return [
            f"SELECT SUM(CASE WHEN tag = '{tag}' AND secret = 1 THEN 9223372036854775807 "
            "ELSE 1 END) FROM people"
            for tag in target_tags()
        ]
    condition = CONDITIONS[variant]
    if "{pattern}" in condition:
        chunk = longest_literal(deployment)
        pieces = -(-(LIKE_LIMIT + 1) // chunk)
        pattern = balanced(["'" + "a" * chunk + "'"] * pieces, "||")
        assert len(pattern) < MAX_SQL, f"literals of {chunk} characters are too short"
        condition = condition.replace("{pattern}", pattern)
    return [
        "SELECT COUNT(*) FROM people WHERE " + condition.replace("{tag}", tag)
        for tag in target_tags()
    ]


@pytest.mark.parametrize("variant", [*CONDITIONS, "sum_of_huge_constants"])
def test_a_runtime_error_in_the_secret_row_reveals_nothing(
    sqlite_gateway: Deployment, variant: str
) -> None:
    run = attack_once(sqlite_gateway, f"sqlite-{variant}", queries(variant, sqlite_gateway))
    assert_attack_fails(run)
