"""The face gallery as one process of the service holds it: opened when the service starts (in each worker, after
any fork: a Gallery refuses to be used across one), closed when it stops, and used only from the face threads, so
that SQLite's fsyncs and busy waits and numpy's searches never block the event loop.

Only where the face models are set: a service that serves no faces makes no gallery file. When the embedder's
vectors are missing for faces the gallery holds (the embedder changed: its file's sha256 has no vectors, another's
have), the first worker of the group (or the only process) makes them from the stored regions once the models have
loaded (app/faces/reembed.py: resumable, 32 faces a transaction), and logs what it did; until then the list says who
is not covered, and a recognition sees the people done so far. Vectors of two models are never mixed: each search
names the embedder whose vectors it reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np

from app.faces.gallery import Gallery
from app.faces.reembed import Reembedding, reembed
from app.faces.regions import FaceRegion
from app.threads import lower_this_thread

log = logging.getLogger(__name__)

T = TypeVar("T")
FACE_THREADS = 2  # a registration's fsync or a busy wait on one, a search or a photo's decode on the other
SETTLE_S = 600.0  # how long re-embedding waits for the models to load (then it gives up, saying so)


class FaceGallery:
    """This process's Gallery and the threads that use it."""

    def __init__(self, path: Path, nice: int = 0):
        self.path = path
        self._gallery: Gallery | None = None
        self._executor = ThreadPoolExecutor(FACE_THREADS, thread_name_prefix="faces", initializer=lower_this_thread,
                                            initargs=(nice,))
        self._reembedding: asyncio.Task | None = None
        self._closing = False

    async def work(self, function: Callable[..., T], *args) -> T:
        """`function(*args)` on a face thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(function, *args))

    async def on_gallery(self, method: str, *args, **named):
        """`Gallery.<method>(*args, **named)` on a face thread."""
        return await self.work(lambda: getattr(self.gallery, method)(*args, **named))

    @property
    def gallery(self) -> Gallery:
        if self._gallery is None:
            raise RuntimeError("the face gallery is opened when the service starts")
        return self._gallery

    async def open(self) -> None:
        """Open (make, if missing) the gallery in this process; a file that is not a gallery stops the start."""
        if self._gallery is None:
            self._gallery = await self.work(Gallery, self.path)
            log.info("face gallery: %s", self.path)

    def reembed_later(self, embedder: Callable[[], Awaitable[tuple[str, Callable[[FaceRegion], Awaitable]]]]) -> None:
        """Once the models have loaded, give every stored face a vector of the embedder served (in the background).
        `embedder()`: its sha256 and an async function that embeds one stored region."""
        self._reembedding = asyncio.create_task(self._reembed(embedder))

    async def _reembed(self, embedder) -> Reembedding | None:
        try:
            sha256, embed = await embedder()
            coverage = await self.on_gallery("coverage", sha256)
            if coverage.complete:
                return None
            log.info("face gallery: the embedder %s... has no vector of %d of %d faces (%d people); re-embedding "
                     "them from their stored regions", sha256[:12], coverage.faces - coverage.embedded_faces,
                     coverage.faces, len(coverage.missing))
            loop = asyncio.get_running_loop()

            def embed_here(region: FaceRegion) -> np.ndarray:  # on a face thread: the embedding through the loop
                if self._closing:  # the service stops: the batches stored stay, the next start goes on
                    raise RuntimeError("the service is stopping")
                return asyncio.run_coroutine_threadsafe(embed(region), loop).result()

            done = await self.work(reembed, self.gallery, sha256, embed_here)
            log.info("face gallery: re-embedded %d faces for %s...; still missing: %s", done.stored, sha256[:12],
                     ", ".join(done.missing) or "nobody")
            return done
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the service serves on; the list says who is not covered
            log.warning("face gallery: re-embedding stopped: %s (it goes on at the next start)", e)
            return None

    async def close(self) -> None:
        """Stop re-embedding (what it stored stays), let the face threads finish their work, close the gallery."""
        self._closing = True
        if self._reembedding is not None:
            self._reembedding.cancel()
            await asyncio.gather(self._reembedding, return_exceptions=True)
        await asyncio.to_thread(self._executor.shutdown, True)
        if self._gallery is not None:
            gallery, self._gallery = self._gallery, None
            await asyncio.to_thread(gallery.close)
