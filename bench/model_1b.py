"""Write the 1B-class GGUF the benches compare on (issue 35): Llama-3.2-1B's shapes, random weights, Q4_0.

    python -m bench.model_1b [--out PATH] [--type Q4_0|Q8_0|...]

Hidden 2048, 16 layers, 32 heads, 8 KV heads, FFN 8192, tied embeddings, and the bundled SmolLM2's tokenizer
and chat template (49,152 tokens) — written with gguf-py's own quantizers, so nothing is downloaded. Its text is
noise; its speed and memory are a real 1B model's. Every tensor but the norms is quantized to ``--type``, the
token embedding (also the LM head) included, as llama.cpp's ``--pure`` quantization writes it.

The default path is ``<cache_dir>/bench/llama-1b-<type>.gguf``; an existing file is kept (it takes ~30 s to write).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROPE_THETA = 500000.0


@dataclass(frozen=True)
class Shape:
    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    ffn: int = 8192


LLAMA_1B = Shape()


def default_path(qtype: str = "Q4_0") -> Path:
    from radixchat.config import default_cache_dir

    return default_cache_dir() / "bench" / f"llama-1b-{qtype.lower()}.gguf"


def _copy_tokenizer(writer, source: Path) -> int:  # noqa: ANN001
    """Copy the tokenizer and chat template fields of ``source`` (a GGUF) into ``writer``; the vocab size."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            if key == "tokenizer.ggml.tokens":
                vocab = len(values)
            writer.add_array(key, values) if sub != gguf.GGUFValueType.INT32 else writer.add_key_value(
                key, values, gguf.GGUFValueType.ARRAY, sub_type=sub
            )
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            writer.add_key_value(key, field.parts[field.data[0]].tolist()[0], kind)
    return vocab


def write(
    path: Path, qtype: str = "Q4_0", seed: int = 0, shape: Shape = LLAMA_1B, head_scale: float = 1.0
) -> Path:
    """Write the GGUF (tests write tiny ones; ``head_scale`` sharpens a random model's logits, so that greedy
    decoding is decisive)."""
    import gguf

    from radixchat.bundled import SMOLLM2
    from radixchat.config import default_cache_dir

    kind = gguf.GGMLQuantizationType[qtype]
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    writer.add_name("radixchat bench 1B (random weights)")
    writer.add_block_count(shape.layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{qtype}"]))
    vocab = _copy_tokenizer(writer, SMOLLM2.gguf(default_cache_dir()))
    writer.add_vocab_size(vocab)

    def matrix(name: str, rows: int, cols: int, scale: float = 1.0) -> None:
        # The scale of a trained model's weights (about 1/sqrt(fan-in)), so activations stay finite.
        w = rng.standard_normal((rows, cols), dtype=np.float32) * (scale / np.sqrt(cols))
        if kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(shape.hidden, dtype=np.float32))

    hidden, head_dim = shape.hidden, shape.hidden // shape.heads
    matrix("token_embd.weight", vocab, hidden, head_scale)
    for i in range(shape.layers):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", shape.heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_k.weight", shape.kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_v.weight", shape.kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, shape.heads * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", shape.ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", shape.ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, shape.ffn)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return path


def ensure(qtype: str = "Q4_0", path: Path | None = None) -> Path:
    path = path or default_path(qtype)
    if not path.is_file():
        print(f"writing {path} (random weights, {qtype}; once) ...", file=sys.stderr, flush=True)
        write(path, qtype)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--type", default="Q4_0")
    args = parser.parse_args(argv)
    print(ensure(args.type, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
