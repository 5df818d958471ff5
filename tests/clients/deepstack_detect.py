"""Run by tests/test_detect.py in the DeepStack client's own venv (deepstack-python 0.9, module deepstack.core, as
Home Assistant's DeepStack integration uses it): detect with it against the service and print what came back as JSON.

Its own venv: the wheel installs a top-level `tests` package, which would shadow this project's tests in the service's.

usage: deepstack_detect.py HOST PORT IMAGE_PATH API_KEY [CUSTOM_MODEL]
Prints {"predictions": [...], "summary": {...}, "wrong_key": "<the client's error>", "error": "..."}.
"""

import json
import sys

import deepstack.core as ds


def main(host: str, port: int, image: str, api_key: str, custom_model: str = "") -> dict:
    data = open(image, "rb").read()
    client = ds.DeepstackObject(ip=host, port=port, api_key=api_key, timeout=30, custom_model=custom_model)
    out = {}
    try:
        predictions = client.detect(data)  # api_key and min_confidence (its default, 0.45) as form fields
        out["predictions"] = predictions
        out["summary"] = ds.get_objects_summary(predictions)
    except ds.DeepstackException as e:
        out["error"] = str(e)
    wrong = ds.DeepstackObject(ip=host, port=port, api_key=api_key + "-wrong", timeout=30, custom_model=custom_model)
    try:
        wrong.detect(data)
        out["wrong_key"] = None
    except ds.DeepstackException as e:
        out["wrong_key"] = str(e)
    return out


if __name__ == "__main__":
    args = sys.argv[1:]
    print(json.dumps(main(args[0], int(args[1]), args[2], args[3], *args[4:])))
