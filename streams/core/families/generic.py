"""Any other model: no thinking kwarg, no format of its own; the chat template renders the turn."""

from __future__ import annotations

from streams.core.families.base import FamilyProfile

# no markers: never detected, the fallback when no family matches
FAMILY = FamilyProfile(name="generic", thinking_kwarg=None, end_of_turn="")
