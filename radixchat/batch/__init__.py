"""``radixchat --batch FILE``: headless conversations from JSON Lines, results as JSON Lines.

Every conversation runs concurrently through the backend (the engine's continuous batching; turns of one
conversation in order). A record is written and flushed as soon as its turn finishes, so a killed run
keeps everything completed; ``--ordered`` writes records in input order instead. Bad lines yield an error
record naming the line and id; the other lines still run. Exit codes (``radixchat.exit_codes``): 0 all
ok, 1 some conversation failed, 2 usage error, 3 model failed to load (or the remote server cannot be
used), 130 interrupted (143 on SIGTERM). With ``--backend URL`` the conversations run on an
OpenAI-compatible server instead (see docs/remote.md); a conversation the server fails gets an error
record and the others go on. This package never imports Textual.

- ``options``: the run's flags, parsed once;
- ``input``: the JSON Lines format, read and checked;
- ``output``: records, the writer, the progress line, the output targets;
- ``runner``: each line's plan and turns, and its saved session;
- ``process``: the run itself: signals, the backend, exit codes;
- ``oneshot``: ``radixchat -p PROMPT``, a run of one one-turn line whose reply streams to stdout as text;
- ``list_tools``: ``radixchat --list-tools``, every tool tool mode can offer (MCP servers' included).
"""

from radixchat.batch.oneshot import OneShotOptions, run_oneshot
from radixchat.batch.options import BatchOptions
from radixchat.batch.process import run_batch

__all__ = ["BatchOptions", "OneShotOptions", "run_batch", "run_oneshot"]
