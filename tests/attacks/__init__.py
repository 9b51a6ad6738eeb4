"""Side-channel attacks on a real `dpgate serve`, as an analyst with an ordinary key would try
them (issue 11; docs/design.md, invariants 2 and 9).

Every attack targets 256 planted people whose secret bit is known to the test only. An
attack passes when it recovers no more than 60% of the bits (chance is 50%), or when every
query it sends is refused before execution (4xx, and free: the budget is unchanged).
"""
