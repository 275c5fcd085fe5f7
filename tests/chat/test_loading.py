"""Loading a backend for a front end: the CLI's settled heap (gc.freeze after the model is loaded)."""

import subprocess
import sys

RUN = """
import gc
import sys
from radixchat.chat.loading import load_backend, settled_heap
from radixchat.config import Settings

settings = Settings.load({"weights": "float32", "compile": "off", "kv_store": False})
plain = load_backend(settings)
outside = gc.get_freeze_count()
with settled_heap(grammar=False):  # a one-shot plain reply: the grammar engine is not imported
    load_backend(settings)
    grammar_without = "radixchat.grammar" in sys.modules
with settled_heap():
    backend = load_backend(settings)
    inside = gc.get_freeze_count()
    gc.collect()  # a full collection now leaves the frozen heap alone
    still = gc.get_freeze_count()
print(outside, inside, still, gc.get_freeze_count(), int(grammar_without), int("radixchat.grammar" in sys.modules))
"""


def test_the_cli_takes_the_loaded_heap_out_of_the_collector_and_gives_it_back():
    """In a fresh interpreter (freezing is process-wide): a backend loaded outside ``settled_heap`` freezes
    nothing; inside, the loaded heap (the real default model, torch, transformers) is frozen, a full
    collection does not thaw it, and leaving the block gives every object back to the collector."""
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    outside, inside, still, after, grammar_without, grammar_with = map(int, out.stdout.split())
    assert (grammar_without, grammar_with) == (0, 1)  # frozen with the rest where a mode may need it
    assert outside == 0
    assert inside > 100_000 and still == inside
    assert after == 0
