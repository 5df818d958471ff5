"""What a .tflite file a user hands over is, checked before anything is written: the service's uploads (Frigate's
ZMQ model transfer, app/frontdoors/uploads.py) and `python -m converter import` read a file through the same
checks, so a file the service takes is one `converter import` takes, and the refusal says the same.

    data --read_tflite_source--> TfliteSource (TFL3, parses, a subgraph) --graph_facts--> GraphFacts
         (one image input [1, H, W, 1|3] of uint8, int8 or float32, static; full-integer inside; a classifier of one
          output, or a detector ending in TFLite_Detection_PostProcess with its four outputs)

Here because `app/` imports nothing from `converter/` (docs/architecture.md): the converter builds its import on
these (converter/importer.py adds the labels, the metadata, the pair check and the model directory's records).
"""

from app.importing.graph import (
    EDGE_OPS,
    Detector,
    GraphFacts,
    ImportRefused,
    TfliteSource,
    graph_facts,
    identity_normalization,
    producer,
    read_tflite_source,
)

__all__ = ["EDGE_OPS", "Detector", "GraphFacts", "ImportRefused", "TfliteSource", "graph_facts",
           "identity_normalization", "producer", "read_tflite_source"]
