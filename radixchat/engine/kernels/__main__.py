"""``python -m radixchat.engine.kernels``: build this machine's native kernels ahead (scripts/setup.sh)."""

from radixchat.engine.kernels import load_paged_attention

why = load_paged_attention()
print("radixchat: paged attention kernel " + ("ready" if why is None else f"unavailable ({why})"))
