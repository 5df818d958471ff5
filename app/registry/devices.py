"""A pool follows its backend's devices while it serves: devices plugged in, unplugged, or missing at start.

After each look of a plug-in at its devices (Backend.follow: the Edge TPU's probe), the registry brings
each pool of that backend up to date with what the plug-in offers now (`interpreters()`, one per device),
through the pool's own membership calls (app/pool/membership.py):
  - a member on a device no longer offered leaves the pool (`leave`: departed);
  - a departed member whose devices are offered again is re-created on them, warmed up, and put back
    (`replace`); a pipeline has its lost segments re-created in place;
  - in a whole model's pool, a device offered without a member gets one, loaded and warmed up first: in
    the place of a member whose device left and is not back (a TPU plugged into another port), else added.
A device that refuses is tried again at the next look, and logged once per reason. Whether the model
moves to its fallback, or back from it, is the registry's (app/registry/registry.py): it swaps versions.
Nothing here names a backend.
"""

from __future__ import annotations

import logging

from app.engines import Backend, EngineOptions
from app.errors import DeviceUnavailable
from app.model_dir.reading import ModelDir
from app.pool import EnginePool, Member, departed_problem
from app.registry.loading import Loader

log = logging.getLogger(__name__)


class DeviceFollower:
    """Brings pools up to date with their plug-in's devices; remembers the last failure per (pool, device)
    so that a device refusing at every look is logged once, not at every look."""

    def __init__(self, loader: Loader):
        self.loader = loader
        self._failures: dict[tuple[str, str], str] = {}

    def offered(self, plugin: Backend) -> dict[str, EngineOptions]:
        """The plug-in's devices now, by the name its members know them by; none when it has none."""
        try:
            options = plugin.interpreters()
        except DeviceUnavailable:
            return {}
        return {device: o for o in options if (device := plugin.device(o)) is not None}

    def follow(self, pool: EnginePool, plugin: Backend, model_dir: ModelDir, offered: dict[str, EngineOptions]) -> None:
        """One pool, up to date with `offered`: leave, come back, join (blocking: loads and warms up)."""
        for member in list(pool.members):
            lost = [s.device for s in member.stages if s.device is not None and s.device not in offered]
            if member.healthy and lost:
                pool.leave(member, departed_problem(lost), lost[0] if len(lost) == 1 else None)
        for member in list(pool.members):
            if member.departed and not member.healthy and all(s.device in offered for s in member.stages
                                                              if s.device is not None):
                self._come_back(pool, plugin, member)
        if model_dir.manifest.segments is None:  # a pipeline's devices are its segments': no member to add
            used = {m.device for m in pool.members}
            for device, options in offered.items():
                if device not in used:
                    self._join(pool, plugin, model_dir, device, options, offered)

    def _come_back(self, pool: EnginePool, plugin: Backend, member: Member) -> None:
        try:
            fresh = member.renew(lambda stage: self.loader.reload(plugin, stage))
            pool.warm_up_member(fresh)
        except Exception as e:  # still resetting, or gone again: tried again at the next look
            self._failed(pool, member.device or "", f"re-creating it failed: {e}")
            return
        self._failures.pop((pool.label, member.device or ""), None)
        if pool.replace(member, fresh):
            log.info("%s: %s is back: re-created and in the pool again", pool.label, fresh.where)
        elif fresh is not member:
            fresh.close()

    def _join(self, pool: EnginePool, plugin: Backend, model_dir: ModelDir, device: str, options: EngineOptions,
              offered: dict[str, EngineOptions]) -> None:
        try:
            fresh = self.loader.load_member(plugin, model_dir, [(model_dir.file(plugin.model_file), options)])
        except Exception as e:
            self._failed(pool, device, f"loading the model on it failed: {e}")
            return
        try:
            pool.warm_up_member(fresh)
        except Exception as e:
            fresh.close()
            self._failed(pool, device, f"its warm-up failed: {e}")
            return
        self._failures.pop((pool.label, device), None)
        # a member whose device left and is not back: the new device takes its place (a TPU moved to another port)
        instead = next((m for m in pool.members if m.departed and not m.healthy
                        and not any(s.device in offered for s in m.stages)), None)
        if not (pool.replace(instead, fresh) if instead is not None else pool.add(fresh)):
            fresh.close()  # the pool closed meanwhile (replaced by a reload, or shutting down)

    def _failed(self, pool: EnginePool, device: str, why: str) -> None:
        if self._failures.get((pool.label, device)) != why:
            self._failures[(pool.label, device)] = why
            log.warning("%s: %s: %s; tried again at the next look", pool.label, device, why)
