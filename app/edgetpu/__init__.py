"""What the service knows about libedgetpu, without pycoral and without TensorFlow.

    library.py         the C API through ctypes: list devices, version
    versions.py        the pinned version sets (versions.toml) and the check that a pair matches one
    delegate.py        the `device` and `Performance` delegate options, and which TPU a spec names
    compiled_model.py  what a *_edgetpu.tflite file needs: its minimum Edge TPU runtime version
    access.py          why a device cannot be opened, and the exact fix
    usb.py             the USB Accelerator's two identities on the bus, as sysfs and /dev/bus/usb show them
    temperature.py     a PCIe TPU's temperature, trip points and warning levels (apex driver sysfs)
    environment.py     the start-up check that puts these together
    inventory.py       the TPUs in service, listed again by a probe while serving
    claims.py          which TPUs are this process's where several processes share them (a lock per TPU)

Nothing here imports the TFLite runtime or FastAPI: app/engines/edgetpu.py loads the delegate.
"""
