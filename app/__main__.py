"""python -m app: serve with the settings from the environment (EDGETPU_SERVE_*)."""

from __future__ import annotations

import logging
import sys

import uvicorn

from app.errors import ServeError
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
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
