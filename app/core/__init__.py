"""The core of a request, as a library: admission, the input (image bytes or a raw tensor), the ticket on a model
version (its place in line), and the task reading the outputs; out comes the task's answer (app/tasks/base.py
`Answer`).

It holds no HTTP object: front doors (the native REST routes, OIP v2, DeepStack, DOODS, Frigate's ZMQ protocol)
parse their wire format, call `Core`, and shape its answer. `core.py` is the entry (`Core`: `hold` gives the
registry's ticket, `answer` and `tensors` run inputs through it; the models as doors see them, and the changes doors
make), `catalog.py` the one description of a model every door shows, `inputs.py` what enters it, `runs.py` one input's
run and its timings, `images.py` the image work (decode and preprocess, on threads of its own).
"""

from app.core.catalog import ModelDescription
from app.core.core import Core, Tensors
from app.core.images import ImageWork, image_threads
from app.core.inputs import Given, ImageInput, TensorInput
from app.registry import Target, Ticket

__all__ = ["Core", "Given", "ImageInput", "ImageWork", "ModelDescription", "Target", "Tensors", "TensorInput",
           "Ticket", "image_threads"]
