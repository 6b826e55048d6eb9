"""CTranslate2 (an optional extra, ``attnmt[ct2]``): a Transformer checkpoint exported as a CTranslate2
model through CTranslate2's own model-spec API, and ``Ct2Translator``, which decodes with such a folder
behind ``Translator``'s interface.

Letters: D d_model, V vocabulary, L layers.

An exported folder holds what CTranslate2 writes (``model.bin``, ``config.json``, the vocabularies),
the run's sentencepiece models with their ``tokenizer.json`` (as a run folder's ``tokenizer/`` does),
and ``attnmt-export.json``: what was exported (the checkpoint's config, the quantization, the sha256 of
``model.bin``), which is how ``translate`` and ``eval`` recognise the folder and check it is whole.

The weights map one to one; three things are made explicit because CTranslate2's defaults differ: attnmt's
sinusoid interleaves sin and cos (CTranslate2's own puts the halves side by side), so the position table is
written out; LayerNorm's epsilon is torch's 1e-5; the source gets its EOS through ``add_source_eos``. The
search is CTranslate2's: with ``length_penalty`` 0 and outputs that end before the length limit its greedy and
beam outputs are attnmt's token for token (``tests/decoding/test_ctranslate.py``). Where they differ:
CTranslate2 normalises a beam's score by ``length ** alpha``, not GNMT's ``((5 + length) / 6) ** alpha``, and
at the length limit it stops without scoring a forced EOS.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from ..config.jsonfile import read_json
from ..config.schema import Config, config_from_dict
from ..data.batching import token_batches
from ..data.tokenizer import BOS_ID, EOS_ID, META_FILE, PAD_ID, UNK_ID, Tokenizer, load_tokenizer
from ..errors import CheckpointError, ConfigError
from ..models.checkpoint import sha256_file
from ..runfiles import EXPORT_MANIFEST, check_new_folder, publish_folder
from .search import Hypothesis, Sampling, check_search_settings, output_limit
from .translator import Translator

FORMAT = "attnmt-ctranslate2"
VERSION = 1
QUANTIZATIONS = ("float32", "int8_float32", "int8")
# What CTranslate2 writes besides the vocabularies.
CT2_FILES = ("model.bin", "config.json")


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError("CTranslate2 is not installed: pip install 'attnmt[ct2]' "
                          "(or pip install ctranslate2)") from None
    return ctranslate2


def is_export(path: Path) -> bool:
    """A folder that looks like a CTranslate2 model (attnmt's export, or one from another tool), as
    opposed to a run folder."""
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in (EXPORT_MANIFEST, "model.bin"))


# ------------------------------------------------------------------------------------------ export


def _unsupported(cfg) -> str | None:
    """Why a model config cannot run in CTranslate2, or None."""
    if cfg.arch != "transformer":
        return (f"model.arch is {cfg.arch}: CTranslate2 has no LSTM decoder, so only Transformer "
                "checkpoints export")
    if cfg.heads != "full":
        return "model.heads is split (block-diagonal projections): CTranslate2 has full projections only"
    for key in ("enc_kernel", "dec_kernel"):
        if getattr(cfg, key) in ("linear", "sparse", "linformer", "performer"):
            return (f"model.{key} is {getattr(cfg, key)}: CTranslate2 computes exact softmax attention over "
                    "every position only")
    return None


def _np(tensor: torch.Tensor):
    return tensor.detach().to(torch.float32).cpu().contiguous().numpy()


def _linear(spec, *layers: torch.nn.Linear) -> None:
    """One CTranslate2 linear from one or more (fused along the outputs) torch linears."""
    spec.weight = _np(torch.cat([layer.weight for layer in layers]))
    if layers[0].bias is not None:
        spec.bias = _np(torch.cat([layer.bias for layer in layers]))


def _norm(spec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _ffn(spec, ffn) -> None:
    _linear(spec.linear_0, ffn[0])
    _linear(spec.linear_1, ffn[3])


def build_spec(model, cfg: Config, tokenizer: Tokenizer):
    """The CTranslate2 ``TransformerSpec`` of a ``TransformerModel`` with its weights and vocabularies."""
    _ctranslate2()  # a clear error without the extra
    from ctranslate2.specs import common_spec, transformer_spec

    m = cfg.model
    spec = transformer_spec.TransformerSpec.from_config(
        (m.enc_layers, m.dec_layers), m.n_heads, pre_norm=m.norm == "pre",
        activation=getattr(common_spec.Activation, {"silu": "SWISH"}.get(m.activation, m.activation.upper())))
    # Positions the folder must cover: the longest source (max_src_len pieces + EOS) and the longest output.
    d = cfg.decode
    rows = max(m.max_positions, d.max_src_len + 1, math.floor(d.max_len_a * d.max_src_len + d.max_len_b) + 2)
    if m.positions == "learned":
        table = model.positions.table.weight  # (max_positions, D): a learned model never goes past it
    else:
        table = model.positions(0, rows, torch.device("cpu"))  # (rows, D)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = _np(model.src_embed.weight)
    dec.embeddings.weight = _np(model.tgt_embed.weight)
    enc.position_encodings.encodings = _np(table)
    dec.position_encodings.encodings = _np(table)
    for layer_spec, layer in zip(enc.layer, model.encoder):
        attn = layer.self_attn
        _norm(layer_spec.self_attention.layer_norm, layer.sub_attn.norm)
        _linear(layer_spec.self_attention.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
        _linear(layer_spec.self_attention.linear[1], attn.out_proj)
        _norm(layer_spec.ffn.layer_norm, layer.sub_ffn.norm)
        _ffn(layer_spec.ffn, layer.ffn)
    for layer_spec, layer in zip(dec.layer, model.decoder):
        attn, cross = layer.self_attn, layer.cross_attn
        _norm(layer_spec.self_attention.layer_norm, layer.sub_self.norm)
        _linear(layer_spec.self_attention.linear[0], attn.q_proj, attn.k_proj, attn.v_proj)
        _linear(layer_spec.self_attention.linear[1], attn.out_proj)
        _norm(layer_spec.attention.layer_norm, layer.sub_cross.norm)
        _linear(layer_spec.attention.linear[0], cross.q_proj)
        _linear(layer_spec.attention.linear[1], cross.k_proj, cross.v_proj)
        _linear(layer_spec.attention.linear[2], cross.out_proj)
        _norm(layer_spec.ffn.layer_norm, layer.sub_ffn.norm)
        _ffn(layer_spec.ffn, layer.ffn)
    if m.norm == "pre":
        _norm(enc.layer_norm, model.enc_norm)
        _norm(dec.layer_norm, model.dec_norm)
    dec.projection.weight = _np(model.output.weight)
    if model.output.bias is not None:
        dec.projection.bias = _np(model.output.bias)
    enc.scale_embeddings = dec.scale_embeddings = m.scale_embeddings
    spec.register_source_vocabulary(tokenizer.src_pieces(list(range(tokenizer.src_vocab_size))))
    spec.register_target_vocabulary(tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size))))
    spec.config.add_source_eos = True
    # An imported model's pieces for attnmt's specials (its decoder starts from its own pad, in bos's place).
    bos, eos, unk = tokenizer.tgt_pieces([BOS_ID, EOS_ID, UNK_ID])
    spec.config.bos_token = spec.config.decoder_start_token = bos
    spec.config.eos_token, spec.config.unk_token = eos, unk
    spec.config.layer_norm_epsilon = 1e-5
    return spec


def export_ctranslate2(model_path: Path, out: Path, quantization: str = "float32") -> dict:
    """Write MODEL (a checkpoint or run folder) as a CTranslate2 model folder ``out``; returns the
    manifest. ``out`` must not exist or be an empty folder: the export is written beside it and moved
    into place whole, so nothing there is lost and no half-written folder is left."""
    from ..models.checkpoint import load_model

    if quantization not in QUANTIZATIONS:
        raise ConfigError(f"--quantization {quantization}: expected one of {', '.join(QUANTIZATIONS)}")
    out = Path(out)
    check_new_folder(out)  # before the model is read
    model, tokenizer, cfg, checkpoint = load_model(model_path, "cpu")
    why = _unsupported(cfg.model)
    if why is not None:
        raise ConfigError(f"{checkpoint}: cannot export to CTranslate2: {why}")
    with torch.no_grad():
        spec = build_spec(model, cfg, tokenizer)
    manifest = {"format": FORMAT, "version": VERSION, "quantization": quantization,
                "checkpoint": str(checkpoint)}

    def fill(tmp: Path) -> None:
        spec.validate()
        spec.optimize(quantization=quantization)
        spec.save(str(tmp))
        for name, data in tokenizer.files().items():
            (tmp / name).write_bytes(data)
        (tmp / META_FILE).write_text(json.dumps(tokenizer.meta(), indent=2), encoding="utf-8")
        manifest.update(model_sha256=sha256_file(tmp / "model.bin"), tokenizer=tokenizer.fingerprint(),
                        config=cfg.to_dict())
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                           encoding="utf-8")

    publish_folder(out, fill)
    return manifest


# ---------------------------------------------------------------------------------------- reading


def read_export(folder: Path) -> tuple[dict, Config, Tokenizer]:
    """An exported folder's manifest, config and tokenizer, checked: the manifest is attnmt's, every file
    is there, ``model.bin`` is the one exported and the tokenizer is the checkpoint's (CheckpointError
    naming the folder and what is wrong)."""
    folder = Path(folder)
    manifest_path = folder / EXPORT_MANIFEST
    if not manifest_path.exists():
        if (folder / "model.bin").exists():
            raise CheckpointError(f"{folder}: a CTranslate2 model that attnmt did not export (no "
                                  f"{EXPORT_MANIFEST}); attnmt reads the folders `attnmt export` writes")
        raise CheckpointError(f"{folder}: not an attnmt export (no {EXPORT_MANIFEST})")
    manifest = read_json(manifest_path, CheckpointError)
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"{manifest_path}: format is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{manifest_path}: version {manifest.get('version')!r} is not one this attnmt "
                              f"reads ({VERSION}); export again")
    vocabularies = (["shared_vocabulary.json"]
                    if (folder / "shared_vocabulary.json").exists()
                    else ["source_vocabulary.json", "target_vocabulary.json"])
    for name in (*CT2_FILES, *vocabularies, META_FILE):
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder}: incomplete export: {name} is missing")
    if sha256_file(folder / "model.bin") != manifest.get("model_sha256"):
        raise CheckpointError(f"{folder}/model.bin: not the file that was exported (sha256 differs); "
                              "export again")
    try:
        cfg = config_from_dict(manifest.get("config"), source=f"{manifest_path} (its config)")
    except ConfigError as e:
        raise CheckpointError(f"{manifest_path}: its config is not valid for this attnmt: {e}") from None
    fingerprint = manifest.get("tokenizer")
    tokenizer = load_tokenizer(folder, fingerprint if isinstance(fingerprint, dict) else {})
    return manifest, cfg, tokenizer


def ct2_device(device: torch.device) -> str:
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device.type}: CTranslate2 runs on cpu or cuda")
    return device.type


class Ct2Translator(Translator):
    """``Translator`` over an exported folder (``export``: what ``read_export`` returned for it, if read
    already): the same cleaning, encoding, cutting, batching and output as with the checkpoint,
    CTranslate2's search. With ``decode.nbest`` above 1 (when ``translate`` prints scores) each
    hypothesis's score is its log-probability under teacher forcing, EOS included (``score_batch``):
    attnmt's own, to the last digits. With one output per line its score is NaN: nothing prints it, and
    asking CTranslate2 for its search scores costs about 4% of a greedy pass."""

    def __init__(self, folder: Path, decode, device: torch.device | str = "cpu",
                 sampling: Sampling | None = None, threads: int | None = None,
                 export: tuple[dict, Config, Tokenizer] | None = None) -> None:
        manifest, cfg, tokenizer = export if export is not None else read_export(folder)
        check_search_settings(max(decode.beam_size, decode.nbest) if sampling else decode.beam_size,
                              decode.nbest, decode.length_penalty, decode.min_len)
        ct2 = _ctranslate2()
        self.folder, self.manifest, self.cfg = Path(folder), manifest, cfg
        self.tokenizer, self.decode, self.sampling = tokenizer, decode, sampling
        self.device, self.model = torch.device(device), None
        threads = threads if threads is not None else torch.get_num_threads()
        try:
            self.engine = ct2.Translator(str(folder), device=ct2_device(self.device), compute_type="default",
                                         inter_threads=1, intra_threads=threads)
        except (RuntimeError, ValueError) as e:
            raise CheckpointError(f"{folder}: CTranslate2 cannot load it: {str(e).splitlines()[0]}") from None
        if sampling is not None:
            ct2.set_random_seed(sampling.seed)
        self._src_vocab = tokenizer.src_pieces(list(range(tokenizer.src_vocab_size)))
        self._tgt_index = {piece: i for i, piece in
                           enumerate(tokenizer.tgt_pieces(list(range(tokenizer.tgt_vocab_size))))}

    def with_settings(self, decode, sampling: Sampling | None = None) -> Ct2Translator:
        """``Translator.with_settings``, the same engine. CTranslate2's random seed is process-wide: it is
        set here, so call this right before translating with the copy."""
        other = super().with_settings(decode, sampling)
        if sampling is not None:
            _ctranslate2().set_random_seed(sampling.seed)
        return other

    def _options(self, beam: int, limit: int, suppress: bool) -> dict:
        d = self.decode
        options = dict(beam_size=beam, num_hypotheses=1 if self.sampling else d.nbest,
                       length_penalty=d.length_penalty, max_decoding_length=limit,
                       min_decoding_length=min(d.min_len, limit), max_input_length=0, max_batch_size=0)
        if suppress:
            options["suppress_sequences"] = [["<pad>"], ["<s>"]]
        if self.sampling is not None:
            s = self.sampling
            options.update(sampling_topk=s.top_k, sampling_topp=s.top_p, sampling_temperature=s.temperature)
        return options

    def _run(self, pieces: list[list[str]], limit: int, suppress: bool = False,
             prefix: list[list[str]] | None = None) -> list[list[Hypothesis]]:
        beam = 1 if self.sampling else self.decode.beam_size
        results = self.engine.translate_batch(pieces, target_prefix=prefix,
                                              **self._options(beam, limit, suppress))
        # No scores asked for (they cost about 4% of a greedy int8 pass): n-best lists are scored again
        # under teacher forcing (``_rescore``) and a single output's score is printed nowhere.
        index = self._tgt_index
        return [[Hypothesis([index[t] for t in tokens], math.nan) for tokens in result.hypotheses]
                for result in results]

    def search(self, src_ids: Sequence[Sequence[int]], need_attention: bool = False,
               prefixes: Sequence[Sequence[int]] | None = None,
               constraints: Sequence[Sequence[Sequence[int]]] | None = None) -> list[list[Hypothesis]]:
        """Hypotheses for encoded sources, batched as ``Translator.search`` batches (sorted by length, one
        token budget); ``prefixes`` go to CTranslate2 as ``target_prefix``.

        Two things are put right afterwards, sentence by sentence, by decoding the sentence again:
        CTranslate2 takes one length limit per call, so a batch runs to the largest limit of its
        sentences and an output that went past its own limit is redone with it (greedy outputs would only
        need cutting; beam outputs could differ); and attnmt never outputs PAD or BOS but keeps their
        probability in the normaliser, which CTranslate2 cannot do (``suppress_sequences`` renormalises
        without them), so the search runs on the model's own distribution and only an output that holds
        one of them is redone with them suppressed."""
        if need_attention:
            raise ConfigError("attention maps need the checkpoint: CTranslate2 exports translate only")
        if constraints is not None and any(constraints):
            raise ConfigError(f"{self.folder} is a CTranslate2 export, and CTranslate2 has no lexical "
                              "constraints: translate with the checkpoint (model.pt)")
        d = self.decode
        n = d.nbest if self.sampling else 1
        rows = 1 if self.sampling else d.beam_size
        order = sorted(range(len(src_ids)), key=lambda i: len(src_ids[i]))
        lengths = [len(ids) + 1 for ids in src_ids]  # + EOS
        limits = [output_limit(length - 1, d.max_len_a, d.max_len_b) for length in lengths]
        if prefixes is not None:  # as decode.prefix_limits
            limits = [max(limit, len(prefix)) for limit, prefix in zip(limits, prefixes)]
        pieces = [[self._src_vocab[i] for i in ids] for ids in src_ids]
        forced = [self.tokenizer.tgt_pieces(p) for p in prefixes] if prefixes is not None else None
        results: list[list[Hypothesis]] = [[] for _ in src_ids]

        def decode(group: list[int], limit: int, suppress: bool) -> None:
            # Sentences without a prefix go without ``target_prefix``: in a batch where others have one,
            # CTranslate2's beam search would not let them end at their first step.
            parts = [group] if forced is None else [[i for i in group if forced[i]],
                                                    [i for i in group if not forced[i]]]
            for part in filter(None, parts):
                todo = [i for i in part for _ in range(n)]
                prefix = [forced[i] for i in todo] if forced is not None and forced[part[0]] else None
                found = self._run([pieces[i] for i in todo], limit, suppress, prefix)
                for k, i in enumerate(part):
                    results[i] = [h for hyps in found[k * n:(k + 1) * n] for h in hyps]

        for chunk in token_batches(lengths, order, d.max_tokens, rows_per_example=rows * n):
            decode(chunk, max(limits[i] for i in chunk), False)
        redo: dict[tuple[int, bool], list[int]] = {}
        for i, hyps in enumerate(results):
            banned = any(t in (PAD_ID, BOS_ID) for h in hyps for t in h.tokens)
            if banned or any(len(h.tokens) > limits[i] for h in hyps):
                redo.setdefault((limits[i], banned), []).append(i)
        for (limit, banned), group in redo.items():  # in batches of the same budget
            for chunk in token_batches(lengths, sorted(group, key=lambda i: lengths[i]), d.max_tokens,
                                       rows_per_example=rows * n):
                decode(chunk, limit, banned)
        if d.nbest > 1:
            self._rescore(pieces, results)
        return results

    def _rescore(self, pieces: list[list[str]], results: list[list[Hypothesis]]) -> None:
        """Each hypothesis's score replaced by its log-probability under teacher forcing, EOS included."""
        pairs = [(i, h) for i, hyps in enumerate(results) for h in hyps]
        if not pairs:
            return
        scored = self.engine.score_batch([pieces[i] for i, _ in pairs],
                                         [self.tokenizer.tgt_pieces(h.tokens) for _, h in pairs],
                                         max_batch_size=max(1, self.decode.max_tokens // 64),
                                         max_input_length=0)
        for (_, h), result in zip(pairs, scored):
            h.score = float(sum(result.log_probs))

    def piece_logprobs(self, src_ids: Sequence[Sequence[int]],
                       tgt_ids: Sequence[Sequence[int]]) -> list[list[float]]:
        """As ``Translator.piece_logprobs`` (and so ``score`` and word scores), through CTranslate2's
        ``score_batch``."""
        if not src_ids:
            return []
        src = [[self._src_vocab[i] for i in ids] for ids in src_ids]
        tgt = [self.tokenizer.tgt_pieces(list(ids)) for ids in tgt_ids]
        return [[float(x) for x in result.log_probs]
                for result in self.engine.score_batch(src, tgt, max_input_length=0)]
