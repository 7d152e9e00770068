"""What an engine's settings section is: the base of the section Structs
that live with their engine (``gateway/engines/<engine>/settings.py``).

A section is a ``msgspec.Struct`` subclass of ``Section``: TOML ``[name]``,
environment ``GATEWAY_<NAME>_<FIELD>``, ``Settings.<name>`` in code, where
``name`` is its ``SECTION`` and is the name of the engine it configures
(one word, no underscore: the first word after ``GATEWAY_`` names the
section).  It validates its own fields in ``__post_init__`` (with ``check``),
and what applies only when its engine is the one selected (``engine =
"<name>"``: a pool needs its URLs) in ``check_selected``, which
``Settings`` calls.  ``FLAT_ALIASES`` lists fields that used to be
top-level settings and still work under their old flat name, with a
warning.  ``gateway.settings`` stays generic: it reads every section the
same way (``SECTIONS``); ``gateway/engines/sections.py`` lists the built-in
engines' sections, one field each.

This module does no I/O.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from gateway.errors import SettingsError


def check(checks: list[tuple[bool, str]]) -> None:
    """Raise ``SettingsError`` with the message of the first check that fails."""
    for ok, message in checks:
        if not ok:
            raise SettingsError(message)


class Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The base of an engine's settings section."""

    #: the section's name: its TOML table, its ``Settings`` field, its engine
    SECTION: ClassVar[str] = ""
    #: fields that were top-level settings once (``device``): still read
    #: under that name, with a warning (``gateway.settings.DEPRECATED_ALIASES``)
    FLAT_ALIASES: ClassVar[tuple[str, ...]] = ()

    def check_selected(self) -> None:
        """Checks that apply only when this section's engine is selected
        (after every other setting was checked); nothing by default."""
