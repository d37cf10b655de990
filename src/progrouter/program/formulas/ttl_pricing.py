"""The adaptive acting TTL's rule (beyond the spec; ``acting_ttl_policy: "adaptive"``), as pure functions.

The weighed TTL (ttl_weighing.py) holds an idle Program while the recompute its return would save, C·P(it
comes back in the hold), is worth more than ``weight`` × the idle seconds of the hold, and counts one
waiting Program as a weight of one: one waiter-second per held second. That is the right price only when
the held context is the whole Rank. A held context of h tokens on a Rank of K tokens idles the share h / K
of the Rank; the waiters it keeps out lose that share of the Rank's service while it is held, so the adaptive
rule prices a held second at

    price = waiters × h / K

and holds for the d maximising U_t(d) of ttl_weighing.py with ``weight = price``. Nobody waiting: price 0,
hold to the longest hold (nothing else wants the KV). Many waiters behind a large share of
a small Rank: a high price, only the holds whose return is likely soon. A waiter whose force-resume deadline
is due ends every hold on its Rank at once (the force resume would take the KV anyway).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from progrouter.program.formulas.ttl_weighing import weighed_hold_seconds

if TYPE_CHECKING:
    from progrouter.program.core.factors import LogNormalFit


def hold_price(waiters: float, held_tokens: int, capacity_tokens: int | None) -> float:
    """Waiter-seconds one held second costs: the ``waiters`` still queued times the share of the Rank the
    held context takes (the whole Rank when its capacity is not known: the weighed TTL's weight); 0 when
    nobody waits. A queued waiter counts whatever keeps it out — KV, the waiting gate, the growth reserve,
    the count guard: only admission knows, and a waiter that fits is admitted at once and waits no more."""
    if waiters <= 0.0:
        return 0.0
    if capacity_tokens is None or capacity_tokens <= 0:
        return waiters
    return waiters * min(1.0, max(0, held_tokens) / capacity_tokens)


def adaptive_hold_seconds(
    fit: LogNormalFit | None,
    impact_seconds: float,
    price: float,
    elapsed_seconds: float,
    max_hold_seconds: float,
    *,
    deadline_due: bool,
) -> float:
    """The rule: how much longer an idle Program that has not come back for ``elapsed_seconds`` keeps its KV,
    given the recompute its return saves (``impact_seconds``) and ``hold_price``; 0 pauses it now, and
    always when a waiter's force-resume deadline is due or the Rank's gap distribution is not known yet."""
    if deadline_due:
        return 0.0
    return weighed_hold_seconds(
        fit, impact_seconds, price, elapsed_seconds, max_hold_seconds, window_complete=fit is not None
    )
