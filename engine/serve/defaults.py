"""The server's defaults and limits, apart so the command line can name them without loading the server."""

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
DEFAULT_MAX_TOKENS = 512  # a request that sets none, as mlx-lm's server (capped by the context)
DEFAULT_QUEUE = 8  # requests waiting for the engine; past them, 429
PREFIX_CAPACITY = 4  # prompts whose caches are kept for the next turn of their conversation
MAX_BODY_BYTES = 4 * 1024 * 1024
