"""sentencepiece tokenizers: training, the fixed special ids, round trips, and the hashed tokenizer folder."""

from __future__ import annotations

import hashlib
import io
import json

import pytest

from attnmt.config.schema import TokenizerConfig, config_from_dict
from attnmt.data.prepare import obtain_tokenizer
from attnmt.data.readers import ParallelText
from attnmt.data.spool import Spooled
from attnmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_PIECES,
    UNK_ID,
    Tokenizer,
    load_external,
    load_tokenizer,
    train_model,
    train_tokenizer,
)
from attnmt.data.toy import toy_pairs
from attnmt.errors import CheckpointError, DataError
from attnmt.runfiles import RunDir

MIXED_SRC = ["東京は日本の首都です", "我爱你 😀 🎉", "Привет мир, как дела?", "naïve café straße"]
MIXED_TGT = ["Tokio ist die Hauptstadt Japans", "ich liebe dich 😀 🎉", "hallo welt, wie geht's?",
             "naive cafe strasse"]


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], list[str]]:
    pairs = toy_pairs("train", 300)
    return [p[0] for p in pairs] + MIXED_SRC * 3, [p[1] for p in pairs] + MIXED_TGT * 3


@pytest.fixture(scope="module", params=[("bpe", True), ("bpe", False), ("unigram", True), ("unigram", False)],
                ids=lambda p: f"{p[0]}-{'joint' if p[1] else 'separate'}")
def tokenizer(request, corpus) -> Tokenizer:
    model_type, joint = request.param
    return train_tokenizer(*corpus, TokenizerConfig(model_type=model_type, joint=joint, vocab_size=80))


def test_vocab_size_and_kind(tokenizer):
    assert tokenizer.src_vocab_size == tokenizer.tgt_vocab_size == 80
    assert set(tokenizer.files()) == ({"spm.model"} if tokenizer.joint else {"src.model", "tgt.model"})
    if tokenizer.joint:
        assert tokenizer.src_model == tokenizer.tgt_model
    else:
        assert tokenizer.src_model != tokenizer.tgt_model  # one model per language


def test_special_ids(tokenizer):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert tokenizer.src_pieces([0, 1, 2, 3]) == tokenizer.tgt_pieces([0, 1, 2, 3]) == list(SPECIAL_PIECES)


def test_encode_never_emits_pad_bos_eos_and_maps_unseen_characters_to_unk(tokenizer, corpus):
    src, tgt = corpus
    for ids in tokenizer.encode_src(src[:50] + MIXED_SRC) + tokenizer.encode_tgt(tgt[:50] + MIXED_TGT):
        assert ids and PAD_ID not in ids and BOS_ID not in ids and EOS_ID not in ids and UNK_ID not in ids
    (unseen,) = tokenizer.encode_tgt(["Ω ψ"])
    assert UNK_ID in unseen


def test_round_trip_is_exact(tokenizer, corpus):
    src, tgt = corpus
    assert tokenizer.decode_tgt(tokenizer.encode_tgt(tgt)) == tgt
    if tokenizer.joint:
        assert tokenizer.decode_tgt(tokenizer.encode_src(src)) == src


def test_decode_drops_special_ids(tokenizer):
    (ids,) = tokenizer.encode_tgt(["14. märz 2019"])
    assert tokenizer.decode_tgt([[BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]]) == ["14. märz 2019"]


def test_fingerprint_hashes_the_model_bytes(tokenizer):
    fp = tokenizer.fingerprint()
    assert fp["src_sha256"] == hashlib.sha256(tokenizer.src_model).hexdigest()
    assert fp["tgt_sha256"] == hashlib.sha256(tokenizer.tgt_model).hexdigest()
    assert fp["special_ids"] == [0, 1, 2, 3] and fp["joint"] == tokenizer.joint


def test_training_is_deterministic(corpus):
    cfg = TokenizerConfig(model_type="unigram", vocab_size=80)
    assert train_model(corpus[0], cfg) == train_model(corpus[0], cfg)


def test_sampling_depends_on_the_seed(corpus):
    cfg = TokenizerConfig(model_type="bpe", vocab_size=60, sample_size=40)
    assert train_model(corpus[0], cfg, seed=1) == train_model(corpus[0], cfg, seed=1)
    assert train_model(corpus[0], cfg, seed=1) != train_model(corpus[0], cfg, seed=2)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_vocab_too_large_for_the_corpus(model_type):
    cfg = TokenizerConfig(model_type=model_type, vocab_size=1000)
    with pytest.raises(DataError) as info:
        train_model(["ein kleiner satz", "noch einer", "und ein dritter"] * 3, cfg)
    message = str(info.value)
    assert message.startswith("tokenizer.vocab_size 1000 is too large for this corpus: "
                              "Vocabulary size too high (1000). ")
    assert "Please set it to a value <= " in message
    assert "hard_vocab_limit: false" in message


def test_vocab_smaller_than_the_alphabet(corpus):
    cfg = TokenizerConfig(model_type="unigram", vocab_size=20)
    with pytest.raises(DataError) as info:
        train_model(corpus[0], cfg)
    message = str(info.value)
    assert message.startswith("tokenizer.vocab_size 20 is too small for this corpus: ")
    assert "raise tokenizer.vocab_size, or lower tokenizer.character_coverage" in message
    assert "lower tokenizer.vocab_size" not in message


def test_soft_vocab_limit_trains_a_smaller_vocabulary():
    cfg = TokenizerConfig(model_type="unigram", vocab_size=1000, hard_vocab_limit=False)
    tok = train_tokenizer(["ein kleiner satz", "noch einer"] * 3,
                          ["a small sentence", "another one"] * 3, cfg)
    assert 8 < tok.src_vocab_size < 1000


@pytest.mark.parametrize("rule, expected", [("nmt_nfkc", "你好吗?我很好,谢谢!"),
                                            ("identity", "你好吗？我很好，谢谢！")])
def test_normalization_decides_whether_full_width_punctuation_survives(rule, expected):
    chinese = ["你好吗？我很好，谢谢！", "我们喜欢猫。", "你呢？", "好，谢谢！"] * 20
    cfg = TokenizerConfig(vocab_size=60, hard_vocab_limit=False, normalization=rule)
    tok = train_tokenizer(["how are you ?", "we like cats ."] * 40, chinese, cfg)
    assert tok.decode_tgt(tok.encode_tgt([chinese[0]])) == [expected]
    assert tok.normalize_tgt(chinese[0]) == expected  # what the model reads, as the words are counted


# ------------------------------------------------------------------------------ the tokenizer folder


def _toy_config(run_root, **tokenizer):
    return config_from_dict(
        {
            "data": {"train": {"format": "toy", "split": "train", "size": 200}},
            "tokenizer": {"vocab_size": 60, **tokenizer},
            "model": {"arch": "transformer"},
            "train": {"run_dir": str(run_root)},
        }
    )


@pytest.fixture(scope="module", params=[True, False], ids=["joint", "separate"])
def saved(request, tmp_path_factory):
    """A tokenizer written into a run folder by prepare's ``obtain_tokenizer``."""
    run = RunDir(tmp_path_factory.mktemp("tok") / "run")
    cfg = _toy_config(run.root, joint=request.param)
    pairs = toy_pairs("train", 200)
    train = ParallelText("train", [p[0] for p in pairs], [p[1] for p in pairs])
    spool = run.root.parent / "train.tsv"
    spool.write_text("".join(f"{k + 1}\t{s}\t{t}\n" for k, (s, t) in enumerate(zip(train.src, train.tgt))),
                     encoding="utf-8")
    tokenizer, how = obtain_tokenizer(cfg, run, Spooled("train", spool, read=200, kept=200))
    assert how.startswith("trained on ")
    return run, cfg, train, tokenizer


def test_saved_folder_has_models_and_hashes(saved):
    run, cfg, _, tokenizer = saved
    names = {"spm.model"} if cfg.tokenizer.joint else {"src.model", "tgt.model"}
    assert {p.name for p in run.tokenizer.iterdir()} == names | {"tokenizer.json"}
    meta = json.loads((run.tokenizer / "tokenizer.json").read_text())
    assert meta["joint"] == cfg.tokenizer.joint
    assert meta["sha256"] == {n: hashlib.sha256((run.tokenizer / n).read_bytes()).hexdigest() for n in names}
    assert meta["settings"]["vocab_size"] == 60
    assert not [p for p in run.root.iterdir() if p.name.startswith(".tokenizer.tmp")]


def test_load_gives_the_same_tokenizer(saved):
    run, _, train, tokenizer = saved
    loaded = load_tokenizer(run.tokenizer)
    assert loaded.fingerprint() == tokenizer.fingerprint()
    assert loaded.encode_src(train.src[:20]) == tokenizer.encode_src(train.src[:20])
    assert loaded.encode_tgt(train.tgt[:20]) == tokenizer.encode_tgt(train.tgt[:20])


def test_obtain_reuses_the_saved_tokenizer(saved):
    run, cfg, train, tokenizer = saved
    again, how = obtain_tokenizer(cfg, run, None)  # no training corpus needed
    assert how == "loaded" and again.fingerprint() == tokenizer.fingerprint()


def _copy_folder(saved, tmp_path):
    run = saved[0]
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for p in run.tokenizer.iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    return folder, ("spm.model" if saved[1].tokenizer.joint else "tgt.model")


def test_tampered_model_file(saved, tmp_path):
    folder, name = _copy_folder(saved, tmp_path)
    data = bytearray((folder / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / name).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{name}: tokenizer does not match \(sha256 "):
        load_tokenizer(folder)


def test_garbage_model_file_with_matching_hash(saved, tmp_path):
    folder, name = _copy_folder(saved, tmp_path)
    garbage = b"\x00this is not a sentencepiece model\xff" * 10
    (folder / name).write_bytes(garbage)
    meta = json.loads((folder / "tokenizer.json").read_text())
    meta["sha256"][name] = hashlib.sha256(garbage).hexdigest()
    (folder / "tokenizer.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="not a valid sentencepiece model"):
        load_tokenizer(folder)


def test_missing_model_file(saved, tmp_path):
    folder, name = _copy_folder(saved, tmp_path)
    (folder / name).unlink()
    with pytest.raises(CheckpointError, match=rf"{name}: tokenizer model not found"):
        load_tokenizer(folder)


@pytest.mark.parametrize("meta", [None, "not json", '{"joint": true}', '{"joint": true, "sha256": {}}'])
def test_missing_or_broken_metadata(saved, tmp_path, meta):
    folder, _ = _copy_folder(saved, tmp_path)
    if meta is None:
        (folder / "tokenizer.json").unlink()
    else:
        (folder / "tokenizer.json").write_text(meta)
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        load_tokenizer(folder)


def test_external_garbage_model(tmp_path):
    path = tmp_path / "model.spm"
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(CheckpointError, match=r"model\.spm: not a valid sentencepiece model"):
        load_external(path, None)


def test_external_model_with_other_special_ids(tmp_path):
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([p[0] for p in toy_pairs("train", 100)]), model_writer=model, vocab_size=40,
        minloglevel=2
    )
    path = tmp_path / "default_ids.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(CheckpointError, match=r"special ids \(pad, unk, bos, eos\) = \(-1, 0, 1, 2\), "
                                              r"expected \(0, 1, 2, 3\)"):
        load_external(path, None)


def test_external_models_are_used_as_given(saved):
    run, cfg, _, tokenizer = saved
    if cfg.tokenizer.joint:
        external = load_external(run.tokenizer / "spm.model", None)
    else:
        external = load_external(run.tokenizer / "src.model", run.tokenizer / "tgt.model")
    assert external.joint == cfg.tokenizer.joint
    assert external.fingerprint() == tokenizer.fingerprint()
