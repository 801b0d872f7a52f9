"""``ninefold serve``: the Panel server, its auth and its single background writer."""
from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from ninefold.store.errors import NinefoldError


class ServeConfigError(NinefoldError):
    pass


@dataclass
class ServeConfig:
    db: str
    host: str = "127.0.0.1"
    port: int = 5006
    token: str | None = None
    basic_auth: str | None = None
    max_upload_bytes: int = 2 << 30
    max_uploads_total_bytes: int = 50 << 30


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_config(cfg: ServeConfig) -> None:
    """Refuse what would be unsafe or cannot work, with one line saying why."""
    if cfg.token is not None and cfg.basic_auth is not None:
        raise ServeConfigError("give either --token or --basic-auth, not both")
    if cfg.token is not None and len(cfg.token) < 8:
        raise ServeConfigError("--token must be at least 8 characters")
    if cfg.basic_auth is not None:
        user, sep, pw = cfg.basic_auth.partition(":")
        if not sep or not user or not pw:
            raise ServeConfigError("--basic-auth must be USER:PASS with both parts non-empty")
    if not is_loopback(cfg.host) and cfg.token is None and cfg.basic_auth is None:
        raise ServeConfigError(f"refusing to serve on non-loopback address {cfg.host} without authentication: "
                               "pass --token T or --basic-auth USER:PASS (or bind 127.0.0.1)")
    if cfg.max_upload_bytes <= 0:
        raise ServeConfigError("--max-upload-bytes must be positive")
    if cfg.max_uploads_total_bytes < cfg.max_upload_bytes:
        raise ServeConfigError(f"--max-uploads-total-bytes ({cfg.max_uploads_total_bytes}) must be at least "
                               f"--max-upload-bytes ({cfg.max_upload_bytes})")
    if not (0 < cfg.port < 65536):
        raise ServeConfigError(f"--port {cfg.port} is not a TCP port")


def run_server(cfg: ServeConfig) -> None:
    import panel as pn

    from ninefold.web.app import CHUNK_BYTES, make_app
    from ninefold.web.auth import Credentials, guard_every_route, make_provider
    from ninefold.web.uploads import UploadStore, Writer
    from ninefold.store.connection import connect

    check_config(cfg)
    db = Path(cfg.db)
    db.parent.mkdir(parents=True, exist_ok=True)
    connect(db).close()  # create the store and its tables before any reader opens it read-only
    store = UploadStore(db, cfg.max_upload_bytes, cfg.max_uploads_total_bytes)
    writer = Writer(store).start()
    kwargs = {}
    if cfg.token is not None or cfg.basic_auth is not None:
        kwargs["auth_provider"] = make_provider(Credentials(cfg.token, cfg.basic_auth))
    origins = ([f"localhost:{cfg.port}", f"127.0.0.1:{cfg.port}"] if is_loopback(cfg.host)
               else ["*"])  # non-loopback always has auth (check_config); cookies are SameSite=Strict
    print(f"ninefold serving {db} at http://{cfg.host}:{cfg.port}/ "
          f"(auth: {'token' if cfg.token else 'basic' if cfg.basic_auth else 'none'}; uploads in {store.root})",
          flush=True)
    server = pn.serve({"/": make_app(db, store, writer, cfg.max_upload_bytes)}, port=cfg.port, address=cfg.host,
                      show=False, title="ninefold", websocket_origin=origins, cookie_secret=secrets.token_hex(32),
                      websocket_max_message_size=CHUNK_BYTES * 2 + (1 << 20), threaded=False, start=False,
                      **kwargs)
    if "auth_provider" in kwargs:
        guard_every_route(server._tornado, kwargs["auth_provider"])
    server.start()
    server.io_loop.start()
