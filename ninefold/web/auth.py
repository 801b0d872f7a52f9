"""Token or HTTP basic authentication for the Panel server (a Bokeh ``AuthProvider``).

A request is let in when it carries the secret in one of three ways:
  * ``Authorization: Bearer <token>`` (token mode) or ``Authorization: Basic <user:pass>`` (basic mode);
  * ``?token=<token>`` on a page URL (token mode) — the server answers with a signed cookie, so the page's
    websocket and static requests that follow need nothing else;
  * that signed cookie.
Anything else is redirected by Tornado to ``/nf-login``, which answers 401 (with a ``WWW-Authenticate`` challenge
in basic mode, so a browser asks for the password) or, given valid credentials, sets the cookie and sends the
browser back where it was going.
"""
from __future__ import annotations

import base64
import hmac
from urllib.parse import urlparse

from bokeh.server.auth_provider import AuthProvider
from tornado.web import RequestHandler

COOKIE = "ninefold_user"
LOGIN_URL = "/nf-login"


def _eq(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a.encode(), b.encode())


class Credentials:
    def __init__(self, token: str | None = None, basic_auth: str | None = None):
        self.token = token
        self.user, _, self.password = (basic_auth or "").partition(":")
        self.basic = basic_auth is not None

    def check_header(self, header: str | None) -> str | None:
        """The user an Authorization header authenticates, or None."""
        if not header:
            return None
        kind, _, value = header.partition(" ")
        kind = kind.lower()
        if self.token is not None and kind == "bearer" and _eq(value.strip(), self.token):
            return "token"
        if self.basic and kind == "basic":
            try:
                user, _, pw = base64.b64decode(value.strip()).decode("utf-8").partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            if _eq(user, self.user) and _eq(pw, self.password):
                return user
        return None

    def check_query_token(self, handler: RequestHandler) -> str | None:
        if self.token is None:
            return None
        return "token" if _eq(handler.get_query_argument("token", None), self.token) else None


def _safe_next(url: str | None) -> str:
    """Only same-site relative paths are followed after login."""
    if not url or not isinstance(url, str):
        return "/"
    # browsers read a backslash as a slash ("/\\evil.com" is "//evil.com"), and drop tabs and newlines
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url) or "\\" in url:
        return "/"
    p = urlparse(url)
    if p.scheme or p.netloc or not url.startswith("/") or url.startswith("//"):
        return "/"
    return url


def make_provider(creds: Credentials) -> AuthProvider:
    def get_user(handler: RequestHandler):
        user = creds.check_header(handler.request.headers.get("Authorization"))
        if user is None:
            user = creds.check_query_token(handler)
            if user is not None:
                try:
                    handler.set_secure_cookie(COOKIE, user, httponly=True, samesite="Strict")
                except Exception:  # a websocket upgrade cannot set cookies; the page already did
                    pass
        if user is None:
            raw = handler.get_secure_cookie(COOKIE)
            user = raw.decode() if raw else None
        return user

    def refuse(handler):
        handler.set_status(401)
        if creds.basic:
            handler.set_header("WWW-Authenticate", 'Basic realm="ninefold", charset="UTF-8"')
            handler.finish("401: ninefold needs a user name and password\n")
        else:
            handler.finish("401: ninefold needs the server's token: open the page as /?token=T or send "
                           "'Authorization: Bearer T'\n")

    class LoginHandler(RequestHandler):
        def get(self):
            user = creds.check_header(self.request.headers.get("Authorization")) or creds.check_query_token(self)
            if user is not None:
                self.set_secure_cookie(COOKIE, user, httponly=True, samesite="Strict")
                self.redirect(_safe_next(self.get_query_argument("next", None)))
                return
            refuse(self)

    class Provider(AuthProvider):
        deny = staticmethod(refuse)

        @property
        def get_user(self):
            return get_user

        @property
        def login_url(self):
            return LOGIN_URL

        @property
        def login_handler(self):
            return LoginHandler

    return Provider()


def guard_every_route(app, provider: AuthProvider) -> int:
    """Make every route of the Tornado APP ask for the user, static files and the websocket included: Bokeh
    checks only its page and websocket routes, and serves its and Panel's static files to anyone. The login
    route stays open. Returns how many routes were wrapped."""
    get_user, login, deny = provider.get_user, provider.login_handler, provider.deny
    n = 0
    for rule in app.wildcard_router.rules:
        target = rule.target
        if not (isinstance(target, type) and issubclass(target, RequestHandler)) or target is login:
            continue
        rule.target = _guarded(target, get_user, deny)
        n += 1
    return n


def _guarded(cls, get_user, deny):
    class Guarded(cls):
        def prepare(self):
            if get_user(self) is None:
                deny(self)
                return None
            return super().prepare()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{cls.__name__}"
    return Guarded
