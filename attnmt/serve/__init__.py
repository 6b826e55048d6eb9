"""``attnmt serve``: a model in, an HTTP server out.

``server`` is the FastAPI application; ``api`` its request bodies, settings and page; ``limits`` what
one request may cost, checked before it is queued; ``batcher`` the dynamic batching, the two lanes and
the queue's bound (overload refused at the door); ``decoder_process`` the decoders, each in a process of
its own with its budget of CPU time, the bulk one pausing while the interactive one works. The page's files
are ``attnmt/web/``.
"""
