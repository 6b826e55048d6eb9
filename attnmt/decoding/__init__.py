"""A trained model in, text out: search, translation and scores; a training corpus in, a distilled one out.

``search`` holds greedy and beam search over the model protocol (and sampling, and prefixes forced step
by step); ``constrained`` the beam search whose outputs hold given phrases; ``translator`` the
``Translator`` that takes text in and gives text out under a model's decode settings; ``ctranslate`` the
export to CTranslate2 and decoding through it; ``distill`` a teacher's translations of a student config's
training sources, streamed into its run folder and resumable, and the student's config that trains on them
(sequence-level knowledge distillation); ``fastpath`` the opt-in CPU prepacking; ``quantize`` the int8
linear layers of ``--int8`` (a model in, the same model quantized in place); ``metrics`` sacrebleu's BLEU,
chrF and TER.
"""
