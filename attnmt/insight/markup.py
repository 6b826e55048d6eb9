"""Tags carried through a translation on a model's own word links (``translate --markup``, the server's
``"markup": true``): each translation is aligned with its source text as ``attnmt align`` aligns a pair
(``reading.align_corpus``), the links grown into words both sides left unlinked (``grow_unlinked``), and
``data.markup.place_tags`` puts the source's tags back around the linked target words. LSTM or
Transformer alike: the links come from whatever attention the model has."""

from __future__ import annotations

from collections.abc import Sequence

from ..data.markup import MarkedText, place_tags
from ..data.words import segment
from ..decoding.translator import Translator
from .links import AlignOptions, Link
from .reading import align_corpus

# Moses's corners of a link (the last four of ``links._NEIGHBOURS``): a side shares one of its words.
_CORNERS = ((-1, -1), (-1, 1), (1, -1), (1, 1))


def carry_markup(translator: Translator, marked: Sequence[MarkedText], translations: Sequence[str],
                 options: AlignOptions | None = None) -> list[str]:
    """Each translation (of ``marked[k].text``) as markup, with ``marked[k]``'s tags put back. ``options``:
    how links are read off the model; the commands pass its default reading
    (``reading.default_align_options(cfg, checkpoint)``, as ``align`` reads it); None: every layer and head
    averaged, the mutual argmax. Sources without tags are only escaped: they cost no alignment pass."""
    if len(marked) != len(translations):
        raise ValueError(f"{len(marked)} marked sources but {len(translations)} translations")
    tagged = [k for k, source in enumerate(marked) if source.tags]
    links: list[list[Link]] = [[] for _ in marked]
    if tagged:
        sources, targets = [marked[k].text for k in tagged], [translations[k] for k in tagged]
        aligned = align_corpus(translator, sources, targets, options or AlignOptions())
        for k, source, target, pair_links in zip(tagged, sources, targets, aligned.links):
            links[k] = grow_unlinked(pair_links, len(segment(source)), len(segment(target)))
    return [place_tags(source, text, pair_links)
            for source, text, pair_links in zip(marked, translations, links)]


def grow_unlinked(links: Sequence[Link], n_src: int, n_tgt: int) -> list[Link]:
    """``links`` (between ``n_src`` source and ``n_tgt`` target words) and, until nothing changes, each
    pair of a source and a target word, both unlinked, at a corner of a link (the word before or after it
    on both sides): ``grow-diag``'s step (``links.symmetrize``, Koehn et al. 2005) into unlinked words
    only. The mutual argmax leaves unlinked on both sides what two words say together ("7:05 pm" ->
    "19:05 uhr": pm and uhr); grown, a tag around "7:05 pm" goes around "19:05 uhr". Sorted."""
    found = set(links)
    src_linked, tgt_linked = {i for i, _ in found}, {j for _, j in found}
    grew = True
    while grew:
        grew = False
        for i, j in sorted(found):
            for di, dj in _CORNERS:
                s, t = i + di, j + dj
                if 0 <= s < n_src and 0 <= t < n_tgt and s not in src_linked and t not in tgt_linked:
                    found.add((s, t))
                    src_linked.add(s)
                    tgt_linked.add(t)
                    grew = True
    return sorted(found)
