"""``attnmt serve``: a model in, an HTTP server out.

``server`` is the FastAPI application; ``api`` its request bodies, settings and page; ``limits`` what
one request may cost, checked before it is queued; ``batcher`` the dynamic batching and the two lanes;
``decoder_process`` the decoders, each in a process of its own with its time budget. The page's files
are ``attnmt/web/``.
"""
