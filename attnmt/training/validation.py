"""Validation during training: dev loss and perplexity, dev translations scored with sacrebleu, with gold
alignments of the dev pairs (the toy task) the dev AER, and the heatmaps of the first dev sentences
(``train.plot_every``).

Validation batches follow ``decode.max_tokens``; translations follow the ``decode`` section with
``train.valid_beam_size`` as the beam (1 = greedy), through the same ``Translator`` as ``attnmt
translate``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from ..config.languages import is_cjk_language
from ..config.schema import Config
from ..data.batching import EncodedSplit, TokenBatchSampler, gather
from ..data.tokenizer import PAD_ID, Tokenizer
from ..decoding.metrics import corpus_scores
from ..decoding.translator import Translator
from ..models.loss import label_smoothed_nll
from .allocator import release_freed_memory
from .runlog import ValidRecord

log = logging.getLogger(__name__)


class Validator:
    """Scores a model on the dev split; ``autocast_dtype`` as in training (None: full precision)."""

    PLOT_SENTENCES = 3

    def __init__(self, cfg: Config, tokenizer: Tokenizer, dev: EncodedSplit, device: torch.device,
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.cfg, self.tokenizer, self.dev, self.device, self.autocast_dtype = (
            cfg, tokenizer, dev, device, autocast_dtype)
        self.decode = cfg.decode.model_copy(update={"beam_size": cfg.train.valid_beam_size, "nbest": 1})

    def translator(self, model: torch.nn.Module) -> Translator:
        return Translator(model, self.tokenizer, self.decode, self.device)

    @torch.no_grad()
    def validate(self, model: torch.nn.Module, step: int) -> ValidRecord:
        """Dev loss (label-smoothed, per token), perplexity, BLEU and chrF of the dev translations."""
        was_training = model.training
        model.eval()
        try:
            loss_sum = nll_sum = tokens = 0.0
            for indices in TokenBatchSampler(self.dev.lengths, self.cfg.decode.max_tokens,
                                             shuffle=False).batches(0):
                batch = gather(self.dev, indices).to(self.device)
                with torch.autocast(self.device.type, dtype=self.autocast_dtype,
                                    enabled=self.autocast_dtype is not None):
                    out = model(batch)
                loss = label_smoothed_nll(out.logits, batch.tgt_out, PAD_ID, self.cfg.train.label_smoothing)
                loss_sum, nll_sum, tokens = (loss_sum + float(loss.loss), nll_sum + float(loss.nll),
                                             tokens + loss.n_tokens)
            translator = self.translator(model)
            search = translator.search
            texts = self.tokenizer.decode_tgt([hyps[0].tokens for hyps in search(self.dev.src_ids)])
            scores = corpus_scores(texts, [self.dev.tgt_text], ("bleu", "chrf"),
                                   tgt_lang=self.cfg.data.tgt_lang)
            aer = self.aer(translator)
        finally:
            model.train(was_training)
            release_freed_memory()
        return ValidRecord(
            step=step,
            loss=loss_sum / max(tokens, 1),
            ppl=math.exp(min(nll_sum / max(tokens, 1), 50)),
            bleu=scores["bleu"].score,
            chrf=scores["chrf"].score,
            bleu_signature=scores["bleu"].signature,
            chrf_signature=scores["chrf"].signature,
            example=texts[0] if texts else "",
            aer=aer,
        )

    def aer(self, translator: Translator) -> float | None:
        """With gold alignments of the dev pairs (the toy task): the AER of ``attnmt align``'s default reading
        of the model on them. None without gold, and for a CJK target (the toy's Chinese gold counts
        segmented words; the model reads unsegmented text)."""
        if self.dev.gold is None or self.dev.src_text is None or is_cjk_language(self.cfg.data.tgt_lang):
            return None
        try:
            from ..insight.reading import default_align_options, dev_aer

            return dev_aer(translator, self.dev.src_text, self.dev.tgt_text, self.dev.gold,
                           default_align_options(self.cfg))
        except Exception as e:  # a side show, as the heatmaps are: training goes on
            log.warning("could not score the dev alignments: %s: %s", type(e).__name__, e)
            return None

    def plot(self, model: torch.nn.Module, step: int, out_dir: Path) -> None:
        """Heatmaps of the cross-attention on the first dev sentences and their translations, into
        ``out_dir``. Looking inside is a side show: a failure is logged, never raised."""
        was_training = model.training
        try:
            # Here, not at the top: matplotlib loads only for a run that draws, and a failure to load it is
            # a failure to plot, which must not stop training.
            from ..insight.attention_maps import HeatmapOptions, draw_encoded

            model.eval()
            src_ids = self.dev.src_ids[: self.PLOT_SENTENCES]
            options = HeatmapOptions(kinds=("cross",), title=f"step {step}: ")
            draw_encoded(self.translator(model), src_ids, range(1, len(src_ids) + 1), out_dir, options)
        except Exception as e:  # any failure: training goes on
            log.warning("step %d: could not plot the dev attention: %s: %s", step, type(e).__name__, e)
        finally:
            model.train(was_training)
