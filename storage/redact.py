"""Passwords out of URLs before they are logged, printed or served.

Store URLs (`postgresql+psycopg://user:password@host/db`) and replica API URLs
(`http://user:password@host:8000`) may carry credentials, and so may an error message that
quotes one. The password becomes `***`, as SQLAlchemy's `URL.render_as_string(hide_password=True)`
writes it; the user name stays (it says which account, and is no secret).
"""

from __future__ import annotations

import re

# scheme://user:password@ as SQLAlchemy's make_url splits it: the user up to the first ':', the
# password up to the first '@'. Either may hold a space (SQLAlchemy writes one as is), so a line
# of free text such as "http://host:80 ... me@host" is masked too: more than needed, never less.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/\n\r\t]*):[^@/\n\r\t]*@")


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by `***`."""
    return _USERINFO.sub(r"\g<head>:***@", text)


def has_userinfo(url: str) -> bool:
    """Whether `url` carries a user name or password (`scheme://...@host`)."""
    authority = url.partition("://")[2].split("/", 1)[0]
    return "@" in authority
