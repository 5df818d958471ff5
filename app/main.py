"""What other servers load: `app` and `create_app()` (`uvicorn --http app.launch:Protocol app.main:app`, `uvicorn
--factory app.main:create_app`, gunicorn). The Service (app/service.py) built from the environment's settings, and its
HTTP door's app (app/api/app.py), whose lifespan starts the service: every door but HTTP, which that server runs. The
app a server gets starts only where the server runs our HTTP protocol, and otherwise refuses and says how
(app/launch.py).

`create_app(settings)` does the same for given settings (tests, benchmarks).
"""

from __future__ import annotations

from typing import Any

from app import launch
from app.service import Service
from app.settings import Settings


def create_app(settings: Settings | None = None):
    """The HTTP app of a Service built from `settings`. Without `settings`, a server's factory call (settings from
    EDGETPU_SERVE_*): built only where the server holds the HTTP limits (app/launch.py)."""
    if settings is None:
        return launch.app_for_server("app.main:create_app", create_app)
    return Service(settings).http_app()


def __getattr__(name: str) -> Any:
    """`app.main:app`, the name `uvicorn app.main:app` and gunicorn look up: the app built from the environment's
    settings at that lookup, once (app/launch.py app_for_server).

    A module attribute looked up by name, not a module-level `app = create_app()`, because building it reads
    the settings, checks every model directory and can refuse to start: done at import, that would happen
    wherever `app.main` is imported (tests, benchmarks, `python -m app` importing create_app), and a
    refusal would surface as an import error instead of the servers' own "app failed to load" exit
    (launch.CANNOT_START). docs/launch.md says the same for users."""
    if name == "app":
        return launch.app_for_server("app.main:app", create_app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
