"""The run's settings: a config file in, a checked ``Config`` out.

``schema`` holds the pydantic schema of every section and ``load_config`` (a YAML file, ``--set``
overrides, relative paths resolved against the file's folder); ``data`` the data section (corpora,
formats, weights, tags, control tokens) and the tokenizer section; ``model`` the model section and the
strict types every section shares; ``yaml12`` the YAML 1.2 reader it rests on (strict scalars, no
aliases, the line of every key); ``describe`` a validation error as one line naming the file, line and
key. Below them, the names a user chooses among (``choices``), what a language code implies
(``languages``) and the pieces the tokenizer keeps for itself (``specials``); ``jsonfile``, the one reader
of the JSON files attnmt reads (a run folder's, an import's, an export's), which refuses a pipe or a device
at once and deep nesting or an oversized number in one error of the caller's kind. Nothing here imports
torch.
"""
