"""`dflash-playground serve`: the loaded pair behind OpenAI- and Anthropic-compatible HTTP endpoints.

requests.py (the request models: every field checked there), prompting.py (a request to prompt ids
and settings), engine_queue.py (the one decode thread and its bounded queue), stream.py (one run's
events on the event loop), openai_shapes.py and anthropic_shapes.py (the wire formats), metrics.py
(Prometheus), app.py (the FastAPI routes, errors, limits and key), cli.py (the command).
"""
