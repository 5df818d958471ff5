"""python -m app: serve with the settings from the environment (EDGETPU_SERVE_*)."""

from __future__ import annotations

import logging
import sys

from app.errors import ServeError
from app.http_server import serve
from app.main import create_app
from app.settings import Settings


def main() -> int:
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(settings)
    except ServeError as e:
        print(f"edgetpu-serve: cannot start: {e}", file=sys.stderr)
        return 2
    serve(app, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
