"""Run by tests/test_doods.py in pydoods' own venv (pydoods 1.0.2, as Home Assistant's `doods` integration uses it):
list the detectors, detect with the named detector, and try a wrong key; print what came back as JSON.

usage: doods_detect.py URL IMAGE_PATH API_KEY DETECTOR
Prints {"detectors": ..., "detections": ..., "wrong_key": "<the client's error>"}.
"""

import json
import sys

import requests
from pydoods import PyDOODS


def main(url: str, image: str, api_key: str, detector: str) -> dict:
    doods = PyDOODS(url, api_key, timeout=60)  # its constructor lists the detectors too
    out = {"detectors": doods.get_detectors()}
    data = open(image, "rb").read()
    out["detections"] = doods.detect(data, {"person": 50}, detector_name=detector, id="test")
    out["all"] = doods.detect(data, {"*": 0}, detector_name=detector)
    try:
        PyDOODS(url, api_key + "-wrong", timeout=60)
        out["wrong_key"] = None
    except requests.HTTPError as e:
        out["wrong_key"] = e.response.status_code
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
