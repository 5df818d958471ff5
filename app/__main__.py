"""python -m app: serve with the settings from the environment (EDGETPU_SERVE_*)."""

from __future__ import annotations

import logging
import signal
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
    # SIGTERM: stop accepting, let admitted requests finish within DRAIN_TIMEOUT_S, then the
    # lifespan closes the interpreters (app/main.py). uvicorn re-raises the signal once it is
    # done, to this handler: it asks the (finished) server to exit and the process exits 0.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            access_log=False, timeout_graceful_shutdown=settings.drain_timeout_s)
    server = _Server(config)
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))
    server.run()
    return 0


class _Server(uvicorn.Server):
    """A second SIGTERM ends the drain at once (uvicorn does so only for a second SIGINT)."""

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit and sig == signal.SIGTERM:
            self.force_exit = True
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    sys.exit(main())
