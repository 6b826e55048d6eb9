"""Text in, token batches out: the corpora read and cleaned, the tokenizer, and the encoded splits a run
trains on.

``readers`` reads parallel text (file pairs, TSV, JSONL, Hugging Face, the toy task of ``toy``) and holds
the cleaning rule; ``tokenizer`` trains and loads sentencepiece (with ``bpe_dropout`` and
``subword_sampling`` for segmentations drawn anew each epoch); ``prepare`` turns a config's corpora into a
run folder's ``data/`` through ``spool`` (a split streamed a chunk at a time over the ``pool`` of worker
processes) and ``encoded`` (flat token arrays, memory-mapped back); ``batching`` cuts token-budget
batches from them. ``words`` says what a word is and which pieces make it up; ``arrival`` hands over
lines of a stream as they arrive; ``markup`` takes a line's inline tags out and puts them back on the
words of its translation.
"""
