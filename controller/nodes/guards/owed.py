"""The pages the guard owes a person for what it holds (the breaker tripped, a fleet incident, a
suspect domain). Each waits ``breaker_page_delay_s`` to gather the rest of its burst into one page;
meanwhile it is part of the guard's stored state, written with the decision that made it owed, so
a controller killed while gathering leaves it to the next one instead of pausing automation with
no one told. Pure: the guard sends them."""

from __future__ import annotations

import json
from dataclasses import dataclass

from controller.vocab.policy import Severity


@dataclass(frozen=True, slots=True)
class OwedPage:
    id: str  # the page's incident id (whether it went is looked up by it)
    about: str  # "breaker", "fleet:<rule>" or "domain:<domain>"
    severity: Severity
    due_at: float  # wall-clock time it is sent at the earliest

    @property
    def kind(self) -> str:
        return self.about.partition(":")[0]

    @property
    def subject(self) -> str:
        """The fleet incident's rule or the domain ('' for the breaker)."""
        return self.about.partition(":")[2]


def owe(owed: tuple[OwedPage, ...], page: OwedPage) -> tuple[OwedPage, ...]:
    return owed if any(o.id == page.id for o in owed) else (*owed, page)


def paid(owed: tuple[OwedPage, ...], page_id: str) -> tuple[OwedPage, ...]:
    return tuple(o for o in owed if o.id != page_id)


def dump_owed(owed: tuple[OwedPage, ...]) -> str:
    return json.dumps([[o.id, o.about, o.severity.value, o.due_at] for o in owed])


def load_owed(text: str | None) -> tuple[OwedPage, ...]:
    if not text:
        return ()
    return tuple(OwedPage(i, about, Severity(severity), due) for i, about, severity, due in json.loads(text))
