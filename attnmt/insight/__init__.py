"""A model and sentences in, what the model attends to out: maps, alignments, attributions, heads, pages.

``attention_maps`` reads a model's attention under teacher forcing and draws it (``plot``), aligns with
it (``reading``: word links read off a model; ``links``: Pharaoh links, AER, Moses's symmetrisations;
``link_request``: what ``align`` may be asked) or writes it as an explorer page (``explorer``);
``attribution`` gives gradient attributions; ``heads`` measures every head's pattern (``head_patterns``)
and importance, with its page (``heads_page``); ``curves`` draws a run's training curves. The pages' CSS
and scripts are ``attnmt/web/``.
"""
