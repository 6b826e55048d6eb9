"""A config and a run folder in, checkpoints and metrics out: the training loop and what it rests on.

``trainer`` holds ``Trainer`` and ``fit`` (the loop, resume, signals); ``runstart`` what a run settles
before it (preflight, the data, the sampler, fine-tuning's weights); ``step`` one optimizer step over its
micro-batches with ``optim``'s AdamW and schedule; ``validation`` the dev set's loss, BLEU, AER and
heatmaps; ``keeper`` and ``averaging`` which checkpoints stay and their average; ``runlog`` the events
written to ``metrics.jsonl``; ``guided`` the alignment links of guided training; ``distributed`` and
``launch`` the devices and torchrun; ``faults`` what tests inject; ``allocator`` freed memory kept for
the next step.
"""
