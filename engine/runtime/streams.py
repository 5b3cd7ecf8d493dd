"""The MLX stream every engine entry point runs on.

MLX 0.32 refuses to evaluate arrays in a new thread on another thread's stream
("There is no Stream(cpu, 0) in current thread"); a thread-local stream gives
each thread (e.g. the app's worker) its own.
"""

import mlx.core as mx

STREAM = mx.new_thread_local_stream(mx.default_device())


def device_kind() -> str:
    """'gpu' or 'cpu': the device the engine's stream runs on, as people name it (not 'Device(cpu, 0)')."""
    return "gpu" if STREAM.device.type == mx.DeviceType.gpu else "cpu"
