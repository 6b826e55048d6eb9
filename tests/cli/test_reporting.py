"""attnmt.cli.reporting: what the commands print through Rich."""

from pathlib import Path

from attnmt.cli.reporting import print_corpus_statistics
from attnmt.data.prepare import PrepareReport, SplitStats


def test_prepare_statistics_print_a_tokenizer_path_with_brackets_as_written(capsys):
    """Rich would read ``[v2]`` in a user's path as markup and drop it."""
    loaded = "loaded /data/[v2]/spm.model"
    report = PrepareReport(Path("run"), [SplitStats("train", 2, 2)], loaded, 8, 8, True)
    print_corpus_statistics(report)
    assert loaded in capsys.readouterr().out
