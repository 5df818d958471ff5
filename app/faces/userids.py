"""What a userid may be: DeepStack's clients send any string, and get it back in every recognition.

- **Exact, case-sensitive, not normalized.** DeepStack keeps the userid as sent and compares it exactly (SQLite's
  BINARY collation); clients compare the name a recognition returns with the one they registered (Double Take's
  and Home Assistant's configurations, automations). Folding case would merge "Ann" and "ann" into one person,
  and a replacing registration of one would silently delete the other's faces; case folding is not even one rule
  across languages (Turkish dotted I, German ß). Unicode normalization would hand back a string other than the
  one registered. So "Ann" and "ann" are two people, as in DeepStack.
- **One line of visible text, at most USERID_MAX_CHARS characters.** Control characters (C0, DEL, C1), line and
  paragraph separators and lone surrogates are refused: they break logs, JSON and terminals, and no client
  needs them. Leading or trailing whitespace is refused rather than stripped: stripping would return a name
  other than the one sent, keeping it would make "Ann " a second, invisible "Ann".
- **Not "unknown" in any case:** that is what a recognition answers for a face that matches nobody.
"""

from __future__ import annotations

import unicodedata

from app.faces.errors import InvalidUserId

# Names, e-mail addresses and UUIDs (36) fit with room to spare; a bound keeps list answers and logs small.
USERID_MAX_CHARS = 128
UNKNOWN = "unknown"  # DeepStack's userid for a face that matches nobody

_REFUSED_CATEGORIES = {"Cc": "a control character", "Cs": "a lone surrogate", "Zl": "a line separator",
                       "Zp": "a paragraph separator"}


def check_userid(userid: object) -> str:
    """The userid, unchanged, if the gallery takes it; InvalidUserId saying why not."""
    if not isinstance(userid, str):
        raise InvalidUserId(f"a userid is text; got {type(userid).__name__}")
    if not userid:
        raise InvalidUserId("the userid is empty")
    if len(userid) > USERID_MAX_CHARS:
        raise InvalidUserId(f"the userid is {len(userid)} characters long; at most {USERID_MAX_CHARS} are kept")
    if userid != userid.strip():
        raise InvalidUserId(f"the userid {userid!r} begins or ends with whitespace: send it without")
    for position, character in enumerate(userid):
        refused = _REFUSED_CATEGORIES.get(unicodedata.category(character))
        if refused:
            raise InvalidUserId(f"the userid holds {refused} (U+{ord(character):04X}) at position {position}: "
                                "a userid is one line of visible text")
    if userid.casefold() == UNKNOWN:
        raise InvalidUserId(f"{userid!r} is what a recognition answers for a face that matches nobody: "
                            "choose another userid")
    return userid
