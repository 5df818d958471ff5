"""Frigate's model transfer (model_data): a .tflite a client sends, checked, written as a model directory, loaded.

Only with ZMQ_ACCEPT_MODELS=true, and at most ZMQ_MAX_MODEL_BYTES. One upload at a time; each before its reply:

    name, bytes --checks (app/importing: as `converter import` checks a file; here also: a detector ending in
                  TFLite_Detection_PostProcess with a uint8 [1, H, W, 3] input, what Frigate sends)
      --> MODEL_DIR/<name>/ written whole and atomically (app/model_dir/writing.py): model.json with provenance
          "uploaded by a Frigate ZMQ client", the file as the plain or the compiled file (app/importing handed_over)
      --> loaded and warmed up on the configured backends (Registry.add), then it serves

Class ids suffice (Frigate keeps its own labelmap), so no labels are written. Nothing is ever replaced: a model of
that name already served, or a directory of that name holding another file, is a refusal that says so; the same
file sent again (a directory this door wrote, not served since a restart with MODELS set) is loaded as it is. A file
that no backend here can run (a compiled-only file on a host without an Edge TPU in service) is not kept, and the
reply says why. A refusal writes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from app.errors import ServeError
from app.frontdoors.zmq_door import UploadResult
from app.importing import ImportRefused, graph_facts, handed_over, read_tflite_source
from app.model_dir.reading import read_model_dir
from app.model_dir.schema import EDGETPU, INT8, MANIFEST
from app.model_dir.writing import write_model_dir

log = logging.getLogger(__name__)

PROVENANCE = "uploaded by a Frigate ZMQ client"
ROUTE = "uploaded"


class Refusal(Exception):
    """The upload is not kept; the message says why and what would work."""


class ModelUploads:
    """`add(path)` serves a model directory written here (the registry's add); `root` is MODEL_DIR."""

    def __init__(self, add: Callable[[Path], object], root: Path, max_bytes: int, accepting: bool):
        self.add = add
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.accepting = accepting
        self._one_at_a_time = asyncio.Lock()

    async def receive(self, name: str, data: memoryview) -> UploadResult:
        async with self._one_at_a_time:
            return await asyncio.to_thread(self._receive, name, bytes(data))

    def _receive(self, name: str, data: bytes) -> UploadResult:
        try:
            return self._keep(name, data)
        except Refusal as e:
            return UploadResult(saved=False, loaded=False, model=None, message=str(e))

    def _keep(self, name: str, data: bytes) -> UploadResult:
        model = model_name_for(name)
        if len(data) > self.max_bytes:
            raise Refusal(f"{name} has {len(data)} bytes, more than this service takes "
                          f"(EDGETPU_SERVE_ZMQ_MAX_MODEL_BYTES={self.max_bytes})")
        try:
            source = read_tflite_source(Path(name), data)
            facts = graph_facts(source)
        except ImportRefused as e:
            raise Refusal(str(e)) from None
        if facts.task != "detection":
            raise Refusal(f"{name} is a {facts.task} model ({facts.why}): Frigate needs a detector, ending in "
                          "TFLite_Detection_PostProcess (model_type ssd, such as the SSD files its image ships) or a "
                          "YOLO head (model_type yolo-generic)")
        tensor = facts.input
        if tensor.type != "UINT8" or tensor.shape[3] != 3:
            raise Refusal(f"{name}'s input {tensor.name!r} is {tensor.type.lower()} {list(tensor.shape)}: Frigate "
                          "sends uint8 [1, height, width, 3] tensors (input_dtype int), which this model does not take")
        sha256 = hashlib.sha256(data).hexdigest()
        target = self.root / model
        if target.exists():
            return self._again(name, model, target, sha256)
        manifest, files = handed_over(model, source, facts, PROVENANCE, ROUTE, notes=[
            f"sent by a Frigate ZMQ client as {name!r} (model_data); Frigate keeps its own labelmap, so the classes "
            "are named by their ids here"])
        try:
            path = write_model_dir(self.root, manifest, files)
        except (OSError, ServeError) as e:
            raise Refusal(f"{name} could not be written to {target}: {e}") from None
        return self._serve(name, model, path, source.compiled, written=True)

    def _again(self, name: str, model: str, target: Path, sha256: str) -> UploadResult:
        """A directory of that name is here: load it if it is this very file as this door wrote it, else refuse."""
        try:
            existing = read_model_dir(target)
        except ServeError:
            existing = None
        same = existing is not None and existing.manifest.build is not None \
            and getattr(existing.manifest.build, "route", None) == ROUTE \
            and any(entry.sha256 == sha256 for entry in existing.manifest.files.values())
        if not same:
            raise Refusal(f"a model directory {model!r} is here already and holds another model: it is not replaced. "
                          f"Rename the file Frigate's model.path names, or remove {model}/ from the model directory")
        return self._serve(name, model, target, existing.has(EDGETPU) and not existing.has(INT8), written=False)

    def _serve(self, name: str, model: str, path: Path, compiled_only: bool, written: bool) -> UploadResult:
        try:
            self.add(path)
        except ServeError as e:
            if written:
                shutil.rmtree(path, ignore_errors=True)  # nothing left behind that the next start would fail on
            if compiled_only:
                raise Refusal(f"{name} is compiled for the Edge TPU only, and no Edge TPU serves here ({e}): not kept. "
                              "Send the plain .tflite it was compiled from (Frigate's /cpu_model.tflite for its "
                              "compiled SSD), or attach an Edge TPU and serve it there") from None
            if "served already" in str(e):
                raise Refusal(f"{e}: name a served model in Frigate's model.path, or rename the file") from None
            raise Refusal(f"{name} could not be loaded here: {e}; not kept") from None
        verb = "saved as" if written else "already here as"
        return UploadResult(saved=True, loaded=True, model=model, message=f"{name} {verb} model {model!r}: serving")


def model_name_for(name: str) -> str:
    """The model directory a file name becomes: its stem, with what a model name cannot hold replaced by '_'."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    if not base.endswith(".tflite"):
        raise Refusal(f"{name!r} is not a .tflite file: the Edge TPU and this service run TFLite models (give "
                      "Frigate's model.path a .tflite detector)")
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", base.removesuffix(".tflite")).lstrip("._-")
    if not stem or stem == MANIFEST:
        raise Refusal(f"{name!r} makes no model name: name the file with letters and digits")
    return stem[:128]
