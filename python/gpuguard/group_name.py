"""What a group name may be: ranks of different groups may share a GPU, so the name reaches store keys and
identity records, and is checked once, here."""

from __future__ import annotations

import re

#: 1 to 128 letters, digits or '_.:/@+-' (the identity record's bound; '/' is escaped in store keys).
GROUP_NAME = re.compile(r"[A-Za-z0-9_.:/@+-]{1,128}")


def is_group_name(text: object) -> bool:
    return isinstance(text, str) and GROUP_NAME.fullmatch(text) is not None
