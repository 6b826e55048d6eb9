"""A trained model in, text out: search, translation and scores.

``search`` holds greedy and beam search over the model protocol (and sampling, and prefixes forced step
by step); ``constrained`` the beam search whose outputs hold given phrases; ``translator`` the
``Translator`` that takes text in and gives text out under a model's decode settings; ``ctranslate`` the
export to CTranslate2 and decoding through it; ``fastpath`` the opt-in CPU prepacking; ``quantize``
the int8 linear layers of ``--int8`` (a model in, the same model quantized in place); ``metrics``
sacrebleu's BLEU, chrF and TER.
"""
