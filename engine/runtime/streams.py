"""The MLX stream every engine entry point runs on.

MLX 0.32 refuses to evaluate arrays in a new thread on another thread's stream
("There is no Stream(cpu, 0) in current thread"); a thread-local stream gives
each thread (e.g. the app's worker) its own.
"""

import mlx.core as mx

STREAM = mx.new_thread_local_stream(mx.default_device())
