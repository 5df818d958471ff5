"""Devices come and go while the service runs (TPUs plugged in and unplugged): pools and models follow them.

A plug-in that follows its devices (Backend.follow, from the registry's `load_all()` on: the Edge TPU's probe)
calls its DeviceListener after each look. DeviceMoves then takes each model in turn, under its reload lock:
  - a model served on its fallback moves back when the devices changed and the plug-in can serve it again
    (Backend.recheck);
  - otherwise its pool of that backend follows the devices (DeviceFollower), and a model whose every device of
    the backend left moves to the fallback the plug-in's policy gives (Backend.fall_back), or its waiting
    requests are answered (503 + Retry-After) and it waits, unhealthy, for a device.
Each move is the reload that loses nothing (app/registry/lifetimes.py): a new version swapped in, warmed up first.

DeviceFollower brings one pool up to date with what the plug-in offers now (`interpreters()`, one per device),
through the pool's own membership calls (app/pool/engine_pool.py):
  - a member on a device no longer offered leaves the pool (`leave`: departed);
  - a departed member whose devices are offered again is re-created on them, warmed up, and put back
    (`replace`); a pipeline has its lost segments re-created in place;
  - in a whole model's pool, a device offered without a member gets one, loaded and warmed up first: in
    the place of a member whose device left and is not back (a TPU plugged into another port), else added.
A device that refuses is tried again at the next look, and logged once per reason. Nothing here names a backend.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping

from app.engines import Backend, EngineOptions, Fallback
from app.errors import DeviceGone, DeviceUnavailable, ServeError
from app.model_dir.reading import ModelDir
from app.pool import EnginePool, Member, departed_problem
from app.registry.fallbacks import Fallbacks
from app.registry.lifetimes import Lifetimes
from app.registry.loading import Loader, Reopener
from app.registry.versions import ModelVersion

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
            fresh = member.renew(Reopener(self.loader, plugin))
            pool.warm_up(fresh)
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
            pool.warm_up(fresh)
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


class DeviceMoves:
    """After each look of a plug-in at its devices: each model follows them, or moves to or from its fallback."""

    def __init__(self, models: Lifetimes, fallbacks: Fallbacks, plugins: Mapping[str, Backend],
                 follower: DeviceFollower, retry_after_s: int):
        self.models = models
        self.fallbacks = fallbacks
        self.plugins = plugins
        self.follower = follower
        self.retry_after_s = retry_after_s

    def listener(self, key: str) -> DeviceListener:
        """What backend `key`'s plug-in calls after each look (Backend.follow)."""
        return DeviceListener(weakref.ref(self), key)

    def changed(self, key: str, changed: bool) -> None:
        """After a look of backend `key`'s plug-in at its devices (on its thread): each model in turn, under its
        reload lock, moves back from a fallback (when the devices changed and the plug-in can serve it now), or
        has its pool follow the devices, and moves to its fallback if every device left."""
        plugin, models = self.plugins[key], self.models
        offered = self.follower.offered(plugin)
        for name in list(models.paths):
            with models.reload_locks[name]:
                if models.draining:
                    return
                fallback = self.fallbacks.get(name, key)
                if fallback is not None:
                    if changed and fallback.backend is not None:
                        self._move_back(name, key, fallback)
                    continue
                version = models.versions.get(name)
                pool = version.pools.get(key) if version is not None else None
                if pool is None:
                    continue
                self.follower.follow(pool, plugin, version.model_dir, offered)
                if pool.members.departed:
                    self._move_off(name, key, version, pool)

    def _move_back(self, name: str, key: str, fallback: Fallback) -> None:
        """A model served on its fallback: on `key` again if its plug-in can serve it now."""
        still = self.plugins[key].recheck(self.models.dirs[name])
        if still is not None:  # not yet: the reason readiness gives is the one that holds now
            self.fallbacks.record(name, key, Fallback(fallback.backend, still.reason))
            return
        log.info("model %s: %s can serve it again: loading it there (it stays on %s meanwhile)", name, key,
                 fallback.backend)
        others = {k: f for k, f in self.fallbacks.of(name).items() if k != key}
        try:
            self.models.reload(name, warm_up=True, decided=others)
        except ServeError as e:
            log.warning("model %s: still on %s: %s", name, fallback.backend, e)

    def _move_off(self, name: str, key: str, version: ModelVersion, pool: EnginePool) -> None:
        """Every device of `key` serving the model left: to the fallback its plug-in's policy gives (the
        requests waiting meanwhile go to the version's pool on that backend, if it has one), or the requests
        waiting are answered now (503 + Retry-After) and the model waits, unhealthy, for a device."""
        devices = ", ".join(dict.fromkeys(s.device for m in pool.members for s in m.stages if s.device))
        gone = DeviceGone(f"every {key} device serving it left ({devices}): not listed any more (unplugged?); "
                          "until one is back", self.retry_after_s)
        fallback = self.plugins[key].fall_back(name, gone)
        if fallback is None or fallback.backend is None:
            refused = pool.refuse_waiting(str(gone))
            if refused:
                log.warning("model %s: %d waiting request(s) answered 503: %s", name, refused, gone)
            return
        self.fallbacks.record(name, key, fallback)
        instead = version.pools.get(fallback.backend)
        tensors = pool.members.inputs, pool.members.outputs
        if instead is not None and (instead.members.inputs, instead.members.outputs) == tensors:
            pool.hand_over(instead)
        try:
            self.models.reload(name, warm_up=True)
        except ServeError as e:
            log.error("model %s: moving it to %s failed: %s", name, fallback.backend, e)
        pool.refuse_waiting(str(gone))  # whatever could not be handed over is answered now


class DeviceListener:
    """What a plug-in calls after each look at its devices (Backend.follow): its backend's moves, held weakly (a
    plug-in's thread never keeps the registry's objects alive); False once they are gone or shutting down."""

    def __init__(self, moves: weakref.ref[DeviceMoves], key: str):
        self.moves = moves
        self.key = key

    def __call__(self, devices_changed: bool) -> bool:
        moves = self.moves()
        if moves is None or moves.models.draining:
            return False
        moves.changed(self.key, devices_changed)
        return True
