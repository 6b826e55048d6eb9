"""How the command line shows its results: corpus statistics, a training run (a progress bar on a
terminal), scores (rich tables)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..training.runlog import Event, Finished, Message, NonfiniteRecord, Started, TrainRecord, ValidRecord


def print_corpus_statistics(report) -> None:
    """The table ``attnmt prepare`` prints: pairs read, kept and dropped, pieces, lengths, unknown rates."""
    table = Table(title=f"corpus statistics ({report.run_dir})", title_justify="left")
    table.add_column("")
    for s in report.splits:
        table.add_column(s.name, justify="right")
    reasons = list(dict.fromkeys(why for s in report.splits for why in s.dropped))
    rows = [("pairs read", [f"{s.read:,}" for s in report.splits]),
            ("pairs kept", [f"{s.kept:,}" for s in report.splits])]
    rows += [(f"dropped: {why}", [f"{s.dropped.get(why, 0):,}" for s in report.splits]) for why in reasons]
    for side in ("src", "tgt"):
        rows.append((f"{side} pieces", [f"{getattr(s, side + '_tokens'):,}" for s in report.splits]))
        rows.append((f"{side} length p50/p90/p99/max",
                     ["/".join(map(str, getattr(s, side + "_percentiles").values())) for s in report.splits]))
        rows.append((f"{side} unknown-piece rate",
                     [f"{getattr(s, side + '_unk_rate'):.3%}" for s in report.splits]))
    for label, values in rows:
        table.add_row(label, *values)
    console = Console()
    console.print(table)
    kind = "joint" if report.joint else "separate"
    sizes = (f"{report.src_vocab_size}" if report.joint
             else f"{report.src_vocab_size} / {report.tgt_vocab_size}")
    console.print(f"tokenizer: {kind}, {sizes} pieces, {escape(str(report.tokenizer))}", soft_wrap=True)


def print_scores(scores: dict) -> None:
    """``attnmt eval``'s table: each metric's score and its sacrebleu signature."""
    table = Table("metric", "score", "signature")
    for s in scores.values():
        table.add_row(s.label, f"{s.score:.2f}", s.signature)
    Console().print(table)


def print_alignment_score(score, title: str) -> None:
    """``attnmt align --gold``'s table: AER, precision, recall and the link counts."""
    table = Table("AER", "precision", "recall", "links", "sure", "possible", "sentences", title=title,
                  title_justify="left")
    table.add_row(f"{score.aer:.2%}", f"{score.precision:.2%}", f"{score.recall:.2%}", str(score.predicted),
                  str(score.sure), str(score.possible), str(score.sentences))
    Console().print(table)


class TrainReporter:
    """Shows training events: a rich progress bar on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.console = Console(stderr=False)
        self.live = enabled and self.console.is_terminal
        self.progress = None
        self.task = None

    def __enter__(self) -> TrainReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def __call__(self, event: Event) -> None:
        if not self.enabled:
            return
        if isinstance(event, Started):
            self._start(event)
        elif isinstance(event, TrainRecord):
            loss = f"  loss {event.loss:.3f}" if event.loss is not None else ""
            status = (f"epoch {event.epoch:.2f}{loss}  lr {event.lr:.2e}  "
                      f"{event.tokens_per_s:,.0f} tok/s"
                      + (f"  align {event.align_loss:.3f}" if event.align_loss is not None else ""))
            if self.progress is not None:
                self.progress.update(self.task, completed=event.step, status=status)
            else:
                self.console.print(f"step {event.step}  {status}", highlight=False)
        elif isinstance(event, ValidRecord):
            title = (f"validation at step {event.step}" if event.averaged is None else
                     f"validation of the average of steps {', '.join(map(str, event.averaged))}")
            table = Table(title=title, title_justify="left")
            columns = ["loss", "ppl", "BLEU", "chrF"] + (["AER"] if event.aer is not None else [])
            for column in columns:
                table.add_column(column, justify="right")
            values = [f"{event.loss:.3f}", f"{event.ppl:.2f}", f"{event.bleu:.2f}", f"{event.chrf:.2f}"]
            table.add_row(*values, *([f"{100 * event.aer:.2f}%"] if event.aer is not None else []))
            self.console.print(table)
            self.console.print(f"  {event.bleu_signature}", highlight=False, markup=False)
            self.console.print(f"  e.g. {event.example}", highlight=False, markup=False)
        elif isinstance(event, NonfiniteRecord):
            self.console.print(f"[yellow]step {event.step}: non-finite loss or gradient, step skipped "
                               f"({event.skips} so far)[/yellow]")
        elif isinstance(event, Message):
            self.console.print(event.text, highlight=False, markup=False)
        elif isinstance(event, Finished):
            if self.progress is not None:
                self.progress.update(self.task, completed=event.step)
            best = (f"; best {event.best_score:.2f} at step {event.best_step}"
                    if event.best_score is not None else "")
            self.console.print(f"finished at step {event.step} ({event.reason.value}){best}")

    def _start(self, event: Started) -> None:
        self.console.print(
            f"training on {event.device} x {event.world_size} in {event.precision}: {event.parameters:,} "
            "parameters, "
            f"{event.steps_per_epoch:,} steps per epoch, {event.total:,} steps planned"
        )
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                                     console=self.console)
            self.task = self.progress.add_task("train", total=event.total, completed=event.step, status="")
            self.progress.start()
