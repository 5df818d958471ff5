"""What a .tflite file a user hands over is, checked before anything is written: the service's uploads (Frigate's
ZMQ model transfer, app/frontdoors/uploads.py) and `python -m converter import` read a file through the same
checks, so a file the service takes is one `converter import` takes, and the refusal says the same.

    data --read_tflite_source--> TfliteSource (TFL3, parses, a subgraph, its metadata) --graph_facts--> GraphFacts
         (one image input [1, H, W, 1|3] of uint8, int8 or float32, static; 8-bit weighted layers, float parts
          around them allowed (tasks.py); the task it answers: a classifier of one output, a detector (detectors.py:
          TFLite_Detection_PostProcess, YOLO heads), a segmenter or MoveNet SinglePose (tasks.py))

`graph.py` reads the file and the graph, `handed.py` makes a model directory's contents of a file a client hands
over, `detectors.py` the detector families (and their makers), `tasks.py` the float parts,
segmentation and pose, `metadata.py` the TFLite metadata packed in the file (labels, normalization),
`preprocessing.py` how the model's input is fed: whose convention, and its normalization from the model's own facts.

Here because `app/` imports nothing from `converter/` (docs/architecture.md): the converter builds its import on
these (converter/importer.py adds the labels, the metadata, the pair check and the model directory's records).
"""

from app.importing.handed import handed_over
from app.importing.graph import (
    EDGE_OPS,
    GraphFacts,
    ImportRefused,
    TfliteSource,
    graph_facts,
    producer,
    read_tflite_source,
)
from app.importing.preprocessing import identity_normalization

__all__ = ["EDGE_OPS", "GraphFacts", "handed_over", "ImportRefused", "TfliteSource", "graph_facts",
           "identity_normalization", "producer", "read_tflite_source"]
