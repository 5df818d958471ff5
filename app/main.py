"""create_app(settings): assembles the routers; the lifespan loads the models."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI

from app.api import classify, devices, errors, health, models
from app.imaging import reuse_image_buffers
from app.inference import ImageWork, image_threads
from app.registry import Registry
from app.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    reuse_image_buffers()
    registry = Registry(settings)
    # Model directories are checked now, so a misconfiguration stops the process at
    # once; interpreters load (and warm up) in the background while /healthz answers.
    registry.configure()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = asyncio.create_task(asyncio.to_thread(registry.load_all))
        try:
            yield
        finally:
            # Shutdown: admitted requests finish (bounded), then every interpreter is closed.
            if not await registry.drain(settings.drain_timeout_s):
                log.warning("drain: %d request(s) still in flight after %.1f s; closing anyway",
                            registry.active, settings.drain_timeout_s)
            # a load still under way drops what it loads once draining; wait for it, bounded
            await asyncio.wait({loading}, timeout=settings.drain_timeout_s)
            await asyncio.to_thread(registry.close)
            images.close()

    app = FastAPI(title="edgetpu-serve", version="0.1.0", lifespan=lifespan,
                  description="Image classification on a Coral Edge TPU, the CPU, or a bit-exact int8 emulator.")
    images = ImageWork(image_threads(settings.image_threads, registry.host_cpu), settings.max_image_pixels)
    app.state.settings = settings
    app.state.registry = registry
    app.state.images = images
    errors.install(app)
    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(classify.router)
    app.include_router(devices.router)
    return app
